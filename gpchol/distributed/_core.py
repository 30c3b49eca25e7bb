"""The differentiable per-device core and the shard_map bodies of potrf/potrs/logdet.

``_chol_cyclic(grid, w)`` factors the local block-cyclic block ``w``. Its derivative rules
use the pattern of :mod:`gpchol._linalg.cholesky`: the JVP returns
``lax.custom_linear_solve(matvec, dA, solve=tangent_local, transpose_solve=adjoint_local)``
so that forward mode runs the tiled tangent map and reverse mode Murray's blocked adjoint,
both on the same sharded tiles with the same broadcasts; the only residual is ``L``.
The core reads the lower triangle of its input (and of its tangent); its cotangent is the
exact transpose of that (``Abar`` with Murray's convention). Second-order derivatives are
not supported on this path: ``matvec`` is a placeholder that reads ``L`` through
:func:`_first_order_only`, whose derivative raises, so that a Hessian or the derivative
of a gradient is a clear error rather than a wrong number (``custom_linear_solve``
differentiates only ``matvec``'s dependence on the outer variables).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from gpchol.distributed import _layout, _local
from gpchol.distributed._local import Grid

SECOND_ORDER = (
    "second-order derivatives (a Hessian, or the derivative of a gradient or of a JVP) of "
    "the sharded Cholesky factor and solve are not implemented: differentiate once, or "
    "use the one-device functions (gpchol.cholesky, gpchol.cho_solve) on an unsharded "
    "matrix"
)


@jax.custom_jvp
def _first_order_only(x: jax.Array) -> jax.Array:
    """Identity whose derivative raises :data:`SECOND_ORDER` (traced only when a
    first-order rule below is itself differentiated)."""
    return x


@_first_order_only.defjvp
def _first_order_only_jvp(primals: Any, tangents: Any) -> Any:
    raise NotImplementedError(SECOND_ORDER)


def _placeholder(L: jax.Array) -> Any:
    """The ``matvec`` of a first-order rule's ``custom_linear_solve``: never evaluated to
    a value that matters (NaN), but dependent on ``L`` so that differentiating the rule
    reaches :func:`_first_order_only`."""
    poison = jnp.nan * jnp.sum(_first_order_only(L)[..., :1, :1])

    def matvec(x: jax.Array) -> jax.Array:
        return x * poison.astype(x.dtype)

    return matvec


@partial(jax.custom_jvp, nondiff_argnums=(0,))
def _chol_cyclic(grid: Grid, w: jax.Array) -> tuple[jax.Array, jax.Array]:
    return _local.potrf_local(grid, w)


@_chol_cyclic.defjvp
def _chol_cyclic_jvp(
    grid: Grid, primals: tuple[jax.Array], tangents: tuple[jax.Array]
) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, Any]]:  # Any: a float0 array
    (w,), (w_dot,) = primals, tangents
    L, status = _chol_cyclic(grid, w)

    matvec = _placeholder(L)  # second-order derivatives raise

    def solve(_: object, b: jax.Array) -> jax.Array:
        return _local.tangent_local(grid, L, b)

    def transpose_solve(_: object, lbar: jax.Array) -> jax.Array:
        return _local.adjoint_local(grid, L, lbar)

    L_dot = lax.custom_linear_solve(matvec, w_dot, solve, transpose_solve)
    return (L, status), (L_dot, np.zeros(status.shape, jax.dtypes.float0))


def _status_to_unpadded(p: _layout.Padding, status: jax.Array) -> jax.Array:
    """Padded 1-based pivot -> original 1-based pivot (padding never fails)."""
    if p.sp == p.seg:
        return status
    s = jnp.maximum(status - 1, 0)
    orig = (s // p.sp) * p.seg + jnp.minimum(s % p.sp, p.seg - 1) + 1
    return jnp.where(status == 0, 0, orig).astype(jnp.int32)


def potrf_block(
    grid: Grid, pad: _layout.Padding, a_block: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Factor from the local contiguous block; returns ``(L_block, status)``."""
    pr, pc = _local.coords(grid)
    w = _layout.pad_block(grid, pad, a_block, pr, pc)
    w = _layout.block_to_cyclic(grid, w)
    L, status = _chol_cyclic(grid, w)
    L = _layout.cyclic_to_block(grid, L)
    return _layout.unpad_block(grid, pad, L), _status_to_unpadded(pad, status)


