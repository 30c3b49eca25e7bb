"""Many small GPs fitted at once: gpchol.fit_batched against the ways a user would do it.

Problem: ``B`` independent datasets of ``n`` points each (1-D inputs, a sine of random
frequency and phase plus noise), each fitted with ``amplitude * ExpSquared(lengthscale)
+ noise`` from the same start (1, 1, 0.1), float64, to convergence (L-BFGS, relative loss
change below 1e-9 for 3 steps, at most 200 steps). Compared, in one run:

* ``gpchol.fit_batched``: one call, the whole optimisation in one compiled loop (the time
  includes its compilation);
* a Python loop over ``gpchol.fit``: timed on a subset of the problems and extrapolated to
  ``B`` (said so in the table);
* tinygp + optax: the same L-BFGS loop (``optax.lbfgs``, same stopping test) written as a
  tinygp user would, ``lax.while_loop`` per problem, grouped as gpchol's (see
  ``--vectorize``), jitted; first call (with compilation) and a second call;
* a loop of scikit-learn ``GaussianProcessRegressor.fit`` (L-BFGS-B, no restarts): timed on
  a subset, extrapolated.

The optima are compared (each problem's final negative log marginal likelihood against
gpchol.fit_batched's). Targets (issue 16): >= 20x faster than the Python loop over
``gpchol.fit``, >= 1.0x the tinygp + optax loop, same optimum per problem.

``--vectorize K`` groups K problems per vmapped group (gpchol's ``vectorize`` argument and
the tinygp loop alike); the default 1 runs each problem's loop on its own inside the one
compiled program. With K > 1 on a CPU with few cores, jaxlib 0.10.2's batched LAPACK
kernels can deadlock XLA's thread pool (two batched triangular solves that split their
batch over the pool at once, seen on 2 cores); gpchol's batched solves and factors run one
matrix after another instead (gpchol/_linalg/triangular.py), tinygp's do not.

Usage::

    python benchmarks/bench_batched.py            # B = 1000, n = 50, subsets of 20
    python benchmarks/bench_batched.py --quick    # B = 32, n = 50, subsets of 4

``run(quick)`` returns the table's rows (dicts) for ``benchmarks/bench_small.py``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np

STEPS, TOL, PATIENCE = 200, 1e-9, 3
P0 = (1.0, 1.0, 0.1)


def problems(B: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``X (B, n)`` sorted inputs on [0, 10], ``y (B, n)``: a sine per problem plus noise."""
    rng = np.random.default_rng(seed)
    X = np.sort(rng.uniform(0.0, 10.0, (B, n)), axis=1)
    freq = rng.uniform(0.3, 1.5, (B, 1))
    phase = rng.uniform(0.0, 2 * np.pi, (B, 1))
    y = np.sin(freq * X + phase) + rng.uniform(0.05, 0.4, (B, 1)) * rng.standard_normal((B, n))
    return X, y


def _gpchol(X, y, vectorize: int) -> tuple[float, np.ndarray, Any]:
    import jax.numpy as jnp

    from gpchol import GaussianProcess, Positive, fit_batched, kernels

    t = {"amp": Positive(), "ls": Positive(), "noise": Positive()}
    p0 = dict(zip(("amp", "ls", "noise"), P0, strict=True))

    def build(p, x):
        return GaussianProcess(p["amp"] * kernels.ExpSquared(p["ls"]), x, noise=p["noise"])

    t0 = time.perf_counter()
    res = fit_batched(
        build,
        p0,
        jnp.asarray(X),
        jnp.asarray(y),
        transforms=t,
        steps=STEPS,
        tol=TOL,
        patience=PATIENCE,
        progress=False,
        vectorize=vectorize,
    )
    return time.perf_counter() - t0, np.asarray(res.loss), res


