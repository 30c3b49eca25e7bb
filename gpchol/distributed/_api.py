"""Public entry points: potrf / potrs / logdet in three shapes (direct, jit, shard_map)."""

from __future__ import annotations

import functools
import math
import types
from collections.abc import Callable
from typing import Any, Literal, overload

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from gpchol._base.validate import as_float_array, check_tile_size
from gpchol.distributed import _core, _layout, _local

__all__ = [
    "logdet",
    "logdet_jit_ctx",
    "logdet_shardmap_ctx",
    "potrf",
    "potrf_jit_ctx",
    "potrf_shardmap_ctx",
    "potrs",
    "potrs_jit_ctx",
    "potrs_shardmap_ctx",
]


#: A concrete or an abstract (``jax.sharding.get_abstract_mesh``) device mesh.
AnyMesh = Mesh | AbstractMesh


# ----------------------------------------------------------------------------------------
# Validation and set-up
# ----------------------------------------------------------------------------------------


def _axis_entry(entry: Any, mesh: AnyMesh, what: str) -> str | None:
    if entry is None:
        return None
    if isinstance(entry, tuple):
        if len(entry) != 1:
            raise ValueError(
                f"the {what} dimension is sharded over several mesh axes {entry}; shard each "
                "matrix dimension over at most one mesh axis, e.g. P('r', 'c')."
            )
        entry = entry[0]
    if entry not in mesh.axis_names:
        raise ValueError(
            f"mesh axis {entry!r} ({what} dimension) is not in the mesh, whose axes are "
            f"{tuple(mesh.axis_names)}; use one of those names."
        )
    return entry


def axes_of(spec: P | tuple[Any, ...], mesh: AnyMesh) -> tuple[str | None, str | None]:
    spec = tuple(spec) + (None,) * (2 - len(tuple(spec)))
    if len(spec) != 2:
        raise ValueError(f"the sharding spec must have 2 entries for a matrix; got {spec}.")
    r = _axis_entry(spec[0], mesh, "row")
    c = _axis_entry(spec[1], mesh, "column")
    if r is not None and r == c:
        raise ValueError(f"rows and columns are sharded over the same mesh axis {r!r}.")
    return r, c


def _matrix(a: Any, name: str = "a") -> jax.Array:
    """``a`` as a float ``(n, n)`` array, or a clear error."""
    a = as_float_array(a, name)
    if a.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D (n, n) matrix; got shape {tuple(a.shape)}. The "
            "sharded path has no batch dimensions: loop or vmap over gpchol.cholesky instead."
        )
    if a.shape[0] != a.shape[1]:
        raise ValueError(f"{name} must be square; got shape {tuple(a.shape)}.")
    return a


