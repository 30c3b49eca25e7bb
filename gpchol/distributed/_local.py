"""Per-device tiled algorithms on the 2D block-cyclic layout (run inside ``shard_map``).

Layout: the padded matrix has ``nt x nt`` tiles of size ``T``; tile ``(I, J)`` lives on
mesh device ``(I % Pr, J % Pc)`` at local tile position ``(I // Pr, J // Pc)``. Each device
holds a ``(mr*T, mc*T)`` local block, ``mr = nt / Pr``, ``mc = nt / Pc``.

At step ``k`` the local tile rows with global index ``> k`` are a suffix of the local list
that starts at ``ceil((k + 1 - pr) / Pr)``; over the process rows the starts differ by at
most one. Every step therefore uses one static slice starting at the smallest start, and
masks (by global index) the at most one leading tile row/column that is already done.
Broadcasts are masked ``psum`` over a mesh axis (only the owner contributes non-zeros).

Everything here is written for a fixed :class:`Grid` (static Python ints and axis names);
the functions see only local blocks and are differentiable by JAX where needed (the
triangular solves used by ``potrs`` and ``logdet``).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from gpchol._linalg.adjoint import chol_rev_symbolic
from gpchol._linalg.blocks import first_bad_pivot_unblocked, mT, phi, potrf_tile, put, trsm


@dataclasses.dataclass(frozen=True)
class Grid:
    """Static description of the tile grid on the mesh.

    Attributes:
        Pr, Pc: process grid (sizes of ``row_axis`` / ``col_axis``; 1 when absent).
        nt: tiles per dimension of the padded matrix (a multiple of ``Pr`` and ``Pc``).
        T: tile size.
        row_axis, col_axis: mesh axis names (``None`` for an absent axis).
    """

    Pr: int
    Pc: int
    nt: int
    T: int
    row_axis: str | None
    col_axis: str | None

    @property
    def mr(self) -> int:
        return self.nt // self.Pr

    @property
    def mc(self) -> int:
        return self.nt // self.Pc

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(a for a in (self.row_axis, self.col_axis) if a is not None)


# ----------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------


# Set to a list by benchmarks/bench_distributed.py to record, at trace time, every
# collective the algorithms issue (kind, shape, dtype, axes). Never set by the library.
COLLECTIVE_LOG = None


def record(kind: str, x: Any, axes: tuple[str, ...]) -> None:
    if COLLECTIVE_LOG is not None:
        COLLECTIVE_LOG.append((kind, tuple(x.shape), np.dtype(x.dtype), tuple(axes)))


def psum(x: Any, axes: str | tuple[str | None, ...] | None) -> Any:
    axes = tuple(a for a in (axes if isinstance(axes, tuple) else (axes,)) if a is not None)
    if not axes:
        return x
    record("psum", x, axes)
    return lax.psum(x, axes)


def coords(g: Grid) -> tuple[jax.Array, jax.Array]:
    """``(pr, pc)``: this device's position on the process grid (traced ints)."""
    pr = lax.axis_index(g.row_axis) if g.row_axis else jnp.int32(0)
    pc = lax.axis_index(g.col_axis) if g.col_axis else jnp.int32(0)
    return pr, pc