def _gpchol_loop(X, y) -> tuple[float, np.ndarray]:
    import jax.numpy as jnp

    import gpchol
    from gpchol import GaussianProcess, Positive, kernels

    t = {"amp": Positive(), "ls": Positive(), "noise": Positive()}
    p0 = dict(zip(("amp", "ls", "noise"), P0, strict=True))
    losses = []
    t0 = time.perf_counter()
    for x, v in zip(X, y, strict=True):
        xj = jnp.asarray(x)
        r = gpchol.fit(
            lambda p, xj=xj: GaussianProcess(
                p["amp"] * kernels.ExpSquared(p["ls"]), xj, noise=p["noise"]
            ),
            p0,
            jnp.asarray(v),
            transforms=t,
            steps=STEPS,
            tol=TOL,
            patience=PATIENCE,
            progress=False,
        )
        losses.append(r.loss)
    return time.perf_counter() - t0, np.asarray(losses)


def _tinygp(X, y, vectorize: int) -> tuple[float, float, np.ndarray]:
    import jax
    import jax.numpy as jnp
    import optax
    import tinygp

    inv_softplus = np.log(np.expm1(np.asarray(P0)))
    opt = optax.lbfgs()

    def one(x, v):
        def loss(u):
            amp, ls, noise = jax.nn.softplus(u)
            gp = tinygp.GaussianProcess(amp * tinygp.kernels.ExpSquared(ls), x, diag=noise)
            return -gp.log_probability(v)

        vg = optax.value_and_grad_from_state(loss)
        u0 = jnp.asarray(inv_softplus)

        def body(c):
            u, s, k, prev, stall, _ = c
            val, g = vg(u, state=s)
            upd, s = opt.update(g, s, u, value=val, grad=g, value_fn=loss)
            small = (k > 0) & (jnp.abs(prev - val) <= TOL * jnp.maximum(1.0, jnp.abs(val)))
            stall = jnp.where(small, stall + 1, 0)
            ok = jnp.isfinite(val)
            return optax.apply_updates(u, upd), s, k + 1, val, stall, ~ok

        def cond(c):
            return (c[2] < STEPS) & (c[4] < PATIENCE) & ~c[5]

        c = (u0, opt.init(u0), 0, jnp.asarray(jnp.nan), 0, jnp.asarray(False))
        u = jax.lax.while_loop(cond, body, c)[0]
        return loss(u)

    f = jax.jit(
        lambda a, b: jax.lax.map(
            lambda ab: one(*ab), (a, b), batch_size=None if vectorize == 1 else vectorize
        )
    )
    Xj, yj = jnp.asarray(X), jnp.asarray(y)
    t0 = time.perf_counter()
    out = jax.block_until_ready(f(Xj, yj))
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    jax.block_until_ready(f(Xj, yj))
    second = time.perf_counter() - t0
    return first, second, np.asarray(out)


def _sklearn(X, y) -> tuple[float, np.ndarray]:
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

    losses = []
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for x, v in zip(X, y, strict=True):
            k = ConstantKernel(P0[0], (1e-5, 1e5)) * RBF(P0[1], (1e-5, 1e5)) + WhiteKernel(
                P0[2], (1e-9, 1e5)
            )
            gp = GaussianProcessRegressor(k, alpha=0.0, n_restarts_optimizer=0)
            gp.fit(x[:, None], v)
            losses.append(-gp.log_marginal_likelihood_value_)
    return time.perf_counter() - t0, np.asarray(losses)


def _gap(a: np.ndarray, b: np.ndarray) -> float:
    """Largest |a - b| / max(1, |b|) over the problems where both are finite."""
    ok = np.isfinite(a) & np.isfinite(b)
    return (
        float(np.max(np.abs(a[ok] - b[ok]) / np.maximum(1.0, np.abs(b[ok]))))
        if ok.any()
        else np.nan
    )


