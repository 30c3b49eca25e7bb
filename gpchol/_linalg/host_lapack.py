"""LAPACK on the CPU inside the compiled program: ``A^-1`` from a factor (``potri``) and
the factor-and-solve of the Gaussian likelihood (``potrf`` + two ``trsv``), both in place.

On the CPU platform XLA runs gpchol's tiled inverse (:func:`gpchol._linalg.tiled.cho_inverse_tiled`)
as a chain of slices, GEMMs and triangular solves, each a separate XLA operation with its
own copies of the operands. LAPACK's ``potri`` does the same arithmetic (``n^3 / 3`` for
``trtri`` plus ``n^3 / 3`` for ``lauum``) in place, blocked and multi-threaded, and faster
(``benchmarks/results/design-measurements.md``). Both calls go through
gpchol's compiled XLA FFI handlers (:mod:`gpchol._cpu.ffi`): no Python callback, so
nothing here can deadlock XLA's CPU runtime, hold the GIL or turn Ctrl-C into an internal
error, and ``vmap`` is looped over inside the handler.

Where the handlers are not built (an install without a C++ compiler) the same functions
fall back to XLA operations: slower, identical results up to rounding.

:func:`cho_inverse_cpu` is differentiable (a ``custom_jvp``, so higher orders work too).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from gpchol._base.platform import platform_dependent
from gpchol._cpu import ffi as cpu_ffi

__all__ = [
    "HOST_FACTOR_ABOVE",
    "HOST_MIN_N",
    "cho_inverse_cpu",
    "chol_solve_cpu",
    "compiled_lapack",
    "factor_cpu_large",
]

#: Above this order :func:`factor_cpu_large` factors on the CPU by the handlers (halving,
#: :data:`gpchol._cpu.ffi.SPLIT_ABOVE`) instead of ``jax.lax.linalg.cholesky``, whose one
#: threaded OpenBLAS ``potrf`` call crashes the process from n ~ 16,000-23,000 on
#: (machine-dependent; see ``gpchol/_cpu/lapack_ffi.cc``).
HOST_FACTOR_ABOVE = cpu_ffi.SPLIT_ABOVE

#: Below this order the tiled XLA inverse (one triangular solve and one product at such
#: sizes) is used even on the CPU: it is then as fast as a LAPACK call. From n = 32 on,
#: ``potri`` in place is faster (benchmarks/results/design-measurements.md).
HOST_MIN_N = 32


def compiled_lapack() -> bool:
    """The compiled CPU handlers are built and registered (:mod:`gpchol._cpu.ffi`)."""
    return cpu_ffi.cpu_unavailable_reason() is None


def _handled(a: jax.Array) -> bool:
    """The handlers can take ``a``: float32 or float64, and they are built."""
    return a.dtype in (jnp.float32, jnp.float64) and compiled_lapack()


@jax.custom_jvp
def _cho_inverse_host(L: jax.Array) -> jax.Array:
    # The factor's buffer becomes the inverse's (XLA copies it first only if something
    # still reads it).
    return cpu_ffi.potri(L)


@_cho_inverse_host.defjvp
def _cho_inverse_host_jvp(
    primals: tuple[jax.Array], tangents: tuple[jax.Array]
) -> tuple[jax.Array, jax.Array]:
    # With A = L L^T: d(A^-1) = -A^-1 dA A^-1 and dA = dL L^T + L dL^T. Written with JAX
    # operations, so the tangent is itself differentiable (hessians of the likelihood).
    (L,), (dL,) = primals, tangents
    inv = _cho_inverse_host(L)
    s = dL @ jnp.swapaxes(L, -1, -2)
    return inv, -(inv @ (s + jnp.swapaxes(s, -1, -2)) @ inv)


def cho_inverse_cpu(L: jax.Array, tiled: Callable[[jax.Array], jax.Array]) -> jax.Array:
    """``A^-1`` from the lower factor ``L``: LAPACK on the CPU, ``tiled(L)`` elsewhere.

    The platform is chosen when the computation is lowered
    (``jax.lax.platform_dependent``), so the same jitted function uses LAPACK on the CPU
    and the tiled JAX inverse (or any other implementation given as ``tiled``) on a GPU.

    Args:
        L: ``(..., n, n)`` lower Cholesky factor (its strict upper triangle is ignored).
        tiled: ``L -> A^-1`` used on other platforms and for ``n < HOST_MIN_N``.

    Returns:
        ``(..., n, n)`` symmetric ``A^-1``; NaN where ``L`` is singular.
    """
    if L.shape[-1] < HOST_MIN_N or not _handled(L):
        return tiled(L)
    return platform_dependent(L, cpu=_cho_inverse_host, default=tiled)


def chol_solve_cpu(K: jax.Array, r: jax.Array, *, symmetric: bool = False) -> tuple[jax.Array, ...]:
    """``(L, alpha, quad, logdet, status)`` of ``K`` and ``r`` by LAPACK, in place.

    Used by the Gaussian likelihoods on the CPU when :func:`compiled_lapack`: ``K`` is
    factored in its own buffer (XLA copies ``K`` first only if something still reads it),
    the factor comes back row-major (no relayout before LAPACK ``potri``) with LAPACK's
    own status. Not differentiable by itself (the caller's custom rule differentiates
    around it).

    Args:
        K: ``(..., n, n)`` symmetric positive definite (lower triangle read).
        r: ``(..., n)`` right-hand side.
        symmetric: ``K`` equals its transpose bit for bit (saves a pass when row-major).

    Returns:
        ``L (..., n, n)``, ``alpha = K^-1 r (..., n)``, ``quad = r^T K^-1 r (...)``,
        ``logdet (...)`` and int32 ``status (...)`` (LAPACK ``potrf``'s ``info``).
    """
    return cpu_ffi.chol_solve(K, r, symmetric=symmetric)


def factor_cpu_large(
    a: jax.Array, default: Callable[[jax.Array], tuple[jax.Array, jax.Array]]
) -> tuple[jax.Array, jax.Array]:
    """``(L, status)`` of ``a``: by the handlers on the CPU above :data:`HOST_FACTOR_ABOVE`,
    else (smaller, other platforms, no handlers) ``default(a)``.

    The handlers call LAPACK ``potrf('L')`` as XLA's CPU Cholesky does, on blocks of order
    at most ``SPLIT_ABOVE`` above it, and report LAPACK's ``info`` (NaN pivots included)
    with an all-NaN factor on failure. Not differentiable by itself (the caller's rule is).

    Args:
        a: ``(..., n, n)`` symmetric (lower triangle read).
        default: ``a -> (L, status)`` elsewhere.

    Returns:
        ``L (..., n, n)`` lower (zero strict upper), int32 ``status (...)``.
    """
    if a.shape[-1] <= HOST_FACTOR_ABOVE or not _handled(a):
        return default(a)

    def host(a: jax.Array) -> tuple[jax.Array, jax.Array]:
        L, _, _, _, status = cpu_ffi.chol_solve(a, jnp.zeros(a.shape[:-1], a.dtype))
        return L, status

    out: tuple[jax.Array, jax.Array] = platform_dependent(a, cpu=host, default=default)
    return out