def _start(k: int, P: int) -> int:
    """Smallest local index (over the ``P`` process rows) of a tile with global index > k."""
    return min(max(0, -(-(k + 1 - p) // P)) for p in range(P))


def _end(k: int, P: int) -> int:
    """Largest count (over processes) of local tiles with global index < k."""
    return -(-k // P)


def _expand(mask: jax.Array, T: int) -> jax.Array:
    """Per-tile boolean mask ``(m,)`` -> per-row ``(m*T, 1)``."""
    return jnp.repeat(mask, T)[:, None]


def _tile(x: jax.Array, i: int, j: int, T: int) -> jax.Array:
    return x[i * T : (i + 1) * T, j * T : (j + 1) * T]


def _lowsym(t: jax.Array) -> jax.Array:
    """Symmetric tile from its lower triangle."""
    low = jnp.tril(t)
    return low + mT(jnp.tril(t, -1))


def global_rows(g: Grid, pr: jax.Array | int) -> jax.Array:
    """Global (padded) row index of every local row, ``(mr*T,)``."""
    tiles = jnp.arange(g.mr) * g.Pr + pr
    return (tiles[:, None] * g.T + jnp.arange(g.T)).reshape(-1)


def global_cols(g: Grid, pc: jax.Array | int) -> jax.Array:
    tiles = jnp.arange(g.mc) * g.Pc + pc
    return (tiles[:, None] * g.T + jnp.arange(g.T)).reshape(-1)


def lower_mask(g: Grid, x: jax.Array) -> jax.Array:
    """``x`` with every entry above the global diagonal set to 0."""
    pr, pc = coords(g)
    gr, gc = global_rows(g, pr), global_cols(g, pc)
    return jnp.where(gr[:, None] >= gc[None, :], x, jnp.zeros((), x.dtype))


def diag_tile(g: Grid, x: jax.Array, k: int) -> jax.Array:
    """Global diagonal tile ``k`` of the local block ``x``, broadcast to every device."""
    pr, pc = coords(g)
    own = (pr == k % g.Pr) & (pc == k % g.Pc)
    t = _tile(x, k // g.Pr, k // g.Pc, g.T)
    return psum(jnp.where(own, t, jnp.zeros((), x.dtype)), g.axes)


def _row_panel(g: Grid, x: jax.Array, k: int, sr: int) -> jax.Array:
    """Column ``k`` of ``x`` at the local rows from ``sr``, broadcast along process rows.

    Rows whose global index is ``<= k`` are zero. Shape ``((mr - sr) * T, T)``.
    """
    pr, pc = coords(g)
    own_c = pc == k % g.Pc
    lj = k // g.Pc
    raw = x[sr * g.T :, lj * g.T : (lj + 1) * g.T]
    rmask = (jnp.arange(sr, g.mr) * g.Pr + pr) > k
    keep = own_c & _expand(rmask, g.T)
    return psum(jnp.where(keep, raw, jnp.zeros((), x.dtype)), g.col_axis)


def _row_panels(
    g: Grid, xs: list[jax.Array], k: int, sr: int, dep: jax.Array | None = None
) -> jax.Array:
    """:func:`_row_panel` of several blocks at once (one collective): ``(len(xs), rows, T)``.

    The slices are read after ``dep`` (see :func:`_after`).
    """
    pr, pc = coords(g)
    lj = k // g.Pc
    raw = jnp.stack([_after(x[sr * g.T :, lj * g.T : (lj + 1) * g.T], dep) for x in xs])
    rmask = (jnp.arange(sr, g.mr) * g.Pr + pr) > k
    keep = (pc == k % g.Pc) & _expand(rmask, g.T)
    return psum(jnp.where(keep, raw, jnp.zeros((), raw.dtype)), g.col_axis)


def _after(x: jax.Array, dep: jax.Array | None) -> jax.Array:
    """``x``, computed only once ``dep`` is: a data dependency for XLA's scheduler.

    The values are ``x``'s (``NaN`` where ``dep``'s first entry is not finite, which
    happens only when the result is already non-finite). Used on the slices of the
    factor ``L`` that a reverse or tangent step reads: they depend on ``L`` alone, and
    XLA's CPU scheduler (its concurrency-optimised one, the default) otherwise computes
    all of them at the start, so that every step's panels are alive at once
    (``benchmarks/results/design-measurements.md``).
    ``lax.optimization_barrier`` does not help: XLA's CPU pipeline removes it before
    scheduling. ``dep=None``: ``x`` itself.
    """
    if dep is None:
        return x
    z = jnp.zeros((), x.dtype) * dep.reshape(-1)[0].astype(x.dtype)
    return x + z


def _col_table(g: Grid, k: int, sr: int, sc: int) -> np.ndarray:
    """Static table: which row-panel tile gives each local column tile (or the zero tile)."""
    nr = g.mr - sr
    tab = np.full((g.Pr, g.Pc, g.mc - sc), nr, np.int32)
    for pr in range(g.Pr):
        for pc in range(g.Pc):
            for j in range(g.mc - sc):
                J = (sc + j) * g.Pc + pc
                if J > k and J % g.Pr == pr:
                    tab[pr, pc, j] = J // g.Pr - sr
    return tab


def _transpose_panel(g: Grid, panel_r: jax.Array, k: int, sr: int, sc: int) -> jax.Array:
    """From a row panel (rows ``I = li*Pr + pr``) to the column panel (``J = lj*Pc + pc``).

    Device ``(pr, pc)`` contributes the tiles ``J`` with ``J % Pr == pr`` it holds; a
    ``psum`` over the row axis completes every device's ``((mc - sc) * T, T)`` panel. Tiles
    with ``J <= k`` are zero. A leading stack dimension (several panels, one collective) is
    allowed: ``(s, rows, T) -> (s, cols, T)``.
    """
    pr, pc = coords(g)
    T = g.T
    lead = panel_r.shape[:-2]
    tiles = panel_r.reshape(lead + (-1, T, T))
    ax = len(lead)
    tiles = jnp.concatenate([tiles, jnp.zeros(lead + (1, T, T), tiles.dtype)], axis=ax)
    tab = jnp.asarray(_col_table(g, k, sr, sc))[pr, pc]
    out = jnp.take(tiles, tab, axis=ax).reshape(lead + (-1, T))
    return psum(out, g.row_axis)


def _write_col(g: Grid, x: jax.Array, new: jax.Array, k: int, sr: int) -> jax.Array:
    """Write the panel ``new`` into column ``k`` of ``x`` on its owner (rows > k only)."""
    pr, pc = coords(g)
    lj = k // g.Pc
    old = x[sr * g.T :, lj * g.T : (lj + 1) * g.T]
    rmask = (jnp.arange(sr, g.mr) * g.Pr + pr) > k
    keep = (pc == k % g.Pc) & _expand(rmask, g.T)
    return put(x, jnp.where(keep, new, old), sr * g.T, lj * g.T)


def _write_diag(g: Grid, x: jax.Array, new: jax.Array, k: int) -> jax.Array:
    pr, pc = coords(g)
    own = (pr == k % g.Pr) & (pc == k % g.Pc)
    li, lj = k // g.Pr, k // g.Pc
    old = _tile(x, li, lj, g.T)
    return put(x, jnp.where(own, new, old), li * g.T, lj * g.T)


# Row chunks of the trailing update; see _sub_lower.
_CHUNKS = 4


def _sub_lower(g: Grid, x: jax.Array, a: jax.Array, b: jax.Array, sr: int, sc: int) -> jax.Array:
    """``x[sr*T:, sc*T:] -= a @ b^T`` on the tiles that may lie on or below the diagonal.

    Only the lower triangle of the trailing matrix is ever read again, so the update is
    cut into at most ``_CHUNKS`` chunks of local tile rows, each reaching only the local
    column tiles that hold a global column ``<=`` the chunk's largest global row on some
    device (static bounds, the same on every device): about ``1/2 + 1/(2 _CHUNKS)`` of the
    whole-square flops, and each chunk's product is at most ``~1/_CHUNKS`` of the local
    block. Tiles above the diagonal that are still updated hold finite junk; the caller
    masks them at the end. ``a``: ``((mr - sr) T, K)``; ``b``: ``((mc - sc) T, K)``.
    """
    T = g.T
    rows = g.mr - sr
    nch = min(_CHUNKS, rows)
    bounds = [sr + (rows * i) // nch for i in range(nch + 1)]
    for lo, hi in itertools.pairwise(bounds):
        top = (hi - 1) * g.Pr + g.Pr - 1  # largest global row tile in the chunk
        ce = min(g.mc, top // g.Pc + 1)
        if ce <= sc:
            continue
        blk = x[lo * T : hi * T, sc * T : ce * T]
        prod = a[(lo - sr) * T : (hi - sr) * T] @ mT(b[: (ce - sc) * T])
        x = put(x, blk - prod, lo * T, sc * T)
    return x


# ----------------------------------------------------------------------------------------
# Forward factorization
# ----------------------------------------------------------------------------------------


def potrf_local(g: Grid, w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Right-looking tiled Cholesky of the local cyclic block ``w`` (lower triangle read).

    Returns ``(L_local, status)``: ``L`` lower (upper tiles zeroed), NaN on failure;
    ``status`` the 1-based first failing pivot in padded global numbering (0 = success),
    identical on every device.
    """
    T, nt = g.T, g.nt
    diag_in, oks = [], []
    for k in range(nt):
        d = _lowsym(diag_tile(g, w, k))
        diag_in.append(d)
        Lkk = potrf_tile(d)
        oks.append(jnp.all(jnp.isfinite(jnp.diagonal(Lkk))))
        w = _write_diag(g, w, Lkk, k)
        if k == nt - 1:
            break
        sr, sc = _start(k, g.Pr), _start(k, g.Pc)
        raw = _row_panel(g, w, k, sr)
        panel_r = trsm(Lkk, raw, left=False, trans=True)
        w = _write_col(g, w, panel_r, k, sr)
        panel_c = _transpose_panel(g, panel_r, k, sr, sc)
        w = _sub_lower(g, w, panel_r, panel_c, sr, sc)
    ok = jnp.stack(oks)
    status = _status(jnp.stack(diag_in), ok, T)
    L = lower_mask(g, w)
    return jnp.where(status == 0, L, jnp.nan), status


def _status(tiles: jax.Array, ok: jax.Array, T: int) -> jax.Array:
    failed = ~jnp.all(ok)
    first = jnp.argmin(ok)

    def locate(args: tuple[jax.Array, jax.Array]) -> jax.Array:
        tiles, first = args
        bad = first_bad_pivot_unblocked(tiles[first])
        return (first * T + jnp.maximum(bad, 1)).astype(jnp.int32)

    return lax.cond(failed, locate, lambda _: jnp.int32(0), (tiles, first))


# ----------------------------------------------------------------------------------------
# Tangent map (forward mode): the JVP of potrf_local written in terms of L only
# ----------------------------------------------------------------------------------------


def tangent_local(g: Grid, L: jax.Array, dA: jax.Array) -> jax.Array:
    """``dL`` for a tangent ``dA`` (lower triangle read), mirroring the forward steps.

    Step ``k`` with ``S`` the Schur complement: ``dL_kk = L_kk Phi(L_kk^-1 dS_kk L_kk^-T)``,
    ``dL_p = (dS_p - L_p dL_kk^T) L_kk^-T``, ``dS -= dL_p L_p^T + L_p dL_p^T``. The pieces
    of ``L`` travel in the same collectives as those of the tangent (three per step) and
    are read only once the step before is done (:func:`_after`).
    """
    T, nt = g.T, g.nt
    pr, pc = coords(g)
    w = dA
    dep = None
    for k in range(nt):
        own = (pr == k % g.Pr) & (pc == k % g.Pc)
        li, lj = k // g.Pr, k // g.Pc
        tiles = jnp.stack([_after(_tile(L, li, lj, T), dep), _tile(w, li, lj, T)])
        tiles = psum(jnp.where(own, tiles, jnp.zeros((), w.dtype)), g.axes)
        Lkk, dS = tiles[0], _lowsym(tiles[1])
        x = trsm(Lkk, trsm(Lkk, dS, left=True), left=False, trans=True)
        dLkk = Lkk @ phi(x)
        w = _write_diag(g, w, dLkk, k)
        dep = dLkk
        if k == nt - 1:
            break
        sr, sc = _start(k, g.Pr), _start(k, g.Pc)
        pan = _row_panels(g, [L, w], k, sr, dep)
        Lp_r = pan[0]
        dLp_r = trsm(Lkk, pan[1] - Lp_r @ mT(dLkk), left=False, trans=True)
        w = _write_col(g, w, dLp_r, k, sr)
        both = _transpose_panel(g, jnp.stack([Lp_r, dLp_r]), k, sr, sc)
        a = jnp.concatenate([dLp_r, Lp_r], axis=1)
        w = _sub_lower(g, w, a, jnp.concatenate([both[0], both[1]], axis=1), sr, sc)
    return lower_mask(g, w)


# ----------------------------------------------------------------------------------------
# Reverse mode: Murray's blocked adjoint on the same tiles, last block column first
# ----------------------------------------------------------------------------------------


def adjoint_local(g: Grid, L: jax.Array, Lbar: jax.Array) -> jax.Array:
    """Murray's blocked adjoint ``Abar`` (lower, his convention) of the local block.

    For block column ``k`` (``R = L[k, :k]``, ``D = L_kk``, ``B = L[k+1:, :k]``,
    ``C = L[k+1:, k]``)::

        Cbar <- Cbar D^-1;  Bbar <- Bbar - Cbar R;  Dbar <- tril(Dbar) - tril(Cbar^T C)
        Dbar <- symbolic(D, Dbar);  Rbar <- Rbar - Cbar^T B - (Dbar + Dbar^T) R

    ``Abar`` is the exact transpose of :func:`tangent_local` (which reads the lower
    triangle of ``dA``); the symmetric gradient is ``(Abar + Abar^T) / 2``.

    Three collectives per step, each carrying a piece of ``L`` together with a piece of
    the gradient: the diagonal tiles ``(D, Dbar)`` over the whole mesh, the panels
    ``(Cbar, C)`` over the column axis, and ``(R, Cbar^T B, Cbar^T C)`` over the row axis;
    every read of ``L`` is tied to the step before (:func:`_after`), so that none is done
    ahead of its step. Temporaries: one step's panels, the ``Cbar R`` product and the
    slice ``B`` (each at most about a quarter of the local block), besides ``L`` and the
    gradient buffer.
    """
    T, nt = g.T, g.nt
    pr, pc = coords(g)
    gbar = lower_mask(g, Lbar)
    dep = None
    for k in reversed(range(nt)):
        sr = _start(k, g.Pr)
        e = _end(k, g.Pc)
        li = k // g.Pr
        own_r = pr == k % g.Pr
        # (D, Dbar): Dbar is still its initial value here (later steps never touch it)
        own = own_r & (pc == k % g.Pc)
        tiles = jnp.stack([_after(_tile(L, li, k // g.Pc, T), dep), _tile(gbar, li, k // g.Pc, T)])
        tiles = psum(jnp.where(own, tiles, jnp.zeros((), L.dtype)), g.axes)
        D, Db = tiles[0], jnp.tril(tiles[1])
        last = k == nt - 1
        if not last:
            pan = _row_panels(g, [gbar, L], k, sr, dep)
            Cb_r = trsm(D, pan[0], left=False)
            C_r = pan[1]
            gbar = _write_col(g, gbar, Cb_r, k, sr)
        if e:
            cmask = _expand((jnp.arange(e) * g.Pc + pc) < k, T).T
            R_own = jnp.where(own_r & cmask, _after(L[li * T : (li + 1) * T, : e * T], dep), 0.0)
            parts = [R_own.astype(L.dtype)]
            if not last:
                B = _after(L[sr * T :, : e * T], Cb_r)
                parts += [mT(Cb_r) @ B, mT(Cb_r) @ C_r]
            red = psum(jnp.concatenate(parts, axis=1), g.row_axis)
            R_c = red[:, : e * T]
            if not last:
                CtB, CtC = red[:, e * T : 2 * e * T], red[:, 2 * e * T :]
                gbar = put(gbar, gbar[sr * T :, : e * T] - Cb_r @ R_c, sr * T, 0)
        elif not last:
            CtC = psum(mT(Cb_r) @ C_r, g.row_axis)
        if not last:
            Db = Db - jnp.tril(CtC)
        Db = chol_rev_symbolic(D, Db)
        gbar = _write_diag(g, gbar, Db, k)
        if e:
            upd = (Db + mT(Db)) @ R_c
            if not last:
                upd = upd + CtB
            old = gbar[li * T : (li + 1) * T, : e * T]
            gbar = put(gbar, jnp.where(own_r & cmask, old - upd, old), li * T, 0)
        dep = Db
    return gbar


# ----------------------------------------------------------------------------------------
# Solves and log-determinant with a replicated right-hand side
# ----------------------------------------------------------------------------------------


def _diag_tiles(g: Grid, L: jax.Array) -> list[jax.Array]:
    return [diag_tile(g, L, k) for k in range(g.nt)]


def trsv_lower_local(
    g: Grid,
    L: jax.Array,
    b: jax.Array,
    D: list[jax.Array] | None = None,
    *,
    local_rows: bool = False,
) -> jax.Array:
    """Solve ``L x = b``; returns replicated ``x``, ``(nt*T, r)``.

    ``b``: replicated ``(nt*T, r)``; or, with ``local_rows``, this device's additive share
    of the right-hand side's rows that its process row holds, ``(mr*T, r)`` (local tile
    row ``i`` is global tile row ``i*Pr + pr``): the right-hand side is the sum of the
    shares over the devices of a process row (e.g. each device holds the columns of its
    own part of a block of right-hand sides, zeros elsewhere). Either way every step
    moves one ``(T, r)`` tile row: one ``psum`` over the mesh.
    """
    T, nt = g.T, g.nt
    pr, pc = coords(g)
    D = _diag_tiles(g, L) if D is None else D
    xs = jnp.zeros((nt, T, b.shape[-1]), b.dtype)
    for k in range(nt):
        e = _end(k, g.Pc)
        li = k // g.Pr
        if local_rows:
            share = jnp.where(pr == k % g.Pr, b[li * T : (li + 1) * T], 0.0).astype(b.dtype)
            rhs = None
        else:
            share = None
            rhs = b[k * T : (k + 1) * T]
        if e:
            row = _after(L[li * T : (li + 1) * T, : e * T], xs[k - 1])
            xl = jnp.take(xs, jnp.arange(e) * g.Pc + pc, axis=0).reshape(e * T, -1)
            if local_rows:
                # many right-hand sides: only the owning process row multiplies
                part = lax.cond(
                    pr == k % g.Pr,
                    lambda r, x: -(r @ x).astype(b.dtype),
                    lambda r, x: jnp.zeros((T, x.shape[-1]), b.dtype),
                    row,
                    xl,
                )
            else:
                part = -(jnp.where(pr == k % g.Pr, row, 0.0) @ xl).astype(b.dtype)
            share = part if share is None else share + part
        if share is not None:
            total = psum(share, g.axes)
            rhs = total if rhs is None else rhs + total
        assert rhs is not None  # b[k] or the shares' sum (a static fact of the loop)
        xs = xs.at[k].set(trsm(D[k], rhs, left=True))
    return xs.reshape(nt * T, -1)


def trsv_upper_local(
    g: Grid, L: jax.Array, z: jax.Array, D: list[jax.Array] | None = None
) -> jax.Array:
    """Solve ``L^T x = z``; ``z`` replicated ``(nt*T, r)``, returns replicated ``x``."""
    T, nt = g.T, g.nt
    pr, pc = coords(g)
    D = _diag_tiles(g, L) if D is None else D
    xs = jnp.zeros((nt, T, z.shape[-1]), z.dtype)
    for k in reversed(range(nt)):
        rhs = z[k * T : (k + 1) * T]
        if k < nt - 1:
            sr = _start(k, g.Pr)
            lj = k // g.Pc
            col = _after(L[sr * T :, lj * T : (lj + 1) * T], xs[k + 1])
            col = jnp.where(pc == k % g.Pc, col, 0.0)
            xl = jnp.take(xs, jnp.arange(sr, g.mr) * g.Pr + pr, axis=0).reshape(-1, z.shape[-1])
            rhs = rhs - psum((mT(col) @ xl).astype(z.dtype), g.axes)
        xs = xs.at[k].set(trsm(D[k], rhs, left=True, trans=True))
    return xs.reshape(nt * T, -1)


def logdet_local(g: Grid, L: jax.Array) -> jax.Array:
    """``2 sum log diag(L)`` (replicated); padded diagonal entries are 1."""
    pr, pc = coords(g)
    gr, gc = global_rows(g, pr), global_cols(g, pc)
    on = gr[:, None] == gc[None, :]
    val = jnp.sum(jnp.where(on, jnp.log(jnp.where(on, L, 1.0)), 0.0))
    return 2.0 * psum(val, g.axes)
