"""NUTS over the hyperparameters of a GP on the Mauna Loa CO2 record, with gpchol.numpyro.

The model, on a subset of the monthly CO2 series shipped with gpchol
(``gpchol.datasets.load("co2", monthly=True)``), standardized::

    k = a_trend * ExpSquared(l_trend) + a_season * Periodic(l_season, period=1 year)
    y ~ N(c, K(X, X) + noise I)

with log-normal priors on the five positive hyperparameters and a normal prior on the
constant mean ``c``. The same model is sampled twice with NumPyro's NUTS (same seed, same
settings): once with :class:`gpchol.numpyro.GaussianProcessMarginal` (gpchol's Cholesky
and Murray adjoint) and once with ``numpyro.distributions.MultivariateNormal`` on the
same dense covariance (``jnp.linalg.cholesky`` and JAX's default derivative). For each,
NumPyro's summary (mean, sd, quantiles, ``n_eff``, ``r_hat``) and the time per
effective sample (wall time of the run, compilation included, divided by the smallest
``n_eff`` over the parameters) are printed.

Small defaults finish in a few minutes on two CPU cores::

    python examples/numpyro_gp.py
    python examples/numpyro_gp.py --n 300 --warmup 500 --samples 500 --chains 4
"""

from __future__ import annotations

import argparse
import time


def build_model(mvn_kind):
    """The CO2 model; ``mvn_kind`` is ``"gpchol"`` or ``"numpyro"``."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    import gpchol.numpyro as gnp
    from gpchol import kernels

    def model(X, y):
        a_trend = numpyro.sample("a_trend", dist.LogNormal(0.0, 1.0))
        l_trend = numpyro.sample("l_trend", dist.LogNormal(2.0, 1.0))  # years
        a_season = numpyro.sample("a_season", dist.LogNormal(-2.0, 1.0))
        l_season = numpyro.sample("l_season", dist.LogNormal(0.0, 1.0))
        noise = numpyro.sample("noise", dist.LogNormal(-4.0, 1.0))
        c = numpyro.sample("c", dist.Normal(0.0, 1.0))
        k = a_trend * kernels.ExpSquared(l_trend) + a_season * kernels.Periodic(
            l_season, period=1.0
        )
        if mvn_kind == "gpchol":
            d = gnp.GaussianProcessMarginal(k, X, noise, mean=c, jitter=1e-6)
        else:
            cov = k(X, X) + (noise + 1e-6) * jnp.eye(X.shape[0])
            d = dist.MultivariateNormal(jnp.full(X.shape[0], c), cov, validate_args=False)
        numpyro.sample("y", d, obs=y)

    return model


def load_subset(n):
    """``n`` evenly spaced months of the CO2 record, standardized ``(X (n, 1), y (n,))``."""
    import numpy as np

    import gpchol

    data = gpchol.datasets.load("co2", monthly=True)
    X, y = np.asarray(data.X, float), np.asarray(data.y, float)
    idx = np.unique(np.linspace(0, len(y) - 1, min(n, len(y))).round().astype(int))
    X, y = X[idx], y[idx]
    return X - X[0, 0], (y - y.mean()) / y.std()


def run(kind, X, y, args):
    """Run NUTS; returns ``(samples by chain, wall seconds, mcmc)``."""
    import jax
    from numpyro.infer import MCMC, NUTS

    mcmc = MCMC(
        NUTS(build_model(kind)),
        num_warmup=args.warmup,
        num_samples=args.samples,
        num_chains=args.chains,
        chain_method="sequential",
        progress_bar=False,
    )
    t0 = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(args.seed), X, y)
    samples = mcmc.get_samples(group_by_chain=True)
    jax.block_until_ready(samples)
    return samples, time.perf_counter() - t0, mcmc


def main(argv=None):
    p = argparse.ArgumentParser(
        description="NUTS over GP hyperparameters on the CO2 data: gpchol vs NumPyro's MVN."
    )
    p.add_argument("--n", type=int, default=80, help="number of months used (default 80)")
    p.add_argument("--warmup", type=int, default=150, help="NUTS warm-up steps per chain")
    p.add_argument("--samples", type=int, default=150, help="NUTS samples per chain")
    p.add_argument("--chains", type=int, default=2, help="chains (run sequentially)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only-gpchol", action="store_true", help="skip the NumPyro baseline")
    args = p.parse_args(argv)

    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np
    from numpyro.diagnostics import effective_sample_size

    X, y = load_subset(args.n)
    print(
        f"CO2 monthly subset: n = {len(y)}, {X[-1, 0]:.1f} years; float64, "
        f"{args.chains} chains x ({args.warmup} warm-up + {args.samples} samples)"
    )
    kinds = ["gpchol"] if args.only_gpchol else ["gpchol", "numpyro"]
    results = {}
    for kind in kinds:
        print(f"\n=== {kind} ===")
        samples, wall, mcmc = run(kind, X, y, args)
        mcmc.print_summary()
        n_eff = min(float(np.min(effective_sample_size(np.asarray(v)))) for v in samples.values())
        results[kind] = (wall, n_eff)
        print(
            f"wall {wall:.1f} s, min n_eff {n_eff:.0f}, "
            f"time per effective sample {1e3 * wall / n_eff:.1f} ms"
        )
    if len(results) == 2:
        (wg, eg), (wn, en) = results["gpchol"], results["numpyro"]
        print(
            f"\ntime per effective sample, numpyro / gpchol: {(wn / en) / (wg / eg):.2f}x "
            f"(wall-clock ratio {wn / wg:.2f}x; compilation included; small n is "
            "dominated by per-step overheads, the gradient speed-up grows with n: see "
            "benchmarks/bench_numpyro.py)"
        )


if __name__ == "__main__":
    main()