def default_tile(n: int, Pr: int, Pc: int, tiles: int | None = None) -> int:
    """Default tile size ``T_A`` for an ``n x n`` matrix on a ``Pr x Pc`` grid.

    About ``max(4 lcm(Pr, Pc), tiles)`` tiles per dimension, each of 32 to 256 rows (at
    most one shard), cut so that the padding is least; ``tiles`` defaults to 16, or 32
    past ``n = 2048``: fewer, larger tiles make the panels large and the trailing updates
    coarse, more tiles mostly add compile time (the program is unrolled over the tiles;
    ``benchmarks/results/design-measurements.md``).
    """
    Lc = math.lcm(Pr, Pc)
    seg = -(-n // Lc)  # indices per segment (the unit that is padded)
    if tiles is None:
        tiles = 16 if n <= 2048 else 32
    target = max(4 * Lc, tiles)
    T = min(256, max(32, -(-seg // -(-target // Lc))))
    q = -(-seg // T)
    T = -(-seg // q)  # q tiles per segment, least padding
    return max(1, min(T, n // max(Pr, Pc)))


def _setup(
    n: int, T_A: int | None, mesh: Any, row_axis: str | None, col_axis: str | None
) -> tuple[_local.Grid, _layout.Padding]:
    """Validate sizes; return ``(Grid, Padding)``."""
    Pr = mesh.shape[row_axis] if row_axis else 1
    Pc = mesh.shape[col_axis] if col_axis else 1
    Lc = math.lcm(Pr, Pc)
    if n == 0 or n % Lc:
        up = max(Lc, -(-n // Lc) * Lc)
        raise ValueError(
            f"n = {n} must be a positive multiple of lcm(Pr, Pc) = {Lc} on a {Pr}x{Pc} "
            f"process grid: JAX cannot hold an (n, n) array sharded over mesh axes of "
            f"sizes {Pr} and {Pc} unless both divide n (jax.device_put refuses it). Pad "
            f"the matrix to n = {up} with an identity block, [[A, 0], [0, I]] (its factor "
            "is [[L, 0], [0, I]]: slice L[:n, :n] off the result), or use another mesh. "
            "For a GP, gpchol.distributed.gaussian_log_likelihood takes any n (X is "
            "replicated and the tiles are padded inside)."
        )
    shard = min(n // Pr, n // Pc)
    if T_A is None:
        T_A = default_tile(n, Pr, Pc)
    T_A = check_tile_size(T_A, "T_A")
    assert T_A is not None  # set above when not given
    if T_A > shard:
        raise ValueError(
            f"T_A = {T_A} is larger than a shard ({n // Pr} x {n // Pc} on a {Pr}x{Pc} "
            f"grid); use T_A <= {shard}."
        )
    return _layout.make_grid(n, int(T_A), Pr, Pc, row_axis, col_axis)


def _sharding_of(a: object) -> NamedSharding | None:
    s = getattr(a, "sharding", None)
    if isinstance(s, NamedSharding):
        return s
    aval = getattr(a, "aval", None)
    s = getattr(aval, "sharding", None)
    if isinstance(s, NamedSharding) and s.mesh.axis_names and any(x is not None for x in s.spec):
        return s
    return None


def default_spec(mesh: AnyMesh) -> P:
    names = tuple(mesh.axis_names)
    if not names:
        raise ValueError(
            "the mesh has no axes; pass a mesh such as jax.make_mesh((2, 2), ('r', 'c'))."
        )
    return P(names[0], names[1] if len(names) > 1 else None)


def _resolve(a: object, mesh: AnyMesh | None, spec: P | None = None) -> tuple[AnyMesh, P]:
    """``(mesh, spec)`` from the array's sharding, or the given mesh (and spec)."""
    s = _sharding_of(a)
    # an input replicated over its mesh (P(): the default of arrays made under
    # jax.set_mesh) is distributed with the default spec, not factored whole on every device
    distributed = s is not None and any(x is not None for x in s.spec)
    if mesh is None:
        if s is not None:
            if spec is None:
                spec = s.spec if distributed else default_spec(s.mesh)
            return s.mesh, spec
        mesh = jax.sharding.get_abstract_mesh()
        if not mesh.axis_names:
            raise ValueError(
                "cannot tell which mesh to use: the input is not sharded with a "
                "NamedSharding; pass mesh=jax.make_mesh((Pr, Pc), ('r', 'c')) or place the "
                "input with jax.device_put(a, NamedSharding(mesh, P('r', 'c')))."
            )
    if spec is None:
        if s is not None and distributed and tuple(s.mesh.axis_names) == tuple(mesh.axis_names):
            spec = s.spec
        else:
            spec = default_spec(mesh)
    return mesh, spec


def _explicit(mesh: AnyMesh) -> bool:
    return any(t == AxisType.Explicit for t in getattr(mesh, "axis_types", ()))


def _constrain(x: jax.Array, mesh: AnyMesh, spec: P) -> jax.Array:
    s = NamedSharding(mesh, spec)
    if _explicit(mesh):
        return jax.sharding.reshard(x, s)
    return jax.lax.with_sharding_constraint(x, s)


def place_traced(x: jax.Array, mesh: AnyMesh, spec: P) -> jax.Array:
    """A traced operand laid out as ``spec`` on ``mesh`` before it enters ``shard_map``.

    An unsharded array inside the caller's ``jit`` or ``grad`` (its type says
    ``P(None, None)`` on an Explicit mesh, nothing on an Auto one) is placed by a sharding
    constraint (``reshard`` on Explicit axes, ``with_sharding_constraint`` on Auto ones),
    as :func:`potrf` documents; for one already laid out so the constraint is a no-op.
    """
    return _constrain(x, mesh, _norm_spec(spec))


def replicated(x: jax.Array, mesh: AnyMesh) -> jax.Array:
    """A traced operand replicated on ``mesh`` (``P()``) before it enters ``shard_map``.

    A ``shard_map`` on an Explicit mesh refuses an argument whose type is sharded
    differently from its ``in_specs`` (e.g. GP inputs ``X`` placed by rows); a no-op for
    one already replicated.
    """
    return _constrain(x, mesh, P())


def _sym_tangent(a: jax.Array, mesh: AnyMesh, spec: P) -> jax.Array:
    """Identity on ``a``; its tangent is symmetrized, ``(da + da^T) / 2``.

    The sharded core reads the lower triangle; with this wrapper the gradient of every
    public function is the symmetric one, as through ``jnp.linalg.cholesky``.
    """

    @jax.custom_jvp
    def ident(x: jax.Array) -> jax.Array:
        return x

    @ident.defjvp
    def _jvp(primals: tuple[jax.Array], tangents: tuple[jax.Array]) -> tuple[jax.Array, jax.Array]:
        (x,), (t,) = primals, tangents
        return x, 0.5 * (t + _constrain(t.T, mesh, spec))

    return ident(a)


def _smap(
    fn: Callable[..., Any], mesh: AnyMesh, in_specs: Any, out_specs: Any
) -> Callable[..., Any]:
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def _norm_spec(spec: P | tuple[Any, ...]) -> P:
    t = tuple(spec) + (None,) * (2 - len(tuple(spec)))
    return P(*t)


# ----------------------------------------------------------------------------------------
# potrf
# ----------------------------------------------------------------------------------------


def _potrf_traced(
    a: jax.Array, T_A: int | None, mesh: AnyMesh, spec: P, symmetrize: bool = False
) -> tuple[jax.Array, jax.Array]:
    n = a.shape[0]
    spec = _norm_spec(spec)
    r, c = axes_of(spec, mesh)
    grid, pad = _setup(n, T_A, mesh, r, c)
    a = place_traced(a, mesh, spec)
    if symmetrize:  # (A + A^T) / 2, the transpose laid out as A
        a = 0.5 * (a + _constrain(a.T, mesh, spec))
    a = _sym_tangent(a, mesh, spec)
    body = functools.partial(_core.potrf_block, grid, pad)
    return _smap(body, mesh, (spec,), (spec, P()))(a)


def potrf_jit_ctx(
    a: ArrayLike, T_A: int | None = None, *, mesh: AnyMesh | None = None, spec: P | None = None
) -> tuple[jax.Array, jax.Array]:
    r"""Sharded Cholesky for use inside the caller's own ``jax.jit``.

    Args:
        a, T_A: as for :func:`potrf` (an ``a`` laid out otherwise is placed by a sharding
            constraint; ``mesh`` must then be given or set by ``jax.set_mesh``).
        mesh: the mesh; default: ``a``'s sharding, else the mesh set by ``jax.set_mesh``.
        spec: the ``PartitionSpec`` of ``a`` when it cannot be read from ``a`` (default:
            the mesh's first two axes).

    Returns:
        ``(L, status)`` as for :func:`potrf`, ``(n, n)`` and a replicated int32 scalar;
        donate ``a`` to the caller's ``jit`` to reuse its buffer.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> from jax.sharding import NamedSharding, PartitionSpec as P
        >>> from gpchol import distributed as gd
        >>> mesh = jax.make_mesh((1, 1), ("r", "c"))
        >>> a = jax.device_put(jnp.eye(8) * 4.0, NamedSharding(mesh, P("r", "c")))
        >>> L, status = jax.jit(lambda x: gd.potrf_jit_ctx(x, 4))(a)
        >>> float(L[0, 0]), int(status)
        (2.0, 0)
    """
    a = _matrix(a)
    mesh, spec = _resolve(a, mesh, spec)
    return _potrf_traced(a, T_A, mesh, spec)


@functools.lru_cache(maxsize=64)
def _potrf_jitted(
    mesh: AnyMesh, spec: P, T_A: int | None, donate: bool, symmetrize: bool = False
) -> Callable[..., Any]:
    """The jitted factorization for one static configuration (cached: one compile each)."""

    def f(a: jax.Array) -> tuple[jax.Array, jax.Array]:
        return _potrf_traced(a, T_A, mesh, spec, symmetrize)

    if not donate or not isinstance(mesh, Mesh):
        # the layout comes from the constraint and shard_map inside; no out_shardings, so
        # that a transposed call (reverse mode of an eager jax.grad) takes any cotangent
        return jax.jit(f)
    return jax.jit(
        f,
        donate_argnums=(0,) if donate else (),
        out_shardings=(NamedSharding(mesh, spec), NamedSharding(mesh, P())),
    )


def _place(a: jax.Array, mesh: AnyMesh, spec: P) -> jax.Array:
    s = NamedSharding(mesh, spec)
    if isinstance(a, jax.core.Tracer):
        return a
    if getattr(a, "sharding", None) != s:
        a = jax.device_put(a, s)
    return a


@overload
def potrf(
    a: ArrayLike,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    *,
    donate: bool = True,
    return_status: Literal[False] = False,
    symmetrize_input: bool = False,
) -> jax.Array: ...


@overload
def potrf(
    a: ArrayLike,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    *,
    donate: bool = True,
    return_status: Literal[True],
    symmetrize_input: bool = False,
) -> tuple[jax.Array, jax.Array]: ...


def potrf(
    a: ArrayLike,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    *,
    donate: bool = True,
    return_status: bool = False,
    symmetrize_input: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    r"""Sharded, differentiable Cholesky factor ``L`` (lower) of ``a = L L^T``.

    Right-looking tiled Cholesky on a 2D block-cyclic tile layout inside ``shard_map``;
    no device ever holds the whole matrix. Reverse mode is Murray's blocked adjoint on the
    same tiles; the gradient is the symmetric one (as through ``jnp.linalg.cholesky``).

    Args:
        a: ``(n, n)`` symmetric positive-definite float32/float64 matrix (lower triangle
            read), sharded as ``NamedSharding(mesh, P(row_axis, col_axis))`` (or
            ``P(row_axis, None)`` / ``P(None, col_axis)``). An unsharded array is placed
            with ``P(first_axis, second_axis)`` of ``mesh``: by ``jax.device_put`` when
            concrete, by a sharding constraint when traced (inside the caller's ``jit``
            or ``grad``). ``n`` need not be a multiple of ``T_A`` (the tiles are padded
            inside); it must be a multiple of each sharded mesh axis size, which JAX
            needs to hold the array (a ``ValueError`` says how to pad;
            :func:`gaussian_log_likelihood` takes any ``n``).
        T_A: tile size, ``1 <= T_A <= n / max(Pr, Pc)``; default picks one.
        mesh: the mesh (default: ``a``'s).
        donate: donate ``a``'s buffer to the factor (``a`` is deleted afterwards).
        return_status: also return the status.
        symmetrize_input: factor ``(a + a^T) / 2`` (as :func:`gpchol.cholesky` does)
            instead of reading the lower triangle; one more sharded pass over ``a``.

    Returns:
        ``L`` with ``a``'s sharding, or ``(L, status)``; status is 0 on success, else the
        1-based index of the first failing pivot, and ``L`` is then all NaN.

    Called eagerly or inside the caller's transformations alike, it runs one jitted
    program, compiled once per ``(mesh, spec, T_A, donate)`` and shape (never op by op).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gpchol import distributed as gd
        >>> mesh = jax.make_mesh((1, 1), ("r", "c"))
        >>> L = gd.potrf(jnp.eye(8) * 9.0, 4, mesh)
        >>> float(L[3, 3])
        3.0
    """
    a = _matrix(a)
    mesh, spec = _resolve(a, mesh)
    spec = _norm_spec(spec)
    axes_of(spec, mesh)
    _setup(a.shape[0], T_A, mesh, *axes_of(spec, mesh))
    sym = bool(symmetrize_input)
    if isinstance(a, jax.core.Tracer):
        # a traced input is placed by a sharding constraint inside and not donated
        L, status = _potrf_jitted(mesh, spec, T_A, False, sym)(a)
    else:
        a = _place(a, mesh, spec)
        L, status = _potrf_jitted(mesh, spec, T_A, bool(donate), sym)(a)
    return (L, status) if return_status else L


def potrf_shardmap_ctx(
    a_block: jax.Array, T_A: int | None, row_axis: str, col_axis: str
) -> tuple[jax.Array, jax.Array]:
    r"""Sharded Cholesky inside the caller's ``jax.shard_map``, on the local block.

    Args:
        a_block: this device's ``(n/Pr, n/Pc)`` block of ``a`` sharded as
            ``P(row_axis, col_axis)`` (either axis may be ``None``).
        T_A: tile size, ``1 <= T_A <= n / max(Pr, Pc)``.
        row_axis, col_axis: mesh axis names (``None`` for an unsharded dimension).

    The caller's ``shard_map`` needs ``check_vma=False`` (JAX 0.10's varying-axes check
    rejects the ``custom_linear_solve`` that carries the derivative rules).

    Returns:
        ``(L_block, status)``: the local block of the lower factor (padding removed) and
        the replicated status. Here the derivative is taken with respect to the lower
        triangle of ``a`` (LAPACK's convention): symmetrize ``abar`` yourself if needed.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jax.sharding import NamedSharding, PartitionSpec as P
        >>> from gpchol import distributed as gd
        >>> mesh = jax.make_mesh((1, 1), ("r", "c"))
        >>> f = jax.jit(jax.shard_map(lambda b: gd.potrf_shardmap_ctx(b, 2, "r", "c"),
        ...                   mesh=mesh, in_specs=P("r", "c"), out_specs=(P("r", "c"), P()),
        ...                   check_vma=False))
        >>> a = jax.device_put(jnp.eye(4) * 4.0, NamedSharding(mesh, P("r", "c")))
        >>> L, s = f(a)
        >>> float(L[1, 1]), int(s)
        (2.0, 0)
    """
    grid, pad = _block_setup(a_block, T_A, row_axis, col_axis)
    return _core.potrf_block(grid, pad, a_block)


def _block_setup(
    a_block: jax.Array, T_A: int | None, row_axis: str, col_axis: str
) -> tuple[_local.Grid, _layout.Padding]:
    if a_block.ndim != 2:
        raise ValueError(f"a_block must be 2-D; got shape {tuple(a_block.shape)}.")
    Pr = jax.lax.axis_size(row_axis) if row_axis else 1
    Pc = jax.lax.axis_size(col_axis) if col_axis else 1
    n = a_block.shape[0] * Pr
    if a_block.shape[1] * Pc != n:
        raise ValueError(
            f"a_block of shape {tuple(a_block.shape)} on a {Pr}x{Pc} grid is not a block of "
            "a square matrix; check row_axis/col_axis and the in_specs."
        )

    mesh_like = types.SimpleNamespace(shape={row_axis: Pr, col_axis: Pc})
    return _setup(n, T_A, mesh_like, row_axis, col_axis)


# ----------------------------------------------------------------------------------------
# potrs
# ----------------------------------------------------------------------------------------


def _rhs(b: jax.Array, n: int) -> tuple[jax.Array, bool]:
    if b.ndim not in (1, 2) or b.shape[0] != n:
        raise ValueError(f"b must have shape ({n},) or ({n}, k); got {tuple(b.shape)}.")
    return (b[:, None], True) if b.ndim == 1 else (b, False)


def _potrs_traced(L: jax.Array, b: jax.Array, T_A: int | None, mesh: AnyMesh, spec: P) -> jax.Array:
    n = L.shape[0]
    spec = _norm_spec(spec)
    r, c = axes_of(spec, mesh)
    grid, pad = _setup(n, T_A, mesh, r, c)
    b2, vec = _rhs(b, n)
    # the promoted dtype, as gpchol.cho_solve (float32 L, float64 b: float64)
    dtype = jnp.promote_types(L.dtype, b2.dtype)
    dtype = dtype if jnp.issubdtype(dtype, jnp.floating) else L.dtype
    b2 = _constrain(b2.astype(dtype), mesh, P())
    L = place_traced(L.astype(dtype), mesh, spec)
    body = functools.partial(_core.potrs_block, grid, pad)
    x = _smap(body, mesh, (spec, P()), P())(L, b2)
    return x[:, 0] if vec else x


def potrs_jit_ctx(
    L: jax.Array,
    b: ArrayLike,
    T_A: int | None = None,
    *,
    mesh: AnyMesh | None = None,
    spec: P | None = None,
) -> jax.Array:
    r"""Solve ``(L L^T) x = b`` with a sharded factor, inside the caller's ``jax.jit``.

    ``L``, ``b``, ``T_A`` and the result as for :func:`potrs`; ``mesh``, ``spec`` as for
    :func:`potrf_jit_ctx`. Shapes: ``L`` ``(n, n)``, ``b`` and ``x`` ``(n,)`` or ``(n, k)``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gpchol import distributed as gd
        >>> mesh = jax.make_mesh((1, 1), ("r", "c"))
        >>> L = gd.potrf(jnp.eye(4) * 4.0, 2, mesh)
        >>> jax.jit(lambda L: gd.potrs_jit_ctx(L, jnp.ones(4), 2))(L).tolist()
        [0.25, 0.25, 0.25, 0.25]
    """
    L = _matrix(L, "L")
    b = as_float_array(b, "b")
    mesh, spec = _resolve(L, mesh, spec)
    return _potrs_traced(L, b, T_A, mesh, spec)


def potrs(
    L: jax.Array, b: ArrayLike, T_A: int | None = None, mesh: AnyMesh | None = None
) -> jax.Array:
    r"""Solve ``(L L^T) x = b`` with a sharded Cholesky factor (one or many RHS).

    Args:
        L: ``(n, n)`` lower factor from :func:`potrf`, sharded as ``P(row_axis, col_axis)``.
        b: ``(n,)`` or ``(n, k)``; gathered to every device (it is ``n * k`` numbers).
        T_A: tile size; mesh: default ``L``'s.

    Returns:
        ``x`` with ``b``'s shape (replicated over the mesh). Differentiable in ``L`` and ``b``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gpchol import distributed as gd
        >>> mesh = jax.make_mesh((1, 1), ("r", "c"))
        >>> L = gd.potrf(jnp.eye(4) * 4.0, 2, mesh)
        >>> gd.potrs(L, jnp.ones((4, 2)), 2).shape
        (4, 2)
    """
    L = _matrix(L, "L")
    b = as_float_array(b, "b")
    mesh, spec = _resolve(L, mesh)
    if not isinstance(L, jax.core.Tracer):
        L = _place(L, mesh, _norm_spec(spec))
    return _potrs_cached(mesh, _norm_spec(spec), T_A)(L, b)


@functools.lru_cache(maxsize=64)
def _potrs_cached(mesh: AnyMesh, spec: P, T_A: int | None) -> Callable[..., Any]:
    return jax.jit(lambda L, b: _potrs_traced(L, b, T_A, mesh, spec))


def potrs_shardmap_ctx(
    L_block: jax.Array, b: jax.Array, T_A: int | None, row_axis: str, col_axis: str
) -> jax.Array:
    r"""Solve with the local factor block inside the caller's ``shard_map``.

    ``L_block`` is the local ``(n/Pr, n/Pc)`` block of the factor, ``b`` a replicated
    ``(n,)`` or ``(n, k)`` right-hand side; ``T_A``, ``row_axis``, ``col_axis`` as for
    :func:`potrf_shardmap_ctx`. Returns the replicated ``x`` with ``b``'s shape.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jax.sharding import NamedSharding, PartitionSpec as P
        >>> from gpchol import distributed as gd
        >>> mesh = jax.make_mesh((1, 1), ("r", "c"))
        >>> f = jax.jit(jax.shard_map(lambda l, b: gd.potrs_shardmap_ctx(l, b, 2, "r", "c"),
        ...                   mesh=mesh, in_specs=(P("r", "c"), P()), out_specs=P(),
        ...                   check_vma=False))
        >>> L = jax.device_put(jnp.eye(4) * 2.0, NamedSharding(mesh, P("r", "c")))
        >>> f(L, jnp.ones(4)).tolist()
        [0.25, 0.25, 0.25, 0.25]
    """
    grid, pad = _block_setup(L_block, T_A, row_axis, col_axis)
    b2, vec = _rhs(b, pad.n)
    x = _core.potrs_block(grid, pad, L_block, b2.astype(L_block.dtype))
    return x[:, 0] if vec else x


# ----------------------------------------------------------------------------------------
# logdet
# ----------------------------------------------------------------------------------------


def _logdet_traced(L: jax.Array, mesh: AnyMesh, spec: P) -> jax.Array:
    n = L.shape[0]
    spec = _norm_spec(spec)
    r, c = axes_of(spec, mesh)
    Pr = mesh.shape[r] if r else 1
    Pc = mesh.shape[c] if c else 1
    grid = _local.Grid(Pr, Pc, 1, 1, r, c)
    body = functools.partial(_core.logdet_block, grid, n // Pr, n // Pc)
    return _smap(body, mesh, (spec,), P())(place_traced(L, mesh, spec))


def logdet_jit_ctx(
    L: jax.Array, *, mesh: AnyMesh | None = None, spec: P | None = None
) -> jax.Array:
    r"""``log det(L L^T)`` from a sharded factor, inside the caller's ``jax.jit``.

    As :func:`logdet` (``L`` ``(n, n)``, a replicated scalar result); ``mesh``, ``spec`` as
    for :func:`potrf_jit_ctx`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gpchol import distributed as gd
        >>> mesh = jax.make_mesh((1, 1), ("r", "c"))
        >>> L = gd.potrf(jnp.eye(4) * 4.0, 2, mesh)
        >>> round(float(jax.jit(gd.logdet_jit_ctx)(L)), 4)  # 4 log 4
        5.5452
    """
    L = _matrix(L, "L")
    mesh, spec = _resolve(L, mesh, spec)
    _setup(L.shape[0], None, mesh, *axes_of(_norm_spec(spec), mesh))  # n fits the mesh
    return _logdet_traced(L, mesh, spec)


def logdet(L: jax.Array, mesh: AnyMesh | None = None) -> jax.Array:
    r"""``log det(L L^T) = 2 sum_i log L_ii`` from a sharded factor (no gathering).

    Args:
        L: ``(n, n)`` lower factor sharded as ``P(row_axis, col_axis)``.
        mesh: default ``L``'s.

    Returns:
        scalar (NaN for a failed factor).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gpchol import distributed as gd
        >>> mesh = jax.make_mesh((1, 1), ("r", "c"))
        >>> round(float(gd.logdet(gd.potrf(jnp.eye(4) * 4.0, 2, mesh))), 4)
        5.5452
    """
    L = _matrix(L, "L")
    mesh, spec = _resolve(L, mesh)
    _setup(L.shape[0], None, mesh, *axes_of(_norm_spec(spec), mesh))  # n fits the mesh
    if not isinstance(L, jax.core.Tracer):
        L = _place(L, mesh, _norm_spec(spec))
    return _logdet_cached(mesh, _norm_spec(spec))(L)


@functools.lru_cache(maxsize=64)
def _logdet_cached(mesh: AnyMesh, spec: P) -> Callable[..., Any]:
    return jax.jit(lambda L: _logdet_traced(L, mesh, spec))


def logdet_shardmap_ctx(L_block: jax.Array, row_axis: str, col_axis: str) -> jax.Array:
    r"""``log det(L L^T)`` from the local factor block inside the caller's ``shard_map``.

    ``L_block`` is the local ``(n/Pr, n/Pc)`` block, ``row_axis``, ``col_axis`` as for
    :func:`potrf_shardmap_ctx`; the result is a replicated scalar.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jax.sharding import NamedSharding, PartitionSpec as P
        >>> from gpchol import distributed as gd
        >>> mesh = jax.make_mesh((1, 1), ("r", "c"))
        >>> f = jax.jit(jax.shard_map(lambda l: gd.logdet_shardmap_ctx(l, "r", "c"),
        ...                   mesh=mesh, in_specs=P("r", "c"), out_specs=P(), check_vma=False))
        >>> L = jax.device_put(jnp.eye(4) * 2.0, NamedSharding(mesh, P("r", "c")))
        >>> round(float(f(L)), 4)
        5.5452
    """
    Pr = jax.lax.axis_size(row_axis) if row_axis else 1
    Pc = jax.lax.axis_size(col_axis) if col_axis else 1
    grid = _local.Grid(Pr, Pc, 1, 1, row_axis, col_axis)
    return _core.logdet_block(grid, L_block.shape[0], L_block.shape[1], L_block)
