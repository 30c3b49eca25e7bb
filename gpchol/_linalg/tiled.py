"""gpchol's own tiled algorithms in JAX: the left-looking forward factorization (with
status) and the tiled inverse from a factor (``trtri`` + ``lauum``, LAPACK's ``potri``)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from gpchol._linalg.blocks import (
    blocks,
    diag_tiles,
    first_bad_pivot_unblocked,
    mT,
    nan_where_failed,
    potrf_tile,
    put,
    row_chunks,
    trsm,
)


def locate_failed_pivot(
    w: jax.Array, tiles0: jax.Array, first: jax.Array, starts: jax.Array, nb: int
) -> jax.Array:
    """Exact first failing pivot after a failed tiled factorization (slow path).

    For the first failed block ``j:j+nb`` of each batch element, its Schur complement is
    rebuilt from the input's diagonal tile and the (intact, finite) factor rows to its
    left, ``S = A_jj - L[j:k, :j] L[j:k, :j]^T``, and searched by
    :func:`first_bad_pivot_unblocked`. A block whose LAPACK factor failed but whose search does not
    (a float32 rounding corner) still reports its first pivot rather than success.
    """
    n = w.shape[-1]
    npad = tiles0.shape[-3] * nb
    batch = w.shape[:-2]

    def one(wb: jax.Array, tb: jax.Array, fb: jax.Array) -> jax.Array:
        start = starts[fb]
        wp = jnp.pad(wb, [(0, npad - n), (0, 0)])
        rows = lax.dynamic_slice_in_dim(wp, start, nb, axis=0)
        rows = jnp.where(jnp.arange(n) < start, rows, 0.0)
        schur = tb[fb] - rows @ rows.T
        return start + jnp.maximum(first_bad_pivot_unblocked(schur), 1)

    flat = jax.vmap(one)(
        w.reshape((-1, n, n)),
        tiles0.reshape((-1,) + tiles0.shape[-3:]),
        first.reshape(-1),
    )
    return flat.reshape(batch)


def tiled_factor(
    a: jax.Array, nb: int
) -> tuple[jax.Array, jax.Array, Callable[[], jax.Array], jax.Array]:
    """Left-looking tiled Cholesky in JAX, without the status. Reads the lower triangle.

    Block step for columns ``j:k`` (LAPACK's ``potrf`` order): update the panel with the
    factor columns already computed, ``P = A[j:, j:k] - L[j:, :j] L[j:k, :j]^T`` (one
    GEMM), factor its diagonal tile (``potrf``), solve the rest of the panel (``trsm``)
    and write the panel back. Exactly ``n^3 / 3`` flops up to lower-order terms, and the
    work buffer is updated in place (only the panel is written at each step).

    Args:
        a: ``(..., n, n)`` symmetric positive definite.
        nb: tile size.

    Returns:
        ``(W, failed, locate, diag)``: the lower factor (NaN from a failed tile on), booleans
        ``(...)`` saying which matrices had a tile fail, and ``locate()``, which gives the
        first failing pivot in XLA operations (:func:`locate_failed_pivot`, under one
        ``lax.cond``: free when nothing failed). The input's diagonal tiles are kept for
        it (``n * nb`` numbers); a ``cond`` inside the loop would make XLA copy the whole
        work buffer at every step. ``diag`` ``(..., n)`` is the input's diagonal, read
        from those tiles (``a`` itself is not read after the factorization, so ``W`` can
        be ``a``'s own buffer).
    """
    n = a.shape[-1]
    batch = a.shape[:-2]
    parts = blocks(n, nb)
    starts = jnp.asarray([j for j, _ in parts], jnp.int32)

    # The barrier makes XLA read the diagonal tiles out before ``w`` is updated in place.
    tiles0, w = lax.optimization_barrier((diag_tiles(a, parts, nb), a))
    oks = []
    for j, k in parts:
        # The panel below the diagonal tile is updated and solved in row chunks: the
        # chunks are independent operations, which XLA's CPU runtime runs concurrently
        # (one GEMM + TRSM per chunk per thread) while the diagonal tile is factored.
        pieces = [(j, k)] + row_chunks(k, n, nb)
        upd = []
        for r0, r1 in pieces:
            p = w[..., r0:r1, j:k]
            if j > 0:
                p = p - w[..., r0:r1, :j] @ mT(w[..., j:k, :j])
            upd.append(p)
        d = potrf_tile(upd[0])
        oks.append(jnp.all(jnp.isfinite(jnp.diagonal(d, axis1=-2, axis2=-1)), axis=-1))
        cols = [d] + [trsm(d, p, left=False, trans=True) for p in upd[1:]]
        w = put(w, jnp.concatenate(cols, axis=-2) if len(cols) > 1 else d, j, j)

    ok = jnp.stack(oks, axis=-1)  # (..., nblocks)
    failed = ~jnp.all(ok, axis=-1)

    def locate() -> jax.Array:
        status = lax.cond(
            jnp.any(failed),
            lambda ops: locate_failed_pivot(ops[0], ops[1], ops[2], starts, nb),
            lambda ops: jnp.zeros(batch, jnp.int32),
            (w, tiles0, jnp.argmin(ok, axis=-1)),
        )
        return jnp.where(failed, status, 0).astype(jnp.int32)

    npad = len(parts) * nb
    diag = jnp.diagonal(tiles0, axis1=-2, axis2=-1).reshape(batch + (npad,))[..., :n]
    return jnp.tril(w), failed, locate, diag


def potrf_tiled(a: jax.Array, nb: int) -> tuple[jax.Array, jax.Array]:
    """``(L, status)`` by :func:`tiled_factor` with its status found in XLA operations.

    The status search of platforms without gpchol's compiled CPU handlers (the GPU): the
    first failing pivot in the working precision, by this blocking. ``L`` is NaN for a
    failed batch element.
    """
    W, _, locate, _ = tiled_factor(a, nb)
    status = locate()
    return nan_where_failed(W, status), status


def trtri_blocked(L: jax.Array, nb: int) -> jax.Array:
    """``L^-1`` for lower-triangular ``L`` by blocks from the last to the first.

    For block column ``j:k``: ``W_jj = L_jj^-1``; ``W[k:, j:k] = -W[k:, k:] L[k:, j:k]
    W_jj``. About ``n^3 / 3`` useful flops (the GEMM runs on the full trailing block).
    """
    n = L.shape[-1]
    w = jnp.zeros_like(L)
    for j, k in reversed(blocks(n, nb)):
        eye = jnp.broadcast_to(jnp.eye(k - j, dtype=L.dtype), L.shape[:-2] + (k - j, k - j))
        wjj = trsm(L[..., j:k, j:k], eye, left=True)
        w = put(w, wjj, j, j)
        if k < n:
            panel = -(w[..., k:, k:] @ L[..., k:, j:k]) @ wjj
            w = put(w, panel, k, j)
    return w


def lauum_lower(W: jax.Array, nb: int) -> jax.Array:
    """``W^T W`` for lower-triangular ``W``, lower block columns computed, then mirrored."""
    n = W.shape[-1]
    out = jnp.zeros_like(W)
    for j, k in blocks(n, nb):
        col = mT(W[..., j:, j:]) @ W[..., j:, j:k]  # rows j:, cols j:k of W^T W
        out = put(out, col, j, j)
    low = jnp.tril(out)
    return low + mT(jnp.tril(low, -1))


def cho_inverse_tiled(L: jax.Array, nb: int) -> jax.Array:
    return lauum_lower(trtri_blocked(L, nb), nb)
