"""Batched Cholesky factor + triangular solve on the CPU: gpchol's primitives
(``gpchol/_linalg/triangular.py``: one matrix after another through gpchol's handler)
against JAX's own (``jax.lax.linalg``: jaxlib's batched kernels, which hand the batch to
XLA's thread pool).

One compiled program per library and size, ``L = chol(S)`` then ``L^-1 B`` for a stack of
``B`` matrices of order ``n`` with 8 right-hand sides each, float64, the same inputs; the
table gives the median over ``--repeats`` rounds of 10 calls, interleaved, and the ratio.

Usage::

    python -m benchmarks.bench_batched_lapack [--repeats R] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time

SIZES = ((1000, 32), (200, 128), (16, 512))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None, help="write the table here")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be a positive integer")

    import jax
    import numpy as np
    from jax import lax

    from gpchol._internal import triangular

    jax.config.update("jax_enable_x64", True)

    def jaxlib(S, b):
        L = lax.linalg.cholesky(S, symmetrize_input=False)
        return lax.linalg.triangular_solve(L, b, left_side=True, lower=True)

    def gpchol(S, b):
        L = triangular.cholesky(S)
        return triangular.triangular_solve(L, b, left_side=True, lower=True)

    rows = []
    print(f"{'batch':>6} {'n':>5} {'jaxlib ms':>10} {'gpchol ms':>10} {'gpchol/jaxlib':>14}")
    for B, n in SIZES:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((B, n, n))
        S = jax.numpy.asarray(a @ a.transpose(0, 2, 1) + n * np.eye(n))
        b = jax.numpy.asarray(rng.standard_normal((B, n, 8)))
        fns = {"jaxlib": jax.jit(jaxlib), "gpchol": jax.jit(gpchol)}
        outs = {k: np.asarray(f(S, b)) for k, f in fns.items()}
        err = float(np.max(np.abs(outs["gpchol"] - outs["jaxlib"])))
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(args.repeats):
            for k, f in fns.items():
                t = time.perf_counter()
                for _ in range(10):
                    o = f(S, b)
                o.block_until_ready()
                times[k].append((time.perf_counter() - t) / 10)
        med = {k: statistics.median(v) for k, v in times.items()}
        row = {
            "batch": B,
            "n": n,
            "jaxlib_s": med["jaxlib"],
            "gpchol_s": med["gpchol"],
            "ratio": med["gpchol"] / med["jaxlib"],
            "max_abs_diff": err,
        }
        rows.append(row)
        print(
            f"{B:>6} {n:>5} {1e3 * row['jaxlib_s']:>10.3f} {1e3 * row['gpchol_s']:>10.3f} "
            f"{row['ratio']:>14.2f}",
            flush=True,
        )
    record = {"repeats": args.repeats, "rows": rows}
    if args.json:
        from benchmarks._common import write_record

        write_record(args.json, record)
    return record


if __name__ == "__main__":
    main()
