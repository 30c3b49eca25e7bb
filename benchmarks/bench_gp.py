"""One jitted value-and-gradient step of the exact GP log marginal likelihood.

Model: ``a * ExpSquared(lengthscale) + noise`` on 3-D inputs, float64; the gradient is
taken wrt all hyperparameters (amplitude, lengthscale, noise; unconstrained through
``exp``). Compared: gpchol's :class:`GaussianProcess` (gpchol's Cholesky and its Murray
adjoint) against the same model written with ``jnp.linalg.cholesky`` + JAX autodiff.
Median of ``--repeat`` (>= 5) timed calls after a warm-up call; prints the ratios
(target: gpchol >= 2x faster at n = 4000).

Usage::

    python benchmarks/bench_gp.py            # n = 1000, 2000, 4000
    python benchmarks/bench_gp.py --quick    # n = 300, 600, 3 repeats (smoke test)
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000, 4000])
    ap.add_argument("--repeat", type=int, default=5, help="timed calls (median), >= 5")
    ap.add_argument("--quick", action="store_true", help="small sizes, fewer repeats")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.repeat = [300, 600], 3

    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    from gpchol import GaussianProcess, kernels

    def params(u):
        return jnp.exp(u[0]), jnp.exp(u[1]), jnp.exp(u[2])

    def make(X, y):
        def ours(u):
            a, ls, nz = params(u)
            gp = GaussianProcess(a * kernels.ExpSquared(ls), X, noise=nz)
            return gp.log_marginal_likelihood(y)

        def ref(u):
            a, ls, nz = params(u)
            n = X.shape[0]
            K = (a * kernels.ExpSquared(ls))(X, X) + nz * jnp.eye(n)
            L = jnp.linalg.cholesky(K)
            z = jax.scipy.linalg.solve_triangular(L, y, lower=True)
            return (
                -0.5 * jnp.dot(z, z) - jnp.sum(jnp.log(jnp.diag(L))) - 0.5 * n * jnp.log(2 * jnp.pi)
            )

        return jax.jit(jax.value_and_grad(ours)), jax.jit(jax.value_and_grad(ref))

    def timeit(f, u):
        jax.block_until_ready(f(u))  # compile + warm-up
        ts = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            jax.block_until_ready(f(u))
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts))

    print(
        f"bench_gp: value_and_grad of the exact GP MLL (ExpSquared + noise, d=3, float64), "
        f"median of {args.repeat}; jax {jax.__version__}, {jax.default_backend()}"
    )
    print(f"{'n':>6} {'gpchol (s)':>11} {'jnp.linalg (s)':>15} {'speed-up':>9}  |grad diff|")
    rng = np.random.default_rng(0)
    for n in args.sizes:
        X = jnp.asarray(rng.uniform(-3, 3, (n, 3)))
        y = jnp.asarray(np.sin(np.asarray(X).sum(1)) + 0.1 * rng.standard_normal(n))
        u = jnp.log(jnp.array([1.0, 1.0, 0.1]))
        f_ours, f_ref = make(X, y)
        (_, g1), (_, g2) = f_ours(u), f_ref(u)
        err = float(jnp.max(jnp.abs(g1 - g2)) / jnp.max(jnp.abs(g2)))
        t_ours, t_ref = timeit(f_ours, u), timeit(f_ref, u)
        print(f"{n:>6} {t_ours:>11.4f} {t_ref:>15.4f} {t_ref / t_ours:>8.2f}x  {err:.1e}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
