"""Per-device layout changes: padding, and contiguous blocks <-> 2D block-cyclic tiles.

The public sharding ``P(row_axis, col_axis)`` gives device ``(pr, pc)`` a contiguous
``(n/Pr, n/Pc)`` block. Padding is done per device: ``n`` is cut into ``Lc = lcm(Pr, Pc)``
segments of ``seg = n / Lc`` indices and every segment is padded to ``sp = q*T`` (rows
and columns alike), with 1 on the padded diagonal and 0 elsewhere. The padded matrix is a
symmetric permutation of ``blockdiag(A, I)``, so its factor is ``L`` with the same
identity rows inserted, and no data has to move between devices to pad or unpad.

Going from contiguous tile rows to cyclic tile rows (tile ``I`` on process row
``I % Pr``) is a permutation of tile rows among the devices of one process column: one
``all_to_all`` over the row axis (and likewise for columns over the column axis), with
static send/receive tables indexed by the device's position. No device ever holds more
than its own block plus one send and one receive buffer of about the same size.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from gpchol.distributed._local import Grid, record


@dataclasses.dataclass(frozen=True)
class Padding:
    """How an ``n x n`` matrix is padded on a grid: ``Lc`` segments of ``seg`` -> ``sp``."""

    n: int
    Lc: int
    seg: int
    sp: int

    @property
    def N(self) -> int:
        return self.Lc * self.sp


def make_grid(
    n: int, T: int, Pr: int, Pc: int, row_axis: str | None, col_axis: str | None
) -> tuple[Grid, Padding]:
    """``(Grid, Padding)`` for an ``n x n`` matrix (``n`` divisible by lcm(Pr, Pc))."""
    Lc = math.lcm(Pr, Pc)
    seg = n // Lc
    q = -(-seg // T)
    pad = Padding(n=n, Lc=Lc, seg=seg, sp=q * T)
    grid = Grid(Pr=Pr, Pc=Pc, nt=Lc * q, T=T, row_axis=row_axis, col_axis=col_axis)
    return grid, pad


def _pad_axis(x: jax.Array, axis: int, nseg: int, seg: int, sp: int) -> jax.Array:
    if sp == seg:
        return x
    shape = x.shape
    x = x.reshape(shape[:axis] + (nseg, seg) + shape[axis + 1 :])
    widths = [(0, 0)] * x.ndim
    widths[axis + 1] = (0, sp - seg)
    x = jnp.pad(x, widths)
    return x.reshape(shape[:axis] + (nseg * sp,) + shape[axis + 1 :])


def _unpad_axis(x: jax.Array, axis: int, nseg: int, seg: int, sp: int) -> jax.Array:
    if sp == seg:
        return x
    shape = x.shape
    x = x.reshape(shape[:axis] + (nseg, sp) + shape[axis + 1 :])
    x = lax.slice_in_dim(x, 0, seg, axis=axis + 1)
    return x.reshape(shape[:axis] + (nseg * seg,) + shape[axis + 1 :])


def _padded_real(p: Padding, nseg: int, start_seg: jax.Array | int) -> tuple[jax.Array, jax.Array]:
    """Global padded indices and 'is a real index' flags of a local padded range."""
    loc = jnp.arange(nseg * p.sp)
    return start_seg * p.sp + loc, (loc % p.sp) < p.seg


def pad_block(
    g: Grid,
    p: Padding,
    x: jax.Array,
    pr: jax.Array | int,
    pc: jax.Array | int,
    diag_value: float = 1.0,
) -> jax.Array:
    """Pad the local ``(n/Pr, n/Pc)`` block; the padded diagonal gets ``diag_value``."""
    if p.sp == p.seg:
        return x
    rs, cs = p.Lc // g.Pr, p.Lc // g.Pc
    x = _pad_axis(_pad_axis(x, 0, rs, p.seg, p.sp), 1, cs, p.seg, p.sp)
    gr, real_r = _padded_real(p, rs, pr * rs)
    gc, _ = _padded_real(p, cs, pc * cs)
    on = (gr[:, None] == gc[None, :]) & ~real_r[:, None]
    return jnp.where(on, jnp.asarray(diag_value, x.dtype), x)


def unpad_block(g: Grid, p: Padding, x: jax.Array) -> jax.Array:
    rs, cs = p.Lc // g.Pr, p.Lc // g.Pc
    return _unpad_axis(_unpad_axis(x, 0, rs, p.seg, p.sp), 1, cs, p.seg, p.sp)


def pad_vector(p: Padding, b: jax.Array) -> jax.Array:
    """Pad a replicated ``(n, r)`` right-hand side to ``(N, r)`` (zeros)."""
    return _pad_axis(b, 0, p.Lc, p.seg, p.sp)


def unpad_vector(p: Padding, x: jax.Array) -> jax.Array:
    return _unpad_axis(x, 0, p.Lc, p.seg, p.sp)


# ----------------------------------------------------------------------------------------
# Permutations of tile rows among the devices of one mesh axis
# ----------------------------------------------------------------------------------------


def _tables(
    P: int, m: int, dest: Callable[[int, int], tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """Static send/gather tables for a permutation ``(p, i) -> (q, j)`` of units."""
    groups: list[list[list[tuple[int, int]]]] = [[[] for _ in range(P)] for _ in range(P)]
    for p in range(P):
        for i in range(m):
            q, j = dest(p, i)
            groups[p][q].append((i, j))
    cap = max(1, max(len(groups[p][q]) for p in range(P) for q in range(P)))
    send = np.full((P, P * cap), m, np.int32)
    gather = np.zeros((P, m), np.int32)
    for p in range(P):
        for q in range(P):
            for s, (i, j) in enumerate(groups[p][q]):
                send[p, q * cap + s] = i
                gather[q, j] = p * cap + s
    return send, gather


def _permute_units(
    x: jax.Array, axis_name: str, P: int, dest: Callable[[int, int], tuple[int, int]]
) -> jax.Array:
    """Permute the leading-axis units of ``x`` among the ``P`` devices of ``axis_name``."""
    m = x.shape[0]
    send, gather = _tables(P, m, dest)
    me = lax.axis_index(axis_name)
    if np.all(send < m):  # every slot filled (the balanced case): no padding unit
        buf = jnp.take(x, jnp.asarray(send)[me], axis=0)
    else:
        xp = jnp.concatenate([x, jnp.zeros((1,) + x.shape[1:], x.dtype)], axis=0)
        buf = jnp.take(xp, jnp.asarray(send)[me], axis=0)
    record("all_to_all", buf, (axis_name,))
    buf = lax.all_to_all(buf, axis_name, 0, 0, tiled=True)
    if np.all(gather == np.arange(gather.shape[1])):  # received in place: no reordering
        return buf
    return jnp.take(buf, jnp.asarray(gather)[me], axis=0)


def _block_to_cyclic_dest(P: int, m: int) -> Callable[[int, int], tuple[int, int]]:
    return lambda p, i: ((p * m + i) % P, (p * m + i) // P)


def _cyclic_to_block_dest(P: int, m: int) -> Callable[[int, int], tuple[int, int]]:
    return lambda p, i: ((i * P + p) // m, (i * P + p) % m)


def _permute(
    x: jax.Array, g: Grid, dest_fn: Callable[[int, int], Callable[[int, int], tuple[int, int]]]
) -> jax.Array:
    """Permute the tile rows, then the tile columns, of a local block among the devices."""
    for axis, name, P, m in ((0, g.row_axis, g.Pr, g.mr), (1, g.col_axis, g.Pc, g.mc)):
        if P == 1 or name is None:
            continue
        u = jnp.moveaxis(x.reshape(x.shape[:axis] + (m, g.T) + x.shape[axis + 1 :]), axis, 0)
        u = _permute_units(u, name, P, dest_fn(P, m))
        x = jnp.moveaxis(u, 0, axis).reshape(x.shape)
    return x


def block_to_cyclic(g: Grid, x: jax.Array) -> jax.Array:
    """Local contiguous (padded) block -> local block-cyclic block."""
    return _permute(x, g, _block_to_cyclic_dest)


def cyclic_to_block(g: Grid, x: jax.Array) -> jax.Array:
    """Local block-cyclic block -> local contiguous (padded) block."""
    return _permute(x, g, _cyclic_to_block_dest)
