"""``A^-1`` from a Cholesky factor by LAPACK ``potri`` on the host CPU.

On the CPU platform XLA runs gpchol's tiled inverse (:func:`gpchol._linalg.solve._trtri_blocked`
and :func:`gpchol._linalg.solve._lauum_lower`) as a chain of slices, GEMMs and triangular solves,
each a separate XLA operation with its own copies of the operands. LAPACK's ``potri`` does
the same arithmetic (``n^3 / 3`` for ``trtri`` plus ``n^3 / 3`` for ``lauum``) in place,
blocked and multi-threaded: about 2.8x faster at ``n = 4000`` float64 on this project's
2-core CPU (0.52 s against 1.44 s). The whole-likelihood derivative rules, which need
``K^-1``, therefore call it through ``jax.pure_callback`` when the computation is lowered
for the CPU. The LAPACK used is SciPy's (``scipy.linalg.lapack``; SciPy is a dependency of
jaxlib itself, which takes its own LAPACK from the same place).

The function is differentiable (a ``custom_jvp``, so higher orders work too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

try:  # in-place host callbacks (XLA buffers handed to NumPy, outputs aliased to inputs)
    from jax.experimental.buffer_callback import buffer_callback
except ImportError:  # pragma: no cover - older JAX: copying pure_callback instead
    buffer_callback = None  # type: ignore[assignment]  # optional: absent in older JAX

__all__ = ["HOST_MIN_N", "cho_inverse_cpu", "chol_solve_cpu"]

#: Below this order the tiled XLA inverse is used even on the CPU (the callback's fixed
#: cost, tens of microseconds, is then comparable to the arithmetic).
HOST_MIN_N = 128

_MIRROR_BLOCK = 512


def _mirror_lower(a: np.ndarray) -> None:
    """Copy the strict lower triangle of the C-ordered square ``a`` onto its upper one.

    Done by square blocks so that no temporary larger than a block is made.
    """
    n = a.shape[0]
    b = _MIRROR_BLOCK
    for i in range(0, n, b):
        i1 = min(i + b, n)
        blk = a[i:i1, i:i1]
        iu = np.triu_indices(i1 - i, 1)
        blk[iu] = blk.T[iu]
        for j in range(i1, n, b):
            j1 = min(j + b, n)
            a[i:i1, j:j1] = a[j:j1, i:i1].T


def _potri_into(out: np.ndarray, upper: bool) -> None:
    """In place: ``out`` ``(..., n, n)`` holds the factors (``L``, or ``L^T`` when
    ``upper``) on entry and the full inverses ``A^-1`` on exit (C order)."""
    from scipy.linalg import lapack

    potri = lapack.dpotri if out.dtype == np.float64 else lapack.spotri
    for idx in np.ndindex(out.shape[:-2]):
        o = out[idx]
        # ``o.T`` is the Fortran-ordered view of the transpose of what ``o`` holds: the
        # upper factor ``L^T`` when ``o`` holds ``L``, else ``L``. potri overwrites that
        # triangle with the same triangle of ``A^-1``, i.e. the other triangle of ``o``
        # (A^-1 is symmetric); the mirror then fills the whole of ``o``.
        res, info = potri(o.T, lower=int(upper), overwrite_c=1)
        if not np.shares_memory(res, o):  # not expected: f2py worked on a copy
            o[...] = res.T
        if info != 0:
            o[...] = np.nan
        elif upper:
            _mirror_lower(o.T)
        else:
            _mirror_lower(o)


def _potri_host(F: np.ndarray, upper: bool) -> np.ndarray:
    """``pure_callback`` form: a new array with the inverses of the factors ``F``."""
    out = np.array(F, copy=True, order="C")
    _potri_into(out, upper)
    return out


def _potri_buffers(ctx: Any, out: Any, F: Any, *, upper: bool) -> None:
    """``buffer_callback`` form: ``out`` is ``F``'s own buffer (aliased), in place."""
    del ctx, F
    _potri_into(np.asarray(out), upper)


