"""The CPU handlers' factor and inverse at large n: split (halving) vs one LAPACK call.

Above ``gpchol._cpu.ffi.SPLIT_ABOVE`` (8192) the handlers factor and invert by halving,
on all OpenBLAS threads: SciPy 1.17.1's OpenBLAS segfaults in its threaded ``dsyrk`` (and
so ``dpotrf``) from order ~23,000 on here (16,000 on another machine). Before, they made
one ``potrf`` / ``potri`` call, on one OpenBLAS thread above 20,000. This script times one
of the two in a fresh process (squared-exponential kernel matrix plus noise at ``n``
sorted points), and checks the inverse on a few columns (``max |A^-1 K e_j - e_j|``)::

    python benchmarks/bench_split.py --n 24000                       # split, all threads
    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_split.py --n 24000 --split-above 1000000000

(the second is the old path: one call, one thread; with more threads it would crash).
Needs about 2.5 n^2 doubles of memory (11 GiB at n = 24,000). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=24000)
    ap.add_argument("--split-above", type=int, default=None, help="default: SPLIT_ABOVE")
    args = ap.parse_args(argv)
    import jax
    import jax.numpy as jnp
    import numpy as np

    from gpchol._internal import cpu_ffi

    jax.config.update("jax_enable_x64", True)
    n = args.n
    split = cpu_ffi.SPLIT_ABOVE if args.split_above is None else args.split_above
    rng = np.random.default_rng(0)
    x = np.sort(rng.uniform(0.0, 100.0, n))

    def kernel_matrix(x):
        r = x[:, None] - x[None, :]
        return jnp.exp(-0.5 * r * r / 4.0) + 0.1 * jnp.eye(x.shape[0])

    y = jnp.asarray(np.sin(x))

    def factor(x, y):
        return cpu_ffi.chol_solve(kernel_matrix(x), y, column_major=True, split_above=split)

    def inverse(L):
        return cpu_ffi.potri(L, column_major=True, split_above=split)

    t0 = time.perf_counter()
    L, _, quad, logdet, status = jax.block_until_ready(jax.jit(factor)(jnp.asarray(x), y))
    t1 = time.perf_counter()
    inv = jax.block_until_ready(jax.jit(inverse, donate_argnums=0)(L))
    t2 = time.perf_counter()
    cols = rng.choice(n, 4, replace=False)
    eye = np.arange(n)[:, None] == cols[None, :]
    k_cols = np.exp(-0.5 * (x[:, None] - x[None, cols]) ** 2 / 4.0) + 0.1 * eye
    residual = float(np.max(np.abs(np.asarray(inv) @ k_cols - eye)))
    print(
        json.dumps(
            {
                "n": n,
                "split_above": split,
                "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS"),
                "cpus": os.cpu_count(),
                "jax": jax.__version__,
                "status": int(status),
                "build_factor_solve_s": round(t1 - t0, 1),
                "potri_s": round(t2 - t1, 1),
                "logdet": float(logdet),
                "quad": float(quad),
                "inverse_residual": residual,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
