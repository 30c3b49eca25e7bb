"""The public Cholesky entry points, which route by input: a matrix sharded over a mesh
goes to :mod:`gpchol.distributed` (2D block-cyclic, never gathered), everything else to the
one-device core (:mod:`gpchol._linalg.cholesky`).

This module sits above both, which keeps the one-device core free of any import of the
distributed layer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.typing import ArrayLike

from gpchol._base.validate import check_jitter, is_concrete, replicated_if_explicit
from gpchol._linalg.backends import Backend
from gpchol._linalg.cholesky import factor_with_status
from gpchol._linalg.status import pivot_rcond, raise_if_failed

__all__ = ["cholesky", "cholesky_with_status", "maybe_sharded_cholesky"]


def maybe_sharded_cholesky(
    a: Any, tile_size: int | None = None
) -> tuple[jax.Array, jax.Array] | None:
    """The sharded factor of ``a`` if ``a`` is a 2-D matrix sharded over a mesh, else None.

    ``a`` qualifies when it is a concrete or traced ``(n, n)`` array whose sharding is a
    ``NamedSharding`` with at least one matrix dimension sharded over a mesh axis of size
    > 1. Under ``jit`` on a mesh whose axes are all ``Auto`` (``jax.make_mesh``'s default)
    the sharding of a traced array is not known, only its mesh: an array on such a mesh
    of more than one device qualifies when ``n`` is a multiple of the sizes of the mesh's
    first two axes, and is laid out over them (it was gathered to each device instead).
    The result is ``(L, status)`` with ``L`` sharded like ``a`` (the input is not
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
    unknown = (  # traced on Auto axes: the spec says nothing
        not flat
        and isinstance(a, jax.core.Tracer)
        and s.mesh.size > 1
        and all(t == jax.sharding.AxisType.Auto for t in s.mesh.axis_types)
    )
    if unknown:
        flat = list(s.mesh.axis_names[:2])
        if a.shape[0] % math.lcm(*(s.mesh.shape[x] for x in flat)):
            return None  # could not have been sharded over those axes: one device, as before
    elif not flat or all(s.mesh.shape[x] == 1 for x in flat):
        return None
    from gpchol.distributed import potrf

    n = a.shape[0]
    T = tile_size
    if T is not None:
        Pr = max(s.mesh.shape[x] for x in flat)
        T = max(1, min(int(T), n // Pr))
    return potrf(a, T, s.mesh, donate=False, return_status=True, symmetrize_input=True)


def cholesky_with_status(
    a: ArrayLike,
    *,
    tile_size: int | None = None,
    backend: str | Backend = "auto",
    jitter: float | Sequence[float] | None = None,
    rcond: bool = False,
) -> tuple[jax.Array, ...]:
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
        rcond: also return a reciprocal condition estimate of ``A`` from its factor,
            ``(min_j L_jj / max_j L_jj)^2`` (``O(n)``, not differentiated): never below the
            true ``1 / cond_2(A)``, so a value under ``n * eps`` of the dtype means ``A`` is
            numerically singular even when ``status`` is 0. 0 where the factor failed.

    Returns:
        ``(L, status)`` where ``L`` has shape ``(..., n, n)`` and ``status`` is int32 of
        shape ``(...)``: 0 on success, else the 1-based index of the first failing pivot
        in the working precision, exactly LAPACK ``potrf``'s ``info`` for the same matrix
        (whatever the backend, tile size or ``vmap``). A failed factor is all NaN. With
        ``jitter`` given, returns ``(L, status, jitter_used)`` where ``jitter_used``
        (shape ``(...)``) is the value kept (the last one tried if all failed). With
        ``rcond``, the estimate (shape ``(...)``) is appended last.

    Example:
        >>> import jax.numpy as jnp, gpchol
        >>> L, status = gpchol.cholesky_with_status(jnp.array([[4.0, 2.0], [2.0, 3.0]]))
        >>> L.tolist(), int(status)
        ([[2.0, 0.0], [1.0, 1.4142135381698608]], 0)
        >>> _, _, rc = gpchol.cholesky_with_status(jnp.array([[1.0, 1.0], [1.0, 1.0001]]),
        ...                                        rcond=True)
        >>> bool(rc < 1e-3)  # nearly singular: cond_2 is about 4e4
        True
    """
    out: tuple[jax.Array, ...] | None = None
    if jitter is None and backend == "auto":
        out = maybe_sharded_cholesky(a, tile_size)
    if out is None:
        out = factor_with_status(a, tile_size=tile_size, backend=backend, jitter=jitter)
    if rcond:  # (a sharded factor over Explicit axes is gathered for its diagonal)
        L = replicated_if_explicit(jax.lax.stop_gradient(out[0]))
        out = (*out, pivot_rcond(L))
    return out


def cholesky(
    a: ArrayLike,
    *,
    tile_size: int | None = None,
    backend: str | Backend = "auto",
    check: bool = False,
    jitter: float | Sequence[float] | None = None,
) -> jax.Array:
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
        raise_if_failed(a, status, check_jitter(jitter))
    return L
