"""Hook used by :func:`gpchol.cholesky` to route a 2D-sharded input to the sharded path."""

from __future__ import annotations

from jax.sharding import NamedSharding


def maybe_sharded_cholesky(a, tile_size=None):
    """The sharded factor of ``a`` if ``a`` is a 2-D matrix sharded over a mesh, else None.

    ``a`` qualifies when it is a concrete or traced ``(n, n)`` array whose sharding is a
    ``NamedSharding`` with at least one matrix dimension sharded over a mesh axis of size
    > 1. The result is ``(L, status)`` with ``L`` sharded like ``a`` (the input is not
    donated).

    Example:
        >>> import jax.numpy as jnp
        >>> maybe_sharded_cholesky(jnp.eye(4)) is None  # not sharded: not handled here
        True
    """
    if getattr(a, "ndim", None) != 2:
        return None
    s = getattr(a, "sharding", None)
    if not isinstance(s, NamedSharding):
        s = getattr(getattr(a, "aval", None), "sharding", None)
    if not isinstance(s, NamedSharding):
        return None
    spec = tuple(s.spec) + (None, None)
    names = [x for x in spec[:2] if x is not None]
    flat = [y for x in names for y in (x if isinstance(x, tuple) else (x,))]
    if not flat or all(s.mesh.shape[x] == 1 for x in flat):
        return None
    from gpchol.distributed._api import potrf

    n = a.shape[0]
    T = tile_size
    if T is not None:
        Pr = max(s.mesh.shape[x] for x in flat)
        T = max(1, min(int(T), n // Pr))
    return potrf(a, T, s.mesh, donate=False, return_status=True)
