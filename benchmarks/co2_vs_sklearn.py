"""Log marginal likelihood of the R&W CO2 kernel: gpchol's fit vs scikit-learn's.

Both fit the same kernel family (long-term ExpSquared + ExpSquared x Periodic(period 1 yr,
fixed) + RationalQuadratic + short ExpSquared, and white observation noise) on the same
data: the embedded monthly Mauna Loa CO2 means (n = 521), inputs in years, the data mean
subtracted. scikit-learn (an optional, bench-only dependency) runs its L-BFGS-B from the
initial values of its own CO2 example and from R&W's; gpchol runs ``gpchol fit``'s model.

Usage::

    python benchmarks/co2_vs_sklearn.py [--restarts N] [--steps N]

Prints both log marginal likelihoods, the difference and the times.
"""

from __future__ import annotations

import argparse
import sys
import time


def _gpchol(steps: int):
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    from gpchol import GaussianProcess, datasets, fit
    from gpchol.cli.spec import ModelSpec

    data = datasets.load("co2", monthly=True)
    X, y = np.asarray(data.X), np.asarray(data.y)
    spec = ModelSpec.parse("co2", 1)
    t0 = time.perf_counter()
    res = fit(
        lambda p: GaussianProcess(spec.build(p)[0], X, noise=spec.build(p)[1]),
        {k: jnp.asarray(v, jnp.float64) for k, v in spec.init_params().items()},
        jnp.asarray(y - y.mean()),
        transforms=spec.transforms(),
        optimizer="lbfgs",
        steps=steps,
        progress=False,
    )
    return res.log_marginal_likelihood, time.perf_counter() - t0, res


def _sklearn(restarts: int, data: str | None = None):
    """scikit-learn's fits from both starts; ``data``: an ``.npz`` with ``X``, ``y`` to read
    instead of loading through ``gpchol.datasets`` (which imports JAX: a fresh process
    timing scikit-learn must not pay for JAX's import)."""
    import numpy as np
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ExpSineSquared, RationalQuadratic
    from sklearn.gaussian_process.kernels import WhiteKernel as W

    if data is None:
        from gpchol import datasets

        co2 = datasets.load("co2", monthly=True)
        X, y = np.asarray(co2.X), np.asarray(co2.y)
    else:
        with np.load(data) as f:
            X, y = f["X"], f["y"]
    y = y - y.mean()
    kernels = {
        "sklearn example init": 50.0**2 * RBF(50.0)
        + 2.0**2 * RBF(100.0) * ExpSineSquared(1.0, 1.0, periodicity_bounds="fixed")
        + 0.5**2 * RationalQuadratic(1.0, 1.0)
        + 0.1**2 * RBF(0.1)
        + W(0.1**2, noise_level_bounds=(1e-5, 1e5)),
        "R&W init": 66.0**2 * RBF(67.0)
        + 2.4**2 * RBF(90.0) * ExpSineSquared(1.3, 1.0, periodicity_bounds="fixed")
        + 0.66**2 * RationalQuadratic(1.2, 0.78)
        + 0.18**2 * RBF(0.134)
        + W(0.19**2, noise_level_bounds=(1e-5, 1e5)),
    }
    out = {}
    for name, k in kernels.items():
        t0 = time.perf_counter()
        gp = GaussianProcessRegressor(k, n_restarts_optimizer=restarts, random_state=0)
        gp.fit(X, y)
        out[name] = (gp.log_marginal_likelihood_value_, time.perf_counter() - t0, gp.kernel_)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--restarts", type=int, default=0, help="sklearn n_restarts_optimizer")
    ap.add_argument("--steps", type=int, default=200, help="gpchol L-BFGS steps")
    args = ap.parse_args(argv)
    try:
        import sklearn  # noqa: F401
    except ImportError:
        print("scikit-learn is not installed (pip install scikit-learn); skipping.")
        return 0
    lml_g, t_g, res = _gpchol(args.steps)
    print(
        f"gpchol       : LML {lml_g:.6f}  ({res.n_steps} L-BFGS steps, {t_g:.1f} s incl. compile)"
    )
    best = -float("inf")
    for name, (lml, t, k) in _sklearn(args.restarts).items():
        best = max(best, lml)
        print(f"scikit-learn : LML {lml:.6f}  ({name}, {t:.1f} s)\n    kernel_ = {k}")
    print(
        f"gpchol - best scikit-learn = {lml_g - best:+.2e}  "
        f"({'gpchol at least as high' if lml_g >= best - 1e-6 else 'gpchol LOWER'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