def run(
    quick: bool = False,
    *,
    B: int | None = None,
    n: int = 50,
    subset: int | None = None,
    vectorize: int = 1,
    report=print,
) -> list[dict[str, Any]]:
    """Runs the comparison; returns one row per method (and prints the table).

    Each row: ``method``, ``B``, ``n``, ``seconds`` (for all ``B`` problems; extrapolated
    from ``measured_on`` problems where that is smaller than ``B``), ``extrapolated``,
    ``speedup`` (the method's seconds over gpchol.fit_batched's: > 1 means gpchol is
    faster), ``optimum_gap`` (largest relative difference of the final loss against
    gpchol.fit_batched's), ``note``.
    """
    import jax

    jax.config.update("jax_enable_x64", True)
    B = B or (32 if quick else 1000)
    subset = min(B, subset or (4 if quick else 20))
    X, y = problems(B, n)
    rows: list[dict[str, Any]] = []

    t_ours, loss_ours, res = _gpchol(X, y, vectorize)
    rows.append(
        {
            "method": "gpchol.fit_batched",
            "B": B,
            "n": n,
            "seconds": t_ours,
            "measured_on": B,
            "extrapolated": False,
            "optimum_gap": 0.0,
            "note": f"{int(res.converged.sum())}/{B} converged, {int(res.failed.sum())} "
            f"failed, median {int(np.median(res.n_steps))} steps; one call incl. compile",
        }
    )

    t_loop, loss_loop = _gpchol_loop(X[:subset], y[:subset])
    rows.append(
        {
            "method": "python loop over gpchol.fit",
            "B": B,
            "n": n,
            "seconds": t_loop * B / subset,
            "measured_on": subset,
            "extrapolated": subset < B,
            "optimum_gap": _gap(loss_loop, loss_ours[:subset]),
            "note": f"{subset} fits timed ({t_loop:.2f} s), x {B / subset:g}",
        }
    )

    try:
        first, second, loss_tiny = _tinygp(X, y, vectorize)
        gap = _gap(loss_tiny, loss_ours)
        rows.append(
            {
                "method": "tinygp + optax loop (first call)",
                "B": B,
                "n": n,
                "seconds": first,
                "measured_on": B,
                "extrapolated": False,
                "optimum_gap": gap,
                "note": "incl. compile",
            }
        )
        rows.append(
            {
                "method": "tinygp + optax loop (second call)",
                "B": B,
                "n": n,
                "seconds": second,
                "measured_on": B,
                "extrapolated": False,
                "optimum_gap": gap,
                "note": "compiled; gpchol's time incl. compile",
            }
        )
    except ImportError as e:
        report(f"SKIP tinygp: {e}")

    try:
        t_sk, loss_sk = _sklearn(X[:subset], y[:subset])
        rows.append(
            {
                "method": "loop of sklearn GaussianProcessRegressor.fit",
                "B": B,
                "n": n,
                "seconds": t_sk * B / subset,
                "measured_on": subset,
                "extrapolated": subset < B,
                "optimum_gap": _gap(loss_sk, loss_ours[:subset]),
                "note": f"{subset} fits timed ({t_sk:.2f} s), x {B / subset:g}",
            }
        )
    except ImportError as e:
        report(f"SKIP scikit-learn: {e}")

    for r in rows:
        r["speedup"] = r["seconds"] / t_ours
    report(
        f"bench_batched: B={B} GPs of n={n} (ExpSquared + noise, float64, L-BFGS to "
        f"tol={TOL:g}), jax {jax.__version__} on {jax.default_backend()}, vectorize={vectorize}"
    )
    report(f"{'method':45s} {'seconds':>9s} {'gpchol faster by':>17s} {'optimum gap':>12s}  note")
    for r in rows:
        mark = " (extrapolated)" if r["extrapolated"] else ""
        report(
            f"{r['method']:45s} {r['seconds']:9.2f} {r['speedup']:16.2f}x "
            f"{r['optimum_gap']:12.1e}  {r['note']}{mark}"
        )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="B = 32, subsets of 4")
    ap.add_argument("--B", type=int, default=None, help="number of GPs (default 1000)")
    ap.add_argument("--n", type=int, default=50, help="points per GP (default 50)")
    ap.add_argument("--subset", type=int, default=None, help="fits timed in the loops (20)")
    ap.add_argument("--vectorize", type=int, default=1, help="problems per vmapped group (1)")
    args = ap.parse_args(argv)
    run(args.quick, B=args.B, n=args.n, subset=args.subset, vectorize=args.vectorize)
    return 0


if __name__ == "__main__":
    sys.exit(main())
