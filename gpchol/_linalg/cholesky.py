"""The differentiable Cholesky factorization: forward passes, adjoint, status, jitter.

Public entry points are :func:`cholesky` and :func:`cholesky_with_status`. Both
symmetrize their input, ``A <- (A + A^T) / 2``, then call the private core
:func:`_chol`, whose derivative rules are:

* forward mode (JVP): ``dL = L Phi(L^-1 dA L^-T)``, with ``Phi(X)`` the lower triangle of
  ``X`` with its diagonal halved;
* reverse mode: the transpose of that linear map, computed by Murray's *blocked* adjoint
  (I. Murray, "Differentiation of the Cholesky decomposition", arXiv:1602.07527, 2016),
  about twice the flops of the forward factorization instead of the ~4 n^3 flops that
  transposing the JVP rule with two full triangular solves costs.

Both rules are attached with one mechanism: the JVP rule returns
``lax.custom_linear_solve(matvec, dA, solve=<JVP map>, transpose_solve=<Murray adjoint>)``,
so JAX differentiates forward with the JVP map and, when it transposes the linearized
program for reverse mode, calls the Murray adjoint. The only residual kept between the
passes is ``L``. Because ``matvec`` is the exact inverse map (``X -> L X^T + X L^T``),
higher-order derivatives (``jax.hessian``, ``jacfwd(jacrev)``) are correct too.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from gpchol._base.validate import check_jitter
from gpchol._linalg.backends import Backend, prepare
from gpchol._linalg.blocks import mT, symmetric_part, symmetrize
from gpchol._linalg.triangular import chol_tangent

__all__ = [
    "chol",
    "factor_with_jitter",
    "factor_with_status",
    "first_factoring",
    "guarded_chol",
    "linear_chol_tangent",
]


@partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3))
def chol(
    a: jax.Array, backend: Backend, nb: int | None, symmetrize_input: bool = False
) -> tuple[jax.Array, jax.Array]:
    """``(L, status)`` of a symmetric ``a`` (lower triangle read); differentiable in ``a``.

    The one Cholesky derivative rule of the package: forward mode through
    :func:`linear_chol_tangent`, reverse mode its transpose (Murray's blocked adjoint).

    With ``symmetrize_input`` the factor is that of ``(a + a^T) / 2``, formed inside: the
    rare status search then rebuilds it from ``a`` itself (which the caller holds anyway)
    instead of keeping the symmetrized matrix alive, so XLA fuses the symmetrization into
    the factorization's first write (no n x n buffer or pass of its own).
    """
    if a.shape[-1] == 0:
        return a, jnp.zeros(a.shape[:-2], jnp.int32)
    if symmetrize_input:
        return backend.forward(symmetric_part(a), nb, rebuild=lambda: symmetric_part(a))
    return backend.forward(a, nb)


@chol.defjvp
def _chol_jvp(
    backend: Backend,
    nb: int | None,
    symmetrize_input: bool,
    primals: tuple[jax.Array],
    tangents: tuple[jax.Array],
) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, Any]]:  # Any: a float0 array
    (a,), (a_dot,) = primals, tangents
    L, status = chol(a, backend, nb, symmetrize_input)
    if symmetrize_input:
        a_dot = symmetrize(a_dot)  # the map a -> (a + a^T) / 2 is linear
    if a.shape[-1] == 0:
        return (L, status), (jnp.zeros_like(L), np.zeros(status.shape, jax.dtypes.float0))

    L_dot = linear_chol_tangent(L, a_dot, backend, nb)
    return (L, status), (L_dot, np.zeros(status.shape, jax.dtypes.float0))


def linear_chol_tangent(
    L: jax.Array, a_dot: jax.Array, backend: Backend, nb: int | None
) -> jax.Array:
    """``dL`` for ``dA = a_dot`` as a linear map JAX can transpose into Murray's adjoint.

    The tangent map and its transpose, attached through custom_linear_solve:
      matvec          X  -> L X^T + X L^T          (dL -> dA, the exact inverse map)
      solve           dA -> L Phi(L^-1 dA L^-T)    (forward mode)
      transpose_solve Lb -> Murray's blocked adjoint (reverse mode)
    """

    def matvec(x: jax.Array) -> jax.Array:
        s = L @ mT(x)  # written so that only L (not also L^T) becomes a residual
        return s + mT(s)

    def solve(_: object, b: jax.Array) -> jax.Array:
        return chol_tangent(L, b)

    def transpose_solve(_: object, lbar: jax.Array) -> jax.Array:
        return backend.adjoint(L, lbar, nb)

    return lax.custom_linear_solve(matvec, a_dot, solve, transpose_solve)


def _mask(ok: jax.Array, x: jax.Array, fill: ArrayLike) -> jax.Array:
    return jnp.where(ok[..., None, None], x, fill)


@partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def masked_chol(a: jax.Array, backend: Backend, nb: int | None) -> tuple[jax.Array, jax.Array]:
    """:func:`chol` (a failed factor all NaN), whose derivative is masked where the factor
    failed: NaN there in forward mode, an exact zero in reverse mode.

    For a jitter schedule, whose failed attempts a ``where`` discards: with :func:`chol`'s
    own rule the zero cotangent sent back to a discarded attempt ran Murray's adjoint on
    its NaN factor, and ``0 * NaN`` made the whole gradient NaN.
    """
    return chol(a, backend, nb)


@masked_chol.defjvp
def _masked_chol_jvp(
    backend: Backend, nb: int | None, primals: tuple[jax.Array], tangents: tuple[jax.Array]
) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, Any]]:  # Any: a float0 array
    (a,), (a_dot,) = primals, tangents
    L, status = chol(a, backend, nb)
    ok = status == 0
    eye = jnp.eye(a.shape[-1], dtype=a.dtype)
    L_dot = linear_chol_tangent(_mask(ok, L, eye), _mask(ok, a_dot, 0.0), backend, nb)
    return (L, status), (_mask(ok, L_dot, jnp.nan), np.zeros(status.shape, jax.dtypes.float0))


def guarded_chol(a: jax.Array, backend: Backend, nb: int | None) -> tuple[jax.Array, jax.Array]:
    """``(L_safe, ok)`` of a symmetric ``a``: ``L`` where it factors, the identity where not.

    For samplers (NumPyro): :func:`masked_chol` with the failed elements replaced, so that
    a failed element's derivative is an exact zero in both modes, never a NaN (``0 * NaN``
    would be NaN).
    """
    L, status = masked_chol(a, backend, nb)
    ok = status == 0
    eye = jnp.eye(a.shape[-1], dtype=a.dtype)
    return _mask(ok, L, eye), ok


def first_factoring(
    attempt: Callable[[float], tuple[jax.Array, ...]],
    schedule: tuple[float, ...],
    status: int,
    *,
    per_element: bool = False,
) -> tuple[jax.Array, ...]:
    """``attempt(j)`` for the jitters of ``schedule`` in order, each next one run (a
    ``lax.cond``) only while the status (``attempt``'s output at index ``status``) is
    nonzero somewhere; the last run's output is kept, or with ``per_element`` each batch
    element's first success."""
    out = attempt(schedule[0])
    for j in schedule[1:]:

        def retry(old: tuple[jax.Array, ...], j: float = j) -> tuple[jax.Array, ...]:
            new = attempt(j)
            if not per_element:
                return new
            redo = old[status] != 0
            return tuple(
                jnp.where(redo.reshape(redo.shape + (1,) * (n.ndim - redo.ndim)), n, o)
                for o, n in zip(old, new, strict=True)
            )

        out = lax.cond(jnp.any(out[status] != 0), retry, lambda o: o, out)
    return out


def factor_with_jitter(
    a: jax.Array, backend: Backend, nb: int | None, jitter: tuple[float, ...]
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Try ``a + j I`` for each ``j`` in ``jitter`` in order; keep the first that succeeds.

    Returns ``(L, status, jitter_used)``. With several batch elements each keeps its own
    first successful jitter. Differentiable (a chain of ``lax.cond`` / ``where``); where
    every jitter failed, the factor is NaN and its reverse-mode derivative zero
    (:func:`masked_chol`).
    """
    eye = jnp.eye(a.shape[-1], dtype=a.dtype)

    def attempt(j: float) -> tuple[jax.Array, ...]:
        jv = jnp.asarray(j, a.dtype)
        return (*masked_chol(a + jv * eye, backend, nb), jnp.full(a.shape[:-2], jv))

    L, status, used = first_factoring(attempt, jitter, 1, per_element=True)
    return L, status, used


def factor_with_status(
    a: object,
    *,
    tile_size: int | None = None,
    backend: str | Backend = "auto",
    jitter: object = None,
) -> tuple[jax.Array, ...]:
    """``(L, status)`` (or ``(L, status, jitter_used)``) on one device; see
    :func:`gpchol.cholesky_with_status`, which routes here unless the input is sharded."""
    x, nb, be = prepare(a, tile_size, backend)
    return _factor_program(x, be, nb, check_jitter(jitter))


# One compiled program per backend, tile size, jitter schedule and shape when called
# eagerly (or under an eager jax.grad, whose tangent is then transposed as one program);
# a nested call inside a caller's jit, which XLA inlines.
@partial(jax.jit, static_argnums=(1, 2, 3))
def _factor_program(
    x: jax.Array, be: Backend, nb: int | None, jitters: tuple[float, ...] | None
) -> tuple[jax.Array, ...]:
    if jitters is None:
        return chol(x, be, nb, True)
    return factor_with_jitter(symmetric_part(x), be, nb, jitters)
