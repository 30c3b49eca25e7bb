"""LAPACK on the CPU inside the compiled program: ``A^-1`` from a factor (``potri``) and
the factor-and-solve of the Gaussian likelihood (``potrf`` + two ``trsv``), both in place.

LAPACK's ``potri`` does the arithmetic of the tiled inverse
(:func:`gpchol._linalg.tiled.cho_inverse_tiled`, a chain of XLA operations with their own
copies) in place and faster (``benchmarks/results/design-measurements.md``). Both calls
go through gpchol's compiled FFI handlers (:mod:`gpchol._cpu.ffi`; no Python callback).

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
    "refactor_where",
]

#: Above this order :func:`factor_cpu_large` factors on the CPU by the handlers (halving)
#: instead of ``jax.lax.linalg.cholesky``, whose one threaded OpenBLAS ``potrf`` call
#: crashes at large orders (see :data:`gpchol._cpu.ffi.SPLIT_ABOVE`).
HOST_FACTOR_ABOVE = cpu_ffi.SPLIT_ABOVE

#: Below this order the tiled XLA inverse is used even on the CPU: as fast as a LAPACK call
#: there (benchmarks/results/design-measurements.md).
HOST_MIN_N = 32


def compiled_lapack() -> bool:
    """The compiled CPU handlers are built and registered (:mod:`gpchol._cpu.ffi`)."""
    return cpu_ffi.cpu_unavailable_reason() is None


def _handled(a: jax.Array) -> bool:
    """The handlers can take ``a``: float32 or float64, and they are built."""
    return a.dtype in (jnp.float32, jnp.float64) and compiled_lapack()


@jax.custom_jvp
def _cho_inverse_host(L: jax.Array) -> jax.Array:
    # the factor's buffer becomes the inverse's
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
    """:func:`gpchol._cpu.ffi.chol_solve` (arguments and results there), row-major.

    Not differentiable by itself (the caller's custom rule differentiates around it).
    """
    return cpu_ffi.chol_solve(K, r, symmetric=symmetric)


def factor_cpu_large(
    a: jax.Array, default: Callable[[jax.Array], tuple[jax.Array, jax.Array]]
) -> tuple[jax.Array, jax.Array]:
    """``(L, status)`` of ``a``: by the handlers on the CPU above :data:`HOST_FACTOR_ABOVE`,
    else (smaller, other platforms, no handlers) ``default(a)``.

    The handlers report LAPACK's ``info`` (NaN pivots included) with an all-NaN factor on
    failure. Not differentiable by itself (the caller's rule is).

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


def refactor_where(
    redo: jax.Array,
    again: Callable[[], jax.Array],
    L: jax.Array,
    default: Callable[[jax.Array], jax.Array],
) -> jax.Array:
    """``L`` with the factor of ``again()`` where ``redo``: by the handlers on the CPU
    (the status search's own ``potrf``, on its thread policy), ``default(again())``
    elsewhere. Runs only when some element is to be redone (one ``lax.cond``).

    For a factor that failed where the status search, LAPACK's ``info``, says the matrix
    factors: a matrix within rounding of singular can fail on OpenBLAS's threads and not on
    one (the search's, up to ``one_thread_max_n``), and the factor must agree with the
    status.
    """

    def fix() -> jax.Array:
        a = jax.lax.stop_gradient(again())

        def host(a: jax.Array) -> jax.Array:
            return cpu_ffi.chol_solve(a, jnp.zeros(a.shape[:-1], a.dtype))[0]

        if _handled(a):
            new = platform_dependent(a, cpu=host, default=default)
        else:
            new = default(a)
        return jnp.where(redo[..., None, None], new.astype(L.dtype), L)

    return jax.lax.cond(jnp.any(redo), fix, lambda: L)
