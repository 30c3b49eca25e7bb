"""Block helpers shared by the one-device algorithms (all batch-polymorphic over leading
dimensions): transposes, ``Phi``, layout-aware triangular solves, in-place block writes,
the block partition, the default tile size, and the unblocked pivot search of one tile."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import DTypeLike

from gpchol._linalg.triangular import cholesky
from gpchol._linalg.triangular import mT as mT  # the block helpers' home re-exports them
from gpchol._linalg.triangular import phi as phi
from gpchol._linalg.triangular import trsm as trsm


def symmetrize(a: jax.Array) -> jax.Array:
    """``(a + a^T) / 2``: linear (the tangents' projection onto symmetric matrices)."""
    return 0.5 * (a + mT(a))


@jax.custom_jvp
def symmetric_part(a: jax.Array) -> jax.Array:
    """``(a + a^T) / 2`` of an input matrix, without overflow: ``a`` itself where it is
    symmetric (infinities included), ``a + (a^T - a) / 2`` elsewhere. ``a + a^T`` overflows
    for entries above half the dtype's largest number (a finite SPD matrix factored to inf
    with status 0), and XLA folds ``a/2 + a^T/2`` back into it. Its derivative is
    :func:`symmetrize` of the tangent."""
    t = mT(a)
    return jnp.where(a == t, a, a + 0.5 * (t - a))


@symmetric_part.defjvp
def _symmetric_part_jvp(
    primals: tuple[jax.Array], tangents: tuple[jax.Array]
) -> tuple[jax.Array, jax.Array]:
    return symmetric_part(primals[0]), symmetrize(tangents[0])


def potrf_tile(t: jax.Array) -> jax.Array:
    """Cholesky of a symmetric tile (both triangles valid), posed on its transpose.

    Same layout reason as :func:`trsm`: ``t^T`` is a column-major view of a row-major
    slice, and ``chol(t^T) = chol(t)`` for symmetric ``t``.
    """
    return cholesky(mT(t))


def put(x: jax.Array, block: jax.Array, row: int, col: int) -> jax.Array:
    """``x`` with ``block`` written at ``[..., row:, col:]`` (an in-place update in XLA).

    ``x.at[...].set`` lowers to a scatter, which XLA on CPU may copy whole;
    ``dynamic_update_slice`` with static offsets is updated in place.
    """
    block = jnp.broadcast_to(block, x.shape[:-2] + block.shape[-2:]).astype(x.dtype)
    start = (0,) * (x.ndim - 2) + (row, col)
    return lax.dynamic_update_slice(x, block, start)


def default_tile_size(n: int, dtype: DTypeLike) -> int:
    """Tile size used when the caller gives none.

    Large enough that the level-3 updates run near GEMM speed: at least 256 (float64) or
    384 (float32) rows, and a quarter of ``n`` above that, so the unrolled program has at
    most 4 block steps for n >= 1024 (compile time grows with the number of steps).
    Large tiles are faster for the forward and the adjoint
    (``benchmarks/results/design-measurements.md``).
    """
    base = 256 if np.dtype(dtype).itemsize == 8 else 384
    return max(base, -(-n // 4))


def blocks(n: int, nb: int) -> list[tuple[int, int]]:
    return [(j, min(j + nb, n)) for j in range(0, n, nb)]


def row_chunks(start: int, n: int, nb: int, parts: int = 2) -> list[tuple[int, int]]:
    """Rows ``start:n`` cut into at most ``parts`` chunks of at least ``nb`` rows."""
    m = n - start
    if m <= 0:
        return []
    p = max(1, min(parts, m // nb))
    size = -(-m // p)
    return [(r, min(r + size, n)) for r in range(start, n, size)]


def diag_tiles(a: jax.Array, blocks: list[tuple[int, int]], nb: int) -> jax.Array:
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


def first_bad_pivot_unblocked(t: jax.Array) -> jax.Array:
    """First failing pivot (1-based) of the unblocked Cholesky of one ``(m, m)`` matrix.

    Right-looking, column by column, in a ``fori_loop``; used only on tiles known to
    fail, so its O(m^3) sequential cost is off the success path. Returns 0 if none fails.
    """
    m = t.shape[-1]
    idx = jnp.arange(m)

    def body(i: jax.Array, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
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


def nan_where_failed(L: jax.Array, status: jax.Array) -> jax.Array:
    return jnp.where((status == 0)[..., None, None], L, jnp.nan)