def _potri_callback(L: jax.Array, transposed: bool) -> jax.Array:
    # With ``transposed`` the callback is handed ``L^T``: a factor that XLA keeps in
    # column-major layout (LAPACK's potrf output) then reaches it without a copy.
    arg = jnp.swapaxes(L, -1, -2) if transposed else L
    shape = jax.ShapeDtypeStruct(L.shape, L.dtype)
    if buffer_callback is not None:
        # the factor's buffer becomes the inverse's: no n x n copy (XLA copies the
        # factor first only if something still reads it afterwards)
        cb = buffer_callback(
            partial(_potri_buffers, upper=transposed),
            shape,
            input_output_aliases={0: 0},
            vmap_method="broadcast_all",
        )
        return cb(arg)
    return jax.pure_callback(
        partial(_potri_host, upper=transposed), shape, arg, vmap_method="broadcast_all"
    )


@partial(jax.custom_jvp, nondiff_argnums=(1,))
def _cho_inverse_host(L: jax.Array, transposed: bool) -> jax.Array:
    return _potri_callback(L, transposed)


@_cho_inverse_host.defjvp
def _cho_inverse_host_jvp(
    transposed: bool, primals: tuple[jax.Array], tangents: tuple[jax.Array]
) -> tuple[jax.Array, jax.Array]:
    # With A = L L^T: d(A^-1) = -A^-1 dA A^-1 and dA = dL L^T + L dL^T. Written with JAX
    # operations, so the tangent is itself differentiable (hessians of the likelihood).
    (L,), (dL,) = primals, tangents
    inv = _cho_inverse_host(L, transposed)
    s = dL @ jnp.swapaxes(L, -1, -2)
    return inv, -(inv @ (s + jnp.swapaxes(s, -1, -2)) @ inv)


def cho_inverse_cpu(
    L: jax.Array, tiled: Callable[[jax.Array], jax.Array], *, column_major: bool = False
) -> jax.Array:
    """``A^-1`` from the lower factor ``L``: LAPACK on the CPU, ``tiled(L)`` elsewhere.

    The platform is chosen when the computation is lowered
    (``jax.lax.platform_dependent``), so the same jitted function uses LAPACK on the CPU
    and the tiled JAX inverse (or any other implementation given as ``tiled``) on a GPU.

    Args:
        L: ``(..., n, n)`` lower Cholesky factor (its strict upper triangle is ignored).
        tiled: ``L -> A^-1`` used on other platforms and for ``n < HOST_MIN_N``.
        column_major: hand the host ``L^T`` (a layout hint: right when ``L`` comes
            straight from XLA's LAPACK ``potrf``, which leaves it column-major).

    Returns:
        ``(..., n, n)`` symmetric ``A^-1``; NaN where ``L`` is singular.
    """
    if L.shape[-1] < HOST_MIN_N or L.dtype not in (jnp.float32, jnp.float64):
        return tiled(L)
    host = partial(_cho_inverse_host, transposed=column_major)
    return lax.platform_dependent(L, cpu=host, default=tiled)


# ----------------------------------------------------------------------------------------
# Factor and solve on the host: the lean Gaussian-process likelihood on the CPU
# ----------------------------------------------------------------------------------------


