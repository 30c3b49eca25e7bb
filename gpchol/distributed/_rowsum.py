"""Sums over the rows of data sharded by rows: each device reduces its own rows, one ``psum``.

A data-parallel reduction ``sum_i f(x_i)`` over ``n`` rows placed on a mesh by rows
(``NamedSharding(mesh, P(rows, ...))``): inside ``shard_map`` each device applies a local
function to the rows it owns, and the per-device results (small: for a sparse GP the
``M x M`` and ``M``-vector statistics) are added with one ``psum`` over the row axes. Nothing
of size ``n`` moves between devices. This layer knows no kernels: the caller supplies the
local function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gpchol.distributed._api import place_traced, replicated

__all__ = ["row_axes", "row_sharded_sum"]


def row_axes(x: Any) -> tuple[str, ...]:
    """The mesh axes that split the rows (first dimension) of ``x``; ``()`` if none.

    Example:
        >>> import jax.numpy as jnp
        >>> row_axes(jnp.zeros((4, 2)))
        ()
    """
    s = getattr(x, "sharding", None)
    if not isinstance(s, NamedSharding):
        s = getattr(getattr(x, "aval", None), "sharding", None)
    if not isinstance(s, NamedSharding) or not tuple(s.spec):
        return ()
    first = next(iter(s.spec))
    if first is None:
        return ()
    names = first if isinstance(first, tuple) else (first,)
    return tuple(a for a in names if s.mesh.shape[a] > 1)


def row_sharded_sum(
    local: Callable[..., Any],
    mesh: Any,
    axes: tuple[str, ...],
    rows: tuple[jax.Array, ...],
    shared: Any,
) -> Any:
    """``local`` applied on each device to its rows, summed over the devices (one ``psum``).

    Args:
        local: ``(shared, *rows_local) -> pytree of arrays``, the reduction over the rows
            one device holds (its results must be sums over those rows).
        mesh: the mesh the rows are placed on.
        axes: the mesh axes that split the rows (:func:`row_axes`).
        rows: 2-D arrays of leading dimension ``n`` (``n`` divisible by the product of
            the ``axes`` sizes), split by rows over ``axes``; placed so if they are not.
        shared: a pytree of arrays replicated on every device (parameters, small factors).

    Returns:
        The pytree of ``local``'s results summed over all rows, replicated.

    Raises:
        ValueError: ``n`` not divisible by the number of row shards.
    """
    n = rows[0].shape[0]
    parts = 1
    for a in axes:
        parts *= mesh.shape[a]
    if n % parts:
        raise ValueError(
            f"the {n} rows are split over mesh axes {axes} ({parts} shards); the number of "
            f"rows must be a multiple of {parts} (drop or add a few points)."
        )
    spec = P(axes if len(axes) > 1 else axes[0], None)
    placed = tuple(place_traced(r, mesh, spec) for r in rows)
    shared = jax.tree.map(lambda x: replicated(jax.numpy.asarray(x), mesh), shared)

    def body(shared: Any, *rows_local: jax.Array) -> Any:
        out = local(shared, *rows_local)
        return jax.tree.map(lambda x: jax.lax.psum(x, axes), out)

    in_specs = (P(), *(spec for _ in rows))
    smap = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=P())
    return smap(shared, *placed)
