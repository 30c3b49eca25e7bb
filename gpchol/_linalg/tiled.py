"""gpchol's own tiled algorithms in JAX: the left-looking forward factorization (with
status) and the tiled inverse from a factor (``trtri`` + ``lauum``, LAPACK's ``potri``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from gpchol._linalg.blocks import blocks, diag_tiles, mT, potrf_tile, put, row_chunks, trsm
from gpchol._linalg.status import locate_failed_pivot, nan_where_failed


def potrf_tiled(a: jax.Array, nb: int) -> tuple[jax.Array, jax.Array]:
    """Left-looking tiled Cholesky in JAX, with status. Reads the lower triangle.

    Block step for columns ``j:k`` (LAPACK's ``potrf`` order): update the panel with the
    factor columns already computed, ``P = A[j:, j:k] - L[j:, :j] L[j:k, :j]^T`` (one
    GEMM), factor its diagonal tile (``potrf``), solve the rest of the panel (``trsm``)
    and write the panel back. Exactly ``n^3 / 3`` flops up to lower-order terms, and the
    work buffer is updated in place (only the panel is written at each step).

    Status: the input's diagonal tiles are kept (``n * nb`` numbers); if some tile
    failed, the exact first failing pivot is found afterwards by
    :func:`locate_failed_pivot`, under one ``lax.cond`` so it costs nothing when the
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
    status = lax.cond(
        jnp.any(failed),
        lambda ops: locate_failed_pivot(ops[0], ops[1], ops[2], starts, nb),
        lambda ops: jnp.zeros(batch, jnp.int32),
        (w, tiles0, jnp.argmin(ok, axis=-1)),
    )
    status = jnp.where(failed, status, 0).astype(jnp.int32)
    return nan_where_failed(jnp.tril(w), status), status


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
