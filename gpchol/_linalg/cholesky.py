"""The differentiable Cholesky factorization: forward passes, adjoint, status, jitter.

Public entry points are :func:`cholesky` and :func:`cholesky_with_status`. Both
symmetrize their input, ``A <- (A + A^T) / 2``, then call the private core
:func:`_chol`, whose derivative rules are:

* forward mode (JVP): ``dL = L Phi(L^-1 dA L^-T)``, with ``Phi(X)`` the lower triangle of
  ``X`` with its diagonal halved;
* reverse mode: the transpose of that linear map, computed by Murray's *blocked* adjoint
  (I. Murray, "Differentiation of the Cholesky decomposition", arXiv:1602.07527, 2016),
  about twice the flops of the forward factorization instead of the ~4 n^3 flops that
  transposing the JVP rule with two full triangular solves costs.

Both rules are attached with one mechanism: the JVP rule returns
``lax.custom_linear_solve(matvec, dA, solve=<JVP map>, transpose_solve=<Murray adjoint>)``,
so JAX differentiates forward with the JVP map and, when it transposes the linearized
program for reverse mode, calls the Murray adjoint. The only residual kept between the
passes is ``L``. Because ``matvec`` is the exact inverse map (``X -> L X^T + X L^T``),
higher-order derivatives (``jax.hessian``, ``jacfwd(jacrev)``) are correct too.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from gpchol._base.errors import NotPositiveDefiniteError
from gpchol._base.validate import as_float_array, check_square, check_tile_size, is_concrete

__all__ = ["cholesky", "cholesky_with_status"]

BACKENDS = ("auto", "xla", "tiled", "cuda")


# ----------------------------------------------------------------------------------------
# Small helpers (all batch-polymorphic over leading dimensions)
# ----------------------------------------------------------------------------------------


def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _phi(x):
    """Lower triangle of ``x`` with its diagonal halved: ``Phi(X)``."""
    n = x.shape[-1]
    return jnp.tril(x) - 0.5 * x * jnp.eye(n, dtype=x.dtype)


def _symmetrize(a):
    return 0.5 * (a + _mT(a))


def _trsm(a, b, *, left, lower=True, trans=False):
    """Triangular solve ``op(a) x = b`` (left) or ``x op(a) = b`` (right), batched.

    XLA's CPU triangular solve (LAPACK) wants column-major operands. Handed slices of a
    large row-major work buffer, XLA's layout assignment would relayout (copy) the whole
    buffer at every block step; so the solve is posed on the transposes, which are
    column-major views of the row-major slices: ``op(a) x = b  <=>  x^T op(a)^T = b^T``.
    ``lax.linalg.triangular_solve`` also needs equal batch dimensions, so ``a`` is
    broadcast to ``b``'s batch shape when they differ.
    """
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    xt = lax.linalg.triangular_solve(
        _mT(a), _mT(b), left_side=not left, lower=not lower, transpose_a=trans
    )
    return _mT(xt)


def _potrf_tile(t):
    """Cholesky of a symmetric tile (both triangles valid), posed on its transpose.

    Same layout reason as :func:`_trsm`: ``t^T`` is a column-major view of a row-major
    slice, and ``chol(t^T) = chol(t)`` for symmetric ``t``.
    """
    return lax.linalg.cholesky(_mT(t), symmetrize_input=False)


def _put(x, block, row, col):
    """``x`` with ``block`` written at ``[..., row:, col:]`` (an in-place update in XLA).

    ``x.at[...].set`` lowers to a scatter, which XLA on CPU may copy whole;
    ``dynamic_update_slice`` with static offsets is updated in place.
    """
    block = jnp.broadcast_to(block, x.shape[:-2] + block.shape[-2:]).astype(x.dtype)
    start = (0,) * (x.ndim - 2) + (row, col)
    return lax.dynamic_update_slice(x, block, start)


def default_tile_size(n: int, dtype) -> int:
    """Tile size used when the caller gives none.

    Large enough that the level-3 updates run near GEMM speed: at least 256 (float64) or
    384 (float32) rows, and a quarter of ``n`` above that, so the unrolled program has at
    most 4 block steps for n >= 1024 (compile time grows with the number of steps). On
    this project's 2-core CPU, at n = 4000 float64 with XLA's default threading, the
    tiled forward takes 1.31x the time of ``jax.lax.linalg.cholesky`` with tiles of 1000
    against 1.58x with tiles of 256 (1.10x either way on one thread), and the blocked
    adjoint is fastest there too.
    """
    base = 256 if np.dtype(dtype).itemsize == 8 else 384
    return max(base, -(-n // 4))


def _blocks(n: int, nb: int):
    return [(j, min(j + nb, n)) for j in range(0, n, nb)]


# ----------------------------------------------------------------------------------------
# Status: the 1-based index of the first failing pivot (LAPACK's info)
# ----------------------------------------------------------------------------------------


def _first_bad_pivot_unblocked(t):
    """First failing pivot (1-based) of the unblocked Cholesky of one ``(m, m)`` matrix.

    Right-looking, column by column, in a ``fori_loop``; used only on tiles known to
    fail, so its O(m^3) sequential cost is off the success path. Returns 0 if none fails.
    """
    m = t.shape[-1]
    idx = jnp.arange(m)

    def body(i, carry):
        w, bad = carry
        d = w[i, i]
        ok = d > 0  # False for NaN, too
        bad = jnp.where((bad == 0) & ~ok, i + 1, bad)
        s = jnp.sqrt(jnp.where(ok, d, 1.0))
        col = jnp.where(idx > i, w[:, i] / s, 0.0)
        w = w - col[:, None] * col[None, :]
        return w, bad

    _, bad = lax.fori_loop(0, m, body, (t, jnp.int32(0)))
    return bad


def _nan_where_failed(L, status):
    return jnp.where((status == 0)[..., None, None], L, jnp.nan)


# ----------------------------------------------------------------------------------------
# Forward passes
# ----------------------------------------------------------------------------------------


def _potrf_tiled(a, nb):
    """Left-looking tiled Cholesky in JAX, with status. Reads the lower triangle.

    Block step for columns ``j:k`` (LAPACK's ``potrf`` order): update the panel with the
    factor columns already computed, ``P = A[j:, j:k] - L[j:, :j] L[j:k, :j]^T`` (one
    GEMM), factor its diagonal tile (``potrf``), solve the rest of the panel (``trsm``)
    and write the panel back. Exactly ``n^3 / 3`` flops up to lower-order terms, and the
    work buffer is updated in place (only the panel is written at each step).

    Status: the input's diagonal tiles are kept (``n * nb`` numbers); if some tile
    failed, the exact first failing pivot is found afterwards by
    :func:`_locate_failed_pivot`, under one ``lax.cond`` so it costs nothing when the
    factorization succeeds. (A ``cond`` inside the loop would make XLA copy the whole work
    buffer at every step.)

    Args:
        a: ``(..., n, n)`` symmetric positive definite.
        nb: tile size.

    Returns:
        ``(L, status)``; ``L`` is NaN for a failed batch element.
    """
    n = a.shape[-1]
    batch = a.shape[:-2]
    blocks = _blocks(n, nb)
    starts = jnp.asarray([j for j, _ in blocks], jnp.int32)

    # The barrier makes XLA read the diagonal tiles out before ``w`` is updated in place.
    tiles0, w = lax.optimization_barrier((_diag_tiles(a, blocks, nb), a))
    oks = []
    for j, k in blocks:
        # The panel below the diagonal tile is updated and solved in row chunks: the
        # chunks are independent operations, which XLA's CPU runtime runs concurrently
        # (one GEMM + TRSM per chunk per thread) while the diagonal tile is factored.
        pieces = [(j, k)] + _row_chunks(k, n, nb)
        upd = []
        for r0, r1 in pieces:
            p = w[..., r0:r1, j:k]
            if j > 0:
                p = p - w[..., r0:r1, :j] @ _mT(w[..., j:k, :j])
            upd.append(p)
        d = _potrf_tile(upd[0])
        oks.append(jnp.all(jnp.isfinite(jnp.diagonal(d, axis1=-2, axis2=-1)), axis=-1))
        cols = [d] + [_trsm(d, p, left=False, trans=True) for p in upd[1:]]
        w = _put(w, jnp.concatenate(cols, axis=-2) if len(cols) > 1 else d, j, j)

    ok = jnp.stack(oks, axis=-1)  # (..., nblocks)
    failed = ~jnp.all(ok, axis=-1)
    status = lax.cond(
        jnp.any(failed),
        lambda ops: _locate_failed_pivot(*ops, starts, nb),
        lambda ops: jnp.zeros(batch, jnp.int32),
        (w, tiles0, jnp.argmin(ok, axis=-1)),
    )
    status = jnp.where(failed, status, 0).astype(jnp.int32)
    return _nan_where_failed(jnp.tril(w), status), status


def _row_chunks(start, n, nb, parts=2):
    """Rows ``start:n`` cut into at most ``parts`` chunks of at least ``nb`` rows."""
    m = n - start
    if m <= 0:
        return []
    p = max(1, min(parts, m // nb))
    size = -(-m // p)
    return [(r, min(r + size, n)) for r in range(start, n, size)]


def _diag_tiles(a, blocks, nb):
    """``(..., nblocks, nb, nb)`` diagonal tiles of ``a``, the last padded with identity."""
    out = []
    for j, k in blocks:
        t = a[..., j:k, j:k]
        pad = nb - (k - j)
        if pad:
            t = jnp.pad(t, [(0, 0)] * (a.ndim - 2) + [(0, pad), (0, pad)])
            t = t + jnp.diag(jnp.arange(nb) >= k - j).astype(t.dtype)
        out.append(t)
    return jnp.stack(out, axis=-3)


def _locate_failed_pivot(w, tiles0, first, starts, nb):
    """Exact first failing pivot after a failed tiled factorization (slow path).

    For the first failed block ``j:j+nb`` of each batch element, its Schur complement is
    rebuilt from the input's diagonal tile and the (intact, finite) factor rows to its
    left, ``S = A_jj - L[j:k, :j] L[j:k, :j]^T``, and searched by
    :func:`_first_bad_pivot_unblocked`. A block whose LAPACK factor failed but whose search does not
    (a float32 rounding corner) still reports its first pivot rather than success.
    """
    n = w.shape[-1]
    npad = tiles0.shape[-3] * nb
    batch = w.shape[:-2]

    def one(wb, tb, fb):
        start = starts[fb]
        wp = jnp.pad(wb, [(0, npad - n), (0, 0)])
        rows = lax.dynamic_slice_in_dim(wp, start, nb, axis=0)
        rows = jnp.where(jnp.arange(n) < start, rows, 0.0)
        schur = tb[fb] - rows @ rows.T
        return start + jnp.maximum(_first_bad_pivot_unblocked(schur), 1)

    flat = jax.vmap(one)(
        w.reshape((-1, n, n)),
        tiles0.reshape((-1,) + tiles0.shape[-3:]),
        first.reshape(-1),
    )
    return flat.reshape(batch)


def _np_first_bad_pivot(m, nb):
    """First failing pivot (1-based) of the Cholesky of one NumPy matrix; 0 if none.

    Blocked, in NumPy, on the host: each diagonal tile is factored with
    ``np.linalg.cholesky``; the first tile that fails is searched column by column.
    """
    w = np.array(m, dtype=np.float64, copy=True)
    n = w.shape[-1]
    for j, k in _blocks(n, nb):
        tile = w[j:k, j:k]
        try:
            d = np.linalg.cholesky(tile)
            if not np.all(np.isfinite(np.diagonal(d))):
                raise np.linalg.LinAlgError
        except np.linalg.LinAlgError:
            t = tile.copy()
            for i in range(k - j):
                if not t[i, i] > 0:
                    return j + i + 1
                col = t[i + 1 :, i] / np.sqrt(t[i, i])
                t[i + 1 :, i + 1 :] -= np.outer(col, col)
            return j + 1  # LAPACK failed where the search did not (rounding corner)
        if k < n:
            c = np.linalg.solve(d, w[k:, j:k].T).T  # panel: A[k:, j:k] D^-T
            w[k:, k:] -= c @ c.T
    return 0


def _host_pivot_search(a, nb, failed):
    """Exact first failing pivot of each matrix in ``a``, computed on the host (slow path).

    Called through ``jax.pure_callback`` only when a factorization failed, so that the
    search adds no device memory or compile time to the factorization itself. ``failed``
    (``a.shape[:-2]`` booleans) says which matrices to search; the others get 0 without
    any work (under ``vmap`` the call's ``lax.cond`` becomes a ``select`` and runs for
    every batch element).
    """

    def search(x, f):
        x, f = np.asarray(x), np.broadcast_to(np.asarray(f), x.shape[:-2])
        out = np.zeros(x.shape[:-2], np.int32)
        for idx in np.ndindex(out.shape):
            if f[idx]:
                out[idx] = _np_first_bad_pivot(x[idx], nb)
        return out

    return jax.pure_callback(
        search,
        jax.ShapeDtypeStruct(a.shape[:-2], jnp.int32),
        a,
        failed,
        vmap_method="expand_dims",
    )


def _exact_status(failed, rebuild, nb):
    """LAPACK-style status: the exact first failing pivot where ``failed`` (0 elsewhere).

    The pivot is searched on the host (:func:`_host_pivot_search`) in the matrices
    ``rebuild()`` returns, only when some element failed; ``rebuild`` lets a caller that
    factored its matrix in place recompute it for this rare case instead of keeping it.
    Every factorization path reports its status through here, so they all agree.
    """
    status = lax.cond(
        jnp.any(failed),
        lambda: _host_pivot_search(rebuild(), nb, failed),
        lambda: jnp.zeros(failed.shape, jnp.int32),
    )
    return jnp.where(failed, jnp.maximum(status, 1), 0).astype(jnp.int32)


def _potrf_xla(a, nb):
    """``jax.lax.linalg.cholesky`` (LAPACK on CPU, cuSOLVER on GPU), with exact status.

    XLA reports failure as an all-NaN factor; the pivot is then located on the host by
    :func:`_host_pivot_search` (only when some batch element failed).
    """
    L = lax.linalg.cholesky(a, symmetrize_input=False)
    failed = ~jnp.all(jnp.isfinite(jnp.diagonal(L, axis1=-2, axis2=-1)), axis=-1)
    status = _exact_status(failed, lambda: a, nb)
    # XLA's failed factor is NaN in its lower triangle only; make the whole matrix NaN,
    # like the other backends.
    return _nan_where_failed(L, status), status


def _potrf_cuda(a, nb):
    from gpchol._cuda import ffi as _ffi

    return _ffi.potrf(a, tile_size=nb)


_FORWARD = {"xla": _potrf_xla, "tiled": _potrf_tiled, "cuda": _potrf_cuda}


# ----------------------------------------------------------------------------------------
# Derivative maps
# ----------------------------------------------------------------------------------------


def _chol_tangent(L, a_dot):
    """Forward-mode map ``dA -> L Phi(L^-1 dA L^-T)`` (``dA`` symmetric)."""
    x = _trsm(L, a_dot, left=True)
    x = _trsm(L, x, left=False, trans=True)
    return L @ _phi(x)


def _chol_rev_symbolic(L, Lbar):
    """Murray's symbolic reverse step on one block, in his lower-triangular convention.

    ``P = Phi(L^T Lbar)``; ``Abar = Phi(L^-T (P + P^T) L^-1)``. The symmetric gradient is
    ``(Abar + Abar^T) / 2``.
    """
    P = _phi(_mT(L) @ jnp.tril(Lbar))
    S = P + _mT(P)
    S = _trsm(L, S, left=True, trans=True)
    S = _trsm(L, S, left=False)
    return _phi(S)


def _chol_rev_blocked(L, Lbar, nb):
    """Murray's blocked (level-3) Cholesky adjoint, lower-triangular convention.

    Walks block columns ``j:k`` from the last to the first with, for the factor,
    ``R = L[j:k, :j]``, ``D = L[j:k, j:k]``, ``B = L[k:, :j]``, ``C = L[k:, j:k]`` and the
    same names barred for the gradient being accumulated (Murray 2016, Sec. 3.2,
    "blocked algorithm")::

        Cbar <- Cbar D^-1                        (TRSM)
        Bbar <- Bbar - Cbar R                    (GEMM)
        Dbar <- tril(Dbar) - tril(Cbar^T C)
        Dbar <- symbolic reverse on D            (_chol_rev_symbolic)
        Rbar <- Rbar - Cbar^T B - (Dbar + Dbar^T) R

    About ``2 n^3 / 3`` flops: twice the forward factorization.

    Args:
        L: ``(..., n, n)`` lower Cholesky factor.
        Lbar: ``(..., n, n)`` cotangent of ``L``; its strict upper triangle is ignored.
        nb: block size.

    Returns:
        ``(..., n, n)`` lower-triangular ``Abar`` (Murray's convention).
    """
    n = L.shape[-1]
    g = jnp.tril(Lbar)
    for j, k in reversed(_blocks(n, nb)):
        # Every read of ``g`` is of its newest version: a slice of an older version that is
        # still live after an in-place update makes XLA copy the whole buffer.
        D = L[..., j:k, j:k]
        if k < n:
            C = L[..., k:, j:k]
            Cb = _trsm(D, g[..., k:, j:k], left=False)
            g = _put(g, Cb, k, j)
            if j > 0:
                g = _put(g, g[..., k:, :j] - Cb @ L[..., j:k, :j], k, 0)
            Db = jnp.tril(g[..., j:k, j:k]) - jnp.tril(_mT(Cb) @ C)
        else:
            Db = g[..., j:k, j:k]
        Db = _chol_rev_symbolic(D, Db)
        g = _put(g, Db, j, j)
        if j > 0:
            R = L[..., j:k, :j]
            upd = (Db + _mT(Db)) @ R
            if k < n:
                upd = upd + _mT(g[..., k:, j:k]) @ L[..., k:, :j]
            g = _put(g, g[..., j:k, :j] - upd, j, 0)
    return g


def _chol_adjoint(L, Lbar, backend, nb):
    """Symmetric gradient ``dF/dA`` (the convention of ``jnp.linalg.cholesky``)."""
    if backend == "cuda":
        from gpchol._cuda import ffi as _ffi

        return _ffi.potrf_adjoint(L, Lbar, tile_size=nb)
    g = _chol_rev_blocked(L, Lbar, nb)
    return 0.5 * (g + _mT(g))


# ----------------------------------------------------------------------------------------
# The differentiable core
# ----------------------------------------------------------------------------------------


@partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _chol(a, backend, nb):
    """``(L, status)`` of a symmetric ``a`` (lower triangle read); differentiable in ``a``."""
    if a.shape[-1] == 0:
        return a, jnp.zeros(a.shape[:-2], jnp.int32)
    return _FORWARD[backend](a, nb)


@_chol.defjvp
def _chol_jvp(backend, nb, primals, tangents):
    (a,), (a_dot,) = primals, tangents
    L, status = _chol(a, backend, nb)
    if a.shape[-1] == 0:
        return (L, status), (jnp.zeros_like(L), np.zeros(status.shape, jax.dtypes.float0))

    L_dot = _linear_chol_tangent(L, a_dot, backend, nb)
    return (L, status), (L_dot, np.zeros(status.shape, jax.dtypes.float0))


def _linear_chol_tangent(L, a_dot, backend, nb):
    """``dL`` for ``dA = a_dot`` as a linear map JAX can transpose into Murray's adjoint.

    The tangent map and its transpose, attached through custom_linear_solve:
      matvec          X  -> L X^T + X L^T          (dL -> dA, the exact inverse map)
      solve           dA -> L Phi(L^-1 dA L^-T)    (forward mode)
      transpose_solve Lb -> Murray's blocked adjoint (reverse mode)
    """

    def matvec(x):
        s = L @ _mT(x)  # written so that only L (not also L^T) becomes a residual
        return s + _mT(s)

    def solve(_, b):
        return _chol_tangent(L, b)

    def transpose_solve(_, lbar):
        return _chol_adjoint(L, lbar, backend, nb)

    return lax.custom_linear_solve(matvec, a_dot, solve, transpose_solve)


# ----------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------


def _cuda_reason():
    from gpchol._cuda import ffi as _ffi

    return _ffi.cuda_unavailable_reason()


def _array_platform(a) -> str:
    """Platform of a concrete array, else of the default backend (inside ``jit``)."""
    try:
        devs = a.devices()
        return next(iter(devs)).platform
    except Exception:
        return jax.default_backend()


def resolve_backend(backend: str, a) -> str:
    """Map a user's backend choice to a concrete forward implementation."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}.")
    platform = _array_platform(a)
    if backend == "cuda":
        if platform != "gpu":
            raise ValueError(
                "backend='cuda' needs the input on an NVIDIA GPU; this array is on "
                f"'{platform}'. Use backend='auto', 'xla' or 'tiled'."
            )
        reason = _cuda_reason()
        if reason is not None:
            raise RuntimeError(f"backend='cuda' is unavailable: {reason}")
        return "cuda"
    if backend == "auto":
        if platform == "gpu":
            return "cuda" if _cuda_reason() is None else "xla"
        return "xla"
    return backend


def _prepare(a, tile_size, backend, name="a"):
    """Validate ``a``; return ``(a, tile_size, backend)`` with both resolved.

    For the CUDA backend a tile size the user did not give stays ``None``: the kernels then
    pick their own (one cuSOLVER call for the forward pass, a GPU-sized adjoint block).
    """
    a = as_float_array(a, name)
    check_square(a, name)
    nb = check_tile_size(tile_size)
    be = resolve_backend(backend, a)
    n = a.shape[-1]
    if nb is None:
        if be == "cuda":
            return a, None, be
        nb = default_tile_size(n, a.dtype)
    return a, max(1, min(nb, max(n, 1))), be


def _normalize_jitter(jitter):
    if jitter is None:
        return None
    values = tuple(jitter) if isinstance(jitter, (tuple, list)) else (jitter,)
    if not values:
        raise ValueError("jitter must be a float or a non-empty tuple of floats.")
    out = []
    for v in values:
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise TypeError(f"jitter values must be real numbers; got {v!r}.") from None
        if not math.isfinite(f) or f < 0:
            raise ValueError(f"jitter values must be finite and >= 0; got {v!r}.")
        out.append(f)
    return tuple(out)


def _factor_with_jitter(a, backend, nb, jitter):
    """Try ``a + j I`` for each ``j`` in ``jitter`` in order; keep the first that succeeds.

    Returns ``(L, status, jitter_used)``. With several batch elements each keeps its own
    first successful jitter. Differentiable (a chain of ``lax.cond`` / ``where``).
    """
    n = a.shape[-1]
    eye = jnp.eye(n, dtype=a.dtype)
    j0 = jnp.asarray(jitter[0], a.dtype)
    L, status = _chol(a + j0 * eye, backend, nb)
    used = jnp.full(a.shape[:-2], j0)
    for jv in jitter[1:]:
        jv = jnp.asarray(jv, a.dtype)

        def retry(carry, jv=jv):
            L0, s0, u0 = carry
            L1, s1 = _chol(a + jv * eye, backend, nb)
            redo = s0 != 0
            return (
                jnp.where(redo[..., None, None], L1, L0),
                jnp.where(redo, s1, s0),
                jnp.where(redo, jv, u0),
            )

        L, status, used = lax.cond(jnp.any(status != 0), retry, lambda c: c, (L, status, used))
    return L, status, used


def cholesky_with_status(a, *, tile_size=None, backend="auto", jitter=None):
    r"""Cholesky factor and LAPACK-style status, usable inside ``jit``.

    Computes the lower-triangular ``L`` with ``L L^T = (A + A^T) / 2``. Differentiable in
    forward and reverse mode with respect to ``a`` (see :func:`cholesky`).

    Args:
        a: ``(..., n, n)`` float32 or float64 symmetric positive-definite matrices.
        tile_size: block size of the tiled forward pass and of the blocked adjoint;
            default depends on ``n`` and the dtype.
        backend: ``"auto"``, ``"xla"`` (``jax.lax.linalg.cholesky`` forward),
            ``"tiled"`` (gpchol's own blocked forward in JAX) or ``"cuda"`` (gpchol's CUDA
            kernels; needs a GPU and the built ``kernels_cuda`` library).
        jitter: ``None``, a float, or a tuple of floats tried in order: the factor of
            ``A + jitter * I`` for the first value that succeeds is returned. Never applied
            unless asked for.

    Returns:
        ``(L, status)`` where ``L`` has shape ``(..., n, n)`` and ``status`` is int32 of
        shape ``(...)``: 0 on success, else the 1-based index of the first failing pivot.
        A failed factor is all NaN. With ``jitter`` given, returns
        ``(L, status, jitter_used)`` where ``jitter_used`` (shape ``(...)``) is the value
        kept (the last one tried if all failed).

    Example:
        >>> import jax.numpy as jnp, gpchol
        >>> L, status = gpchol.cholesky_with_status(jnp.array([[4.0, 2.0], [2.0, 3.0]]))
        >>> L.tolist(), int(status)
        ([[2.0, 0.0], [1.0, 1.4142135381698608]], 0)
    """
    if jitter is None and backend == "auto":
        # A matrix sharded over a mesh takes the distributed path (gpchol.distributed);
        # imported here because gpchol.distributed builds on this module.
        from gpchol._routing import maybe_sharded_cholesky

        out = maybe_sharded_cholesky(a, tile_size)
        if out is not None:
            return out
    a, nb, be = _prepare(a, tile_size, backend)
    jitter = _normalize_jitter(jitter)
    a = _symmetrize(a)
    if jitter is None:
        return _chol(a, be, nb)
    return _factor_with_jitter(a, be, nb, jitter)


def cholesky(a, *, tile_size=None, backend="auto", check=False, jitter=None):
    r"""Lower Cholesky factor ``L`` with ``L L^T = (A + A^T) / 2``, differentiable.

    The reverse-mode derivative is Murray's blocked adjoint (about twice the forward
    flops), keeping only ``L`` between the passes; forward mode uses
    ``dL = L Phi(L^-1 dA L^-T)``. The gradient is the symmetric one, equal to what
    ``jax.grad`` gives through ``jnp.linalg.cholesky``.

    Args:
        a: ``(..., n, n)`` float32 or float64 symmetric positive-definite matrices.
        tile_size: block size (see :func:`cholesky_with_status`).
        backend: ``"auto"``, ``"xla"``, ``"tiled"`` or ``"cuda"``.
        check: if True, raise :class:`gpchol.NotPositiveDefiniteError` when a matrix is
            not positive definite. Needs concrete values: inside ``jit`` use
            :func:`cholesky_with_status` instead.
        jitter: ``None``, a float or a tuple of floats tried in order (see
            :func:`cholesky_with_status`).

    Returns:
        ``(..., n, n)`` lower-triangular factor; NaN where the factorization failed
        (unless ``check=True``, which raises instead).

    Example:
        >>> import jax.numpy as jnp, gpchol
        >>> a = jnp.array([[4.0, 2.0], [2.0, 3.0]])
        >>> L = gpchol.cholesky(a)
        >>> bool(jnp.allclose(L @ L.T, a))
        True
    """
    if check and not is_concrete(a):
        raise ValueError(
            "cholesky(..., check=True) needs concrete values and cannot run inside "
            "jax.jit/vmap/grad tracing. Inside jit use `L, status = "
            "gpchol.cholesky_with_status(a)` and test `status == 0` (0 = success, else the "
            "1-based index of the first failing pivot)."
        )
    out = cholesky_with_status(a, tile_size=tile_size, backend=backend, jitter=jitter)
    L, status = out[0], out[1]
    if check:
        _raise_if_failed(a, status, _normalize_jitter(jitter))
    return L


def _raise_if_failed(a, status, jitter):
    status = np.asarray(status)
    if not np.any(status != 0):
        return
    bad = np.argwhere(status != 0)
    index = tuple(int(i) for i in bad[0]) if status.ndim else ()
    pivot = int(status[index]) if status.ndim else int(status)
    a_el = np.asarray(a)[index] if index else np.asarray(a)
    diag = np.diagonal(a_el)
    min_diag = float(np.min(diag)) if diag.size else float("nan")
    where = f" (batch element {index}, {bad.shape[0]} failed in all)" if index else ""
    tried = f" after trying jitter {jitter}" if jitter else ""
    hint = (
        "try a larger jitter, e.g. jitter=(1e-6, 1e-4, 1e-2) scaled to your matrix"
        if jitter
        else "add explicit jitter, e.g. `gpchol.cholesky(a, jitter=(1e-8, 1e-6, 1e-4))`"
    )
    raise NotPositiveDefiniteError(
        f"matrix is not positive definite{where}{tried}: the leading minor of order "
        f"{pivot} is not positive definite (pivot {pivot}, 1-based); the smallest diagonal "
        f"entry of the input is {min_diag:.6g}. Check for NaN/inf or duplicated inputs, "
        f"use float64, or {hint}.",
        pivot=pivot,
        batch_index=index,
        min_diagonal=min_diag,
        jitter=jitter or (),
    )
