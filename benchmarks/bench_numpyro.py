"""Time per NUTS gradient evaluation: gpchol.numpyro vs NumPyro's own MultivariateNormal.

One NUTS leapfrog step costs one ``value_and_grad`` of the potential energy (minus the
log joint density in unconstrained space). This script builds the same GP
hyperparameter model (amplitude, lengthscale and noise with log-normal priors, an
ExpSquared covariance on ``n`` one-dimensional inputs, float64) once with
``gpchol.numpyro.MultivariateNormal`` and once with
``numpyro.distributions.MultivariateNormal``, takes the potential NumPyro's NUTS would use
(``numpyro.infer.util.initialize_model``), and times the jitted ``value_and_grad`` of it:
the median of ``--repeats`` (>= 5) calls after a warm-up call, the two interleaved in the
same run so that their ratio is meaningful on a shared machine (the process CPU-time ratio
is printed too: on an oversubscribed machine it is the steadier of the two).
Target: gpchol >= 2x faster at n = 2000.

Usage::

    python benchmarks/bench_numpyro.py            # n = 500, 1000, 2000
    python benchmarks/bench_numpyro.py --quick    # n = 200, 400 (a smoke run)
    python benchmarks/bench_numpyro.py --sizes 1000 4000 --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import time


def _model_factory(mvn):
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    def model(X, y):
        amp = numpyro.sample("amp", dist.LogNormal(0.0, 1.0))
        ls = numpyro.sample("ls", dist.LogNormal(0.0, 1.0))
        noise = numpyro.sample("noise", dist.LogNormal(-2.0, 1.0))
        d2 = (X[:, None] - X[None, :]) ** 2
        cov = amp * jnp.exp(-0.5 * d2 / ls**2) + (noise + 1e-6) * jnp.eye(X.shape[0])
        numpyro.sample("y", mvn(jnp.zeros(X.shape[0]), cov, validate_args=False), obs=y)

    return model


def _compiled_gradient(mvn, X, y):
    """The jitted ``value_and_grad`` of the NUTS potential, its input, compile seconds."""
    import jax
    from numpyro.infer.util import initialize_model

    info = initialize_model(jax.random.PRNGKey(0), _model_factory(mvn), model_args=(X, y))
    params = info.param_info.z
    f = jax.jit(jax.value_and_grad(info.potential_fn))
    t0 = time.perf_counter()
    jax.block_until_ready(f(params))
    return f, params, time.perf_counter() - t0


def _timed(f, params):
    import jax

    t0, c0 = time.perf_counter(), time.process_time()
    out = jax.block_until_ready(f(params))
    return time.perf_counter() - t0, time.process_time() - c0, float(out[0])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[500, 1000, 2000])
    p.add_argument("--repeats", type=int, default=5, help="timed calls per case (>= 5)")
    p.add_argument("--quick", action="store_true", help="n = 200, 400 only (smoke run)")
    args = p.parse_args(argv)
    if args.repeats < 5:
        p.error("--repeats must be >= 5 (the median of at least 5 calls)")

    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np
    import numpyro.distributions as dist

    import gpchol.numpyro as gnp

    sizes = [200, 400] if args.quick else args.sizes
    print(
        f"jax {jax.__version__}, backend {jax.default_backend()}, float64, median of "
        f"{args.repeats}; value_and_grad of the NUTS potential (3 hyperparameters)"
    )
    print(
        f"{'n':>6} {'numpyro [s]':>12} {'gpchol [s]':>11} {'speed-up':>9} "
        f"{'cpu-time speed-up':>18} {'|dU|':>9}  compile numpyro/gpchol [s]"
    )
    for n in sizes:
        rng = np.random.default_rng(n)
        X = np.sort(rng.uniform(0.0, 10.0, n))
        y = np.sin(X) + 0.1 * rng.standard_normal(n)
        f_ref, p_ref, c_ref = _compiled_gradient(dist.MultivariateNormal, X, y)
        f_gp, p_gp, c_gp = _compiled_gradient(gnp.MultivariateNormal, X, y)
        ref, gp = [], []
        for _ in range(args.repeats):  # interleaved: both see the same machine load
            ref.append(_timed(f_ref, p_ref))
            gp.append(_timed(f_gp, p_gp))
        t_ref, u_ref = (statistics.median(r[i] for r in ref) for i in (0, 1))
        t_gp, u_gp = (statistics.median(r[i] for r in gp) for i in (0, 1))
        du = abs(ref[0][2] - gp[0][2])
        print(
            f"{n:>6} {t_ref:>12.4f} {t_gp:>11.4f} {t_ref / t_gp:>8.2f}x "
            f"{u_ref / u_gp:>17.2f}x {du:>9.1e}  {c_ref:.1f}/{c_gp:.1f}"
        )


if __name__ == "__main__":
    main()
