"""``A^-1`` from a Cholesky factor by LAPACK ``potri`` on the host CPU.

On the CPU platform XLA runs gpchol's tiled inverse (:func:`gpchol._solve._trtri_blocked`
and :func:`gpchol._solve._lauum_lower`) as a chain of slices, GEMMs and triangular solves,
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

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["HOST_MIN_N", "cho_inverse_cpu"]

#: Below this order the tiled XLA inverse is used even on the CPU (the callback's fixed
#: cost, tens of microseconds, is then comparable to the arithmetic).
HOST_MIN_N = 128

_MIRROR_BLOCK = 512


def _mirror_lower(a):
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


def _potri_host(F, upper):
    """NumPy side of the callback: ``(..., n, n)`` factors -> full inverses.

    ``F`` holds the lower factors ``L`` (``upper=False``) or their transposes ``L^T``.
    """
    from scipy.linalg import lapack

    F = np.asarray(F)
    potri = lapack.dpotri if F.dtype == np.float64 else lapack.spotri
    out = np.empty(F.shape, F.dtype)  # C order
    for idx in np.ndindex(F.shape[:-2]):
        o = out[idx]
        o[...] = F[idx]
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
    return out


def _potri_callback(L, transposed):
    # With ``transposed`` the callback is handed ``L^T``: a factor that XLA keeps in
    # column-major layout (LAPACK's potrf output) then reaches it without a copy.
    arg = jnp.swapaxes(L, -1, -2) if transposed else L
    return jax.pure_callback(
        partial(_potri_host, upper=transposed),
        jax.ShapeDtypeStruct(L.shape, L.dtype),
        arg,
        vmap_method="broadcast_all",
    )


@partial(jax.custom_jvp, nondiff_argnums=(1,))
def _cho_inverse_host(L, transposed):
    return _potri_callback(L, transposed)


@_cho_inverse_host.defjvp
def _cho_inverse_host_jvp(transposed, primals, tangents):
    # With A = L L^T: d(A^-1) = -A^-1 dA A^-1 and dA = dL L^T + L dL^T. Written with JAX
    # operations, so the tangent is itself differentiable (hessians of the likelihood).
    (L,), (dL,) = primals, tangents
    inv = _cho_inverse_host(L, transposed)
    s = dL @ jnp.swapaxes(L, -1, -2)
    return inv, -(inv @ (s + jnp.swapaxes(s, -1, -2)) @ inv)


def cho_inverse_cpu(L, tiled, *, column_major=False):
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


def _chol_solve_host(K, r):
    """NumPy side: ``(L, alpha, quad, logdet, status)`` of ``K`` (lower triangle read).

    ``K`` is ``(..., n, n)`` in C order, ``r`` is ``(..., n)``. ``o.T`` is the Fortran
    view of ``K^T``, whose upper triangle is ``K``'s lower one: ``potrf(upper)`` on it
    gives ``U`` with ``U^T U = K``, stored where ``o`` keeps ``L = U^T`` (its lower
    triangle); ``clean`` zeroes the rest. ``L z = r`` and ``L^T alpha = z`` are solved on
    the same view. A failed factorization gives ``status = info`` (LAPACK's first failing
    pivot, 1-based) and NaN everywhere else.
    """
    from scipy.linalg import lapack

    K = np.asarray(K)
    r = np.asarray(r)
    f64 = K.dtype == np.float64
    potrf = lapack.dpotrf if f64 else lapack.spotrf
    trtrs = lapack.dtrtrs if f64 else lapack.strtrs
    batch = K.shape[:-2]
    L = np.empty(K.shape, K.dtype)
    alpha = np.empty(r.shape, K.dtype)
    quad = np.empty(batch, K.dtype)
    logdet = np.empty(batch, K.dtype)
    status = np.zeros(batch, np.int32)
    for idx in np.ndindex(batch):
        o = L[idx]
        o[...] = K[idx]
        U, info = potrf(o.T, lower=0, clean=1, overwrite_a=1)
        if info == 0 and not np.shares_memory(U, o):  # not expected: f2py copied
            o[...] = U.T
        if info != 0:
            o[...] = np.nan
            alpha[idx], quad[idx], logdet[idx] = np.nan, np.nan, np.nan
            status[idx] = max(int(info), 1)
            continue
        Uv = o.T
        z, _ = trtrs(Uv, r[idx], lower=0, trans=1)
        a, _ = trtrs(Uv, z, lower=0, trans=0)
        alpha[idx] = a
        quad[idx] = z @ z
        logdet[idx] = 2.0 * np.sum(np.log(np.diagonal(o)))
    return L, alpha, quad, logdet, status


def chol_solve_cpu(K, r):
    """``(L, alpha, quad, logdet, status)`` of ``K`` and ``r`` by LAPACK on the host.

    Used by the lean GP likelihood on the CPU: the factor comes back row-major (no
    relayout before LAPACK ``potri``) with LAPACK's own status, and ``K`` is not kept.
    Not differentiable by itself (the caller's custom rule differentiates around it).

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
    return jax.pure_callback(_chol_solve_host, out, K, r, vmap_method="broadcast_all")