def _chol_solve_into(
    L: np.ndarray,
    r: np.ndarray,
    alpha: np.ndarray,
    quad: np.ndarray,
    logdet: np.ndarray,
    status: np.ndarray,
) -> None:
    """In place: ``L`` ``(..., n, n)`` holds ``K`` on entry (lower triangle read) and its
    lower Cholesky factor on exit; ``alpha``, ``quad``, ``logdet``, ``status`` are filled.

    ``o.T`` is the Fortran view of ``K^T``, whose upper triangle is ``K``'s lower one:
    ``potrf(upper)`` on it gives ``U`` with ``U^T U = K``, stored where ``o`` keeps
    ``L = U^T`` (its lower triangle); ``clean`` zeroes the rest. ``L z = r`` and
    ``L^T alpha = z`` are solved on the same view. A failed factorization gives
    ``status = info`` (LAPACK's first failing pivot, 1-based) and NaN everywhere else.
    """
    from scipy.linalg import lapack

    f64 = L.dtype == np.float64
    potrf = lapack.dpotrf if f64 else lapack.spotrf
    trtrs = lapack.dtrtrs if f64 else lapack.strtrs
    for idx in np.ndindex(L.shape[:-2]):
        o = L[idx]
        U, info = potrf(o.T, lower=0, clean=1, overwrite_a=1)
        if info == 0 and not np.shares_memory(U, o):  # not expected: f2py copied
            o[...] = U.T
        if info != 0:
            o[...] = np.nan
            alpha[idx], quad[idx], logdet[idx] = np.nan, np.nan, np.nan
            status[idx] = max(int(info), 1)
            continue
        status[idx] = 0
        Uv = o.T
        z, _ = trtrs(Uv, r[idx], lower=0, trans=1)
        a, _ = trtrs(Uv, z, lower=0, trans=0)
        alpha[idx] = a
        quad[idx] = z @ z
        logdet[idx] = 2.0 * np.sum(np.log(np.diagonal(o)))


def _chol_solve_host(K: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, ...]:
    """``pure_callback`` form: ``(L, alpha, quad, logdet, status)`` as new arrays."""
    K = np.asarray(K)
    r = np.asarray(r)
    batch = K.shape[:-2]
    L = np.array(K, copy=True, order="C")
    alpha = np.empty(r.shape, K.dtype)
    quad = np.empty(batch, K.dtype)
    logdet = np.empty(batch, K.dtype)
    status = np.zeros(batch, np.int32)
    _chol_solve_into(L, r, alpha, quad, logdet, status)
    return L, alpha, quad, logdet, status


def _chol_solve_buffers(ctx: Any, out: Sequence[Any], K: Any, r: Any) -> None:
    """``buffer_callback`` form: ``out[0]`` is ``K``'s own buffer (aliased), in place."""
    del ctx, K
    L, *results = (np.asarray(b) for b in out)
    _chol_solve_into(L, np.asarray(r), *results)


def chol_solve_cpu(K: jax.Array, r: jax.Array) -> tuple[jax.Array, ...]:
    """``(L, alpha, quad, logdet, status)`` of ``K`` and ``r`` by LAPACK on the host.

    Used by the Gaussian likelihoods on the CPU: ``K`` is factored in its own buffer (an
    in-place ``buffer_callback``; XLA copies ``K`` first only if something still reads
    it), the factor comes back row-major (no relayout before LAPACK ``potri``) with
    LAPACK's own status. Not differentiable by itself (the caller's custom rule
    differentiates around it).

    Args:
        K: ``(..., n, n)`` symmetric positive definite (lower triangle read).
        r: ``(..., n)`` right-hand side.

    Returns:
        ``L (..., n, n)``, ``alpha = K^-1 r (..., n)``, ``quad = r^T K^-1 r (...)``,
        ``logdet (...)`` and int32 ``status (...)`` (0, or the first failing pivot).
    """
    batch = K.shape[:-2]
    out = (
        jax.ShapeDtypeStruct(K.shape, K.dtype),
        jax.ShapeDtypeStruct(r.shape, K.dtype),
        jax.ShapeDtypeStruct(batch, K.dtype),
        jax.ShapeDtypeStruct(batch, K.dtype),
        jax.ShapeDtypeStruct(batch, jnp.int32),
    )
    if buffer_callback is not None:
        cb = buffer_callback(
            _chol_solve_buffers, out, input_output_aliases={0: 0}, vmap_method="broadcast_all"
        )
        return cb(K, r)
    return jax.pure_callback(_chol_solve_host, out, K, r, vmap_method="broadcast_all")
