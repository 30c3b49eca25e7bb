"""The ``gpchol`` command line.

Subcommands:

* ``gpchol check`` -- factor and differentiate a random SPD matrix with every available
  backend, compare with JAX's own Cholesky, print errors and timings.

Errors in the user's input are reported as one line on stderr with a non-zero exit
status, never as a traceback.
"""

from __future__ import annotations

import argparse
import sys
import time

__all__ = ["main"]


class CLIError(Exception):
    """A user-facing error: printed as one line on stderr, exit status 2."""


def _timeit(fn, *args, repeat=3):
    import jax

    jax.block_until_ready(fn(*args))  # compile + warm up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _cmd_check(args) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import gpchol
    from gpchol import _ffi

    if args.n < 1:
        raise CLIError(f"--n must be >= 1 (got {args.n}).")
    if args.float32:
        dtype = np.float32
    else:
        jax.config.update("jax_enable_x64", True)
        dtype = np.float64
    rng = np.random.default_rng(args.seed)
    n = args.n
    m = rng.standard_normal((n, n))
    a = jnp.asarray((m @ m.T / n + np.eye(n)).astype(dtype))
    w = jnp.asarray(rng.standard_normal((n, n)).astype(dtype))

    def loss(chol):
        return lambda x: jnp.sum(chol(x) * w)

    ref_L = jax.jit(jnp.linalg.cholesky)(a)
    ref_grad_fn = jax.jit(jax.grad(loss(jnp.linalg.cholesky)))
    ref_grad = ref_grad_fn(a)
    t_ref_fwd = _timeit(jax.jit(jnp.linalg.cholesky), a)
    t_ref_grad = _timeit(ref_grad_fn, a)

    backends = ["xla", "tiled"]
    reason = _ffi.cuda_unavailable_reason() if jax.default_backend() == "gpu" else "no GPU"
    if reason is None:
        backends.append("cuda")
    print(
        f"gpchol {gpchol.__version__} check: n={n}, {np.dtype(dtype).name}, "
        f"jax {jax.__version__} on {jax.default_backend()}"
    )
    print(
        f"  reference jnp.linalg.cholesky: forward {t_ref_fwd * 1e3:8.1f} ms, "
        f"forward+grad {t_ref_grad * 1e3:8.1f} ms"
    )
    eps = float(np.finfo(dtype).eps)
    ok = True
    for be in backends:
        fwd = jax.jit(lambda x, be=be: gpchol.cholesky(x, backend=be, tile_size=args.tile_size))
        grad = jax.jit(
            jax.grad(
                loss(lambda x, be=be: gpchol.cholesky(x, backend=be, tile_size=args.tile_size))
            )
        )
        L = fwd(a)
        g = grad(a)
        L64 = np.asarray(L, np.float64)
        a64 = np.asarray(a, np.float64)
        resid = np.linalg.norm(a64 - L64 @ L64.T, 1) / (n * np.linalg.norm(a64, 1) * eps)
        err_L = float(jnp.max(jnp.abs(L - ref_L)) / jnp.max(jnp.abs(ref_L)))
        err_g = float(jnp.max(jnp.abs(g - ref_grad)) / jnp.max(jnp.abs(ref_grad)))
        t_fwd = _timeit(fwd, a)
        t_grad = _timeit(grad, a)
        good = resid < 30 and err_g < (1e-3 if args.float32 else 1e-8)
        ok &= good
        print(
            f"  backend={be:5s}  residual ratio {resid:6.2f}  |L-L_jax| {err_L:8.1e}  "
            f"|grad-grad_jax| {err_g:8.1e}  forward {t_fwd * 1e3:8.1f} ms  "
            f"forward+grad {t_grad * 1e3:8.1f} ms ({t_ref_grad / t_grad:4.2f}x JAX)  "
            f"{'ok' if good else 'FAILED'}"
        )
    if "cuda" not in backends:
        print(f"  backend=cuda  not available: {reason}")
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpchol",
        description="gpchol: differentiable tiled Cholesky and exact Gaussian processes.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser(
        "check",
        help="factor and differentiate a random SPD matrix with every backend",
        description="Factor and differentiate a random SPD matrix with every available "
        "backend; compare with jnp.linalg.cholesky; print errors and timings.",
    )
    p.add_argument("--n", type=int, default=1000, help="matrix size (default 1000)")
    p.add_argument("--tile-size", type=int, default=None, help="tile size (default: auto)")
    p.add_argument("--float32", action="store_true", help="use float32 (default float64)")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.set_defaults(func=_cmd_check)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except CLIError as e:
        print(f"gpchol: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, TypeError) as e:
        print(f"gpchol: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
