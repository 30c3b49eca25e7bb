"""The scikit-learn estimators side by side on the CO2 example: gpchol.sklearn vs sklearn.

Both estimators get the kernel of scikit-learn's own Mauna Loa CO2 example (long-term
ExpSquared + ExpSquared x Periodic (period 1 year, fixed) + RationalQuadratic + short
ExpSquared + White noise) at that example's initial values, on the embedded monthly CO2
means (n = 521, inputs in years, ``normalize_y=False``, the data mean subtracted), and
fit on the log scale: scikit-learn with SciPy's L-BFGS-B on its own gradient; gpchol
with the same SciPy L-BFGS-B on gpchol's jitted gradient (``optimizer="fmin_l_bfgs_b"``)
and with :func:`gpchol.fit`'s optax L-BFGS (``optimizer="lbfgs"``). Printed: each log marginal
likelihood, the difference and the wall times (gpchol's includes JAX's compilation).

Usage::

    python benchmarks/co2_sklearn_estimator.py [--repeat N]
"""

from __future__ import annotations

import argparse
import sys
import time


def _data():
    import numpy as np

    from gpchol import datasets

    data = datasets.load("co2", monthly=True)
    X, y = np.asarray(data.X, np.float64), np.asarray(data.y, np.float64)
    return X, y - y.mean()


def gpchol_estimator(optimizer="fmin_l_bfgs_b"):
    """The gpchol estimator with the kernel of scikit-learn's CO2 example."""
    from gpchol import kernels as k
    from gpchol.sklearn import GaussianProcessRegressor

    kernel = (
        50.0**2 * k.ExpSquared(50.0)
        + 2.0**2 * k.ExpSquared(100.0) * k.Periodic(lengthscale=1.0, period=1.0)
        + 0.5**2 * k.RationalQuadratic(lengthscale=1.0, alpha=1.0)
        + 0.1**2 * k.ExpSquared(0.1)
        + k.White(0.1**2)
    )
    est = GaussianProcessRegressor(kernel, alpha=0.0, optimizer=optimizer)
    period = [p for p in est.hyperparameter_names() if p.endswith(".period")]
    return est.set_params(fixed=tuple(period))


def sklearn_estimator():
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ExpSineSquared, RationalQuadratic
    from sklearn.gaussian_process.kernels import WhiteKernel as W

    kernel = (
        50.0**2 * RBF(50.0)
        + 2.0**2 * RBF(100.0) * ExpSineSquared(1.0, 1.0, periodicity_bounds="fixed")
        + 0.5**2 * RationalQuadratic(1.0, 1.0)
        + 0.1**2 * RBF(0.1)
        + W(0.1**2, noise_level_bounds=(1e-5, 1e5))
    )
    return GaussianProcessRegressor(kernel, alpha=0.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=1, help="fits per estimator (best time)")
    args = ap.parse_args(argv)
    try:
        import sklearn  # noqa: F401
    except ImportError:
        print("scikit-learn is not installed (pip install scikit-learn); skipping.")
        return 0
    X, y = _data()
    results = {}
    makers = {
        "gpchol.sklearn": gpchol_estimator,
        "gpchol (lbfgs)": lambda: gpchol_estimator("lbfgs"),
        "scikit-learn": sklearn_estimator,
    }
    for name, make in makers.items():
        times = []
        for _ in range(args.repeat):
            est = make()
            t0 = time.perf_counter()
            est.fit(X, y)
            times.append(time.perf_counter() - t0)
        results[name] = (est.log_marginal_likelihood_value_, times)
        r = getattr(est, "fit_result_", None)
        steps = f", {getattr(r, 'nit', getattr(r, 'n_steps', 0))} iterations" if r else ""
        print(
            f"{name:15s}: LML {est.log_marginal_likelihood_value_:.6f}  fit "
            + ", ".join(f"{t:.2f}" for t in times)
            + f" s{steps}"
        )
    (lg, tg), (ls, ts) = results["gpchol.sklearn"], results["scikit-learn"]
    print(
        f"gpchol - scikit-learn LML = {lg - ls:+.2e} "
        f"({'within 1e-3 or higher' if lg >= ls - 1e-3 else 'LOWER'}); "
        f"time ratio (first fit) {ts[0] / tg[0]:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
