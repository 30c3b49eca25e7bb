"""SVGP training throughput: jitted optax steps per second on minibatches.

One step is ``jit(value_and_grad(-elbo))`` of a :class:`gpchol.SVGP` (ExpSquared kernel,
Gaussian likelihood, whitened, inducing inputs learned too) on one minibatch, followed by
an Adam update, on the shared problem of :mod:`benchmarks._common` (``X (n, 3)`` uniform
on ``[0, 10]^3``); minibatches come from :func:`gpchol.minibatches` (``drop_last``: one
batch shape, one compilation). The time per step is ``O(M^2 b + M^3)`` whatever ``n``:
``n`` only sets the scale of the bound and the size of the arrays batches are drawn from.

:func:`svgp_steps_per_second` is the function other benchmarks call
(``benchmarks/bench_sparse.py``); run this file for a table::

    python -m benchmarks.bench_svgp [--n 100000] [--M 256 512] [--batch 1024] [--steps 50]

Figures measured on a loaded machine are not results: record them only from a quiet one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import problem


def svgp_steps_per_second(
    n: int = 100_000,
    M: int = 256,
    batch: int = 1024,
    *,
    steps: int = 50,
    repeats: int = 3,
    dtype: Any = np.float64,
    seed: int = 0,
) -> dict[str, Any]:
    """SVGP optax steps per second at one size.

    Args:
        n: number of observations (the minibatches are drawn from them).
        M: number of inducing inputs (chosen by :func:`gpchol.inducing_points`, greedy
            conditional variance; not timed).
        batch: rows per minibatch.
        steps: steps timed per repeat.
        repeats: timed repeats (the median is reported).
        dtype: ``np.float64`` (needs ``jax_enable_x64``, which this function enables for
            its own duration only) or ``np.float32``.
        seed: seed of the problem and of the minibatch order.

    Returns:
        A dict: ``n``, ``M``, ``batch``, ``dtype``, ``steps_per_second`` (median over the
        repeats), ``per_repeat`` (steps per second of each repeat), ``compile_s`` (the
        first step, compilation included), ``final_loss`` (finite: the step ran).
    """
    import jax
    import optax

    import gpchol
    from gpchol import kernels, likelihoods

    with jax.enable_x64(np.dtype(dtype) == np.float64):
        X, y = problem(n, seed)
        X, y = X.astype(dtype), y.astype(dtype)
        kernel = 1.0 * kernels.ExpSquared(1.5)
        model = gpchol.SVGP(
            kernel,
            inducing=gpchol.inducing_points(X, M, kernel=kernel),
            likelihood=likelihoods.Gaussian(0.1),
            num_data=n,
            jitter=1e-6,
        )
        t = model.default_transforms()
        u = gpchol.to_unconstrained(model, t)
        opt = optax.adam(1e-2)
        state = opt.init(u)

        @jax.jit
        def step(u: Any, state: Any, Xb: Any, yb: Any) -> Any:
            value, grad = jax.value_and_grad(lambda u: -gpchol.to_constrained(u, t).elbo(Xb, yb))(u)
            updates, state = opt.update(grad, state, u)
            return optax.apply_updates(u, updates), state, value

        batches = gpchol.minibatches((X, y), batch, jax.random.PRNGKey(seed))
        Xb, yb = next(batches)
        t0 = time.perf_counter()
        u, state, value = jax.block_until_ready(step(u, state, Xb, yb))
        compile_s = time.perf_counter() - t0
        rates = []
        for _ in range(repeats):
            # the batches of a repeat are drawn before its clock starts
            data = [next(batches) for _ in range(steps)]
            t0 = time.perf_counter()
            for Xb, yb in data:
                u, state, value = step(u, state, Xb, yb)
            jax.block_until_ready(value)
            rates.append(steps / (time.perf_counter() - t0))
        return {
            "n": n,
            "M": M,
            "batch": batch,
            "dtype": np.dtype(dtype).name,
            "steps_per_second": statistics.median(rates),
            "per_repeat": rates,
            "compile_s": compile_s,
            "final_loss": float(value),
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="observations (default 100000)")
    ap.add_argument("--M", type=int, nargs="+", default=[256, 512], help="inducing inputs")
    ap.add_argument("--batch", type=int, default=1024, help="rows per minibatch")
    ap.add_argument("--steps", type=int, default=50, help="steps timed per repeat")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats")
    ap.add_argument("--float32", action="store_true", help="float32 instead of float64")
    ap.add_argument("--json", help="write the records to this file")
    args = ap.parse_args(argv)
    records = []
    print(f"{'n':>9} {'M':>5} {'batch':>6} {'steps/s':>9} {'first step s':>13}")
    for M in args.M:
        rec = svgp_steps_per_second(
            args.n,
            M,
            args.batch,
            steps=args.steps,
            repeats=args.repeats,
            dtype=np.float32 if args.float32 else np.float64,
        )
        records.append(rec)
        print(
            f"{rec['n']:>9} {M:>5} {rec['batch']:>6} {rec['steps_per_second']:>9.1f} "
            f"{rec['compile_s']:>13.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