def _cyclic_factor(grid: Grid, pad: _layout.Padding, L_block: jax.Array) -> jax.Array:
    pr, pc = _local.coords(grid)
    L = _layout.pad_block(grid, pad, L_block, pr, pc)
    return _layout.block_to_cyclic(grid, L)


def _solve(grid: Grid, pad: _layout.Padding, L_block: jax.Array, b: jax.Array) -> jax.Array:
    L = _cyclic_factor(grid, pad, L_block)
    D = [_local.diag_tile(grid, L, k) for k in range(grid.nt)]
    bp = _layout.pad_vector(pad, b)
    z = _local.trsv_lower_local(grid, L, bp, D)
    x = _local.trsv_upper_local(grid, L, z, D)
    return _layout.unpad_vector(pad, x)


@partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def potrs_block(grid: Grid, pad: _layout.Padding, L_block: jax.Array, b: jax.Array) -> jax.Array:
    """Solve ``L L^T x = b`` from the local factor block; ``b`` replicated ``(n, r)``.

    ``L`` is read as lower triangular (its upper triangle is ignored, and gets no
    cotangent).
    """
    return _solve(grid, pad, L_block, b)


@potrs_block.defjvp
def _potrs_block_jvp(
    grid: Grid,
    pad: _layout.Padding,
    primals: tuple[jax.Array, jax.Array],
    tangents: tuple[jax.Array, jax.Array],
) -> tuple[jax.Array, jax.Array]:
    # x = A^-1 b with A = L L^T:  dx = A^-1 (db - dA x),  dA x = dL (L^T x) + L (dL^T x).
    # The solve is a custom_linear_solve whose transpose is the same solve (A is
    # symmetric), so reverse mode runs the sharded solve once more, bbar = A^-1 xbar, and
    # transposes the two block matvecs into rank-r outer products on the local block,
    #     Lbar = -tril(bbar (L^T x)^T + x (L^T bbar)^T),
    # instead of differentiating the triangular solves step by step (whose per-step
    # cotangents of L are each a whole zero-padded block).
    (L, b), (dL, db) = primals, tangents
    x = _solve(grid, pad, L, b)
    u = _block_matvec(grid, pad, L, x, trans=True)
    dAx = _block_matvec(grid, pad, dL, u) + _block_matvec(
        grid, pad, L, _block_matvec(grid, pad, dL, x, trans=True)
    )

    matvec = _placeholder(L)  # second-order derivatives raise

    def solve(_: object, r: jax.Array) -> jax.Array:
        return _solve(grid, pad, L, r)

    dx = lax.custom_linear_solve(matvec, db - dAx, solve, symmetric=True)
    return x, dx


def _block_matvec(
    grid: Grid, pad: _layout.Padding, M_block: jax.Array, v: jax.Array, trans: bool = False
) -> jax.Array:
    """``tril(M) @ v`` (or ``tril(M)^T @ v``) from the local contiguous block, replicated.

    ``v``: replicated ``(n, r)``. Each device multiplies its block by its slice of ``v``;
    a ``psum`` along the block's rows (columns) and an ``all_gather`` across complete it.
    """
    pr, pc = _local.coords(grid)
    nr, nc = M_block.shape
    rows = pr * nr + jnp.arange(nr)
    cols = pc * nc + jnp.arange(nc)
    M = jnp.where(rows[:, None] >= cols[None, :], M_block, jnp.zeros((), M_block.dtype))
    if trans:
        y = _local.psum(M.T @ lax.dynamic_slice_in_dim(v, pr * nr, nr), grid.row_axis)
        return _gather(y, grid.col_axis)
    y = _local.psum(M @ lax.dynamic_slice_in_dim(v, pc * nc, nc), grid.col_axis)
    return _gather(y, grid.row_axis)


def _gather(y: jax.Array, axis: str | None) -> jax.Array:
    if axis is None:
        return y
    _local.record("all_gather", y, (axis,))
    return lax.all_gather(y, axis, tiled=True)


def logdet_block(grid: Grid, n_rows: int, n_cols: int, L_block: jax.Array) -> jax.Array:
    """``2 sum log diag L`` from the local contiguous block (no padding needed)."""
    pr, pc = _local.coords(grid)
    gr = pr * n_rows + jnp.arange(n_rows)
    gc = pc * n_cols + jnp.arange(n_cols)
    on = gr[:, None] == gc[None, :]
    val = jnp.sum(jnp.where(on, jnp.log(jnp.where(on, L_block, 1.0)), 0.0))
    return 2.0 * _local.psum(val, grid.axes)
