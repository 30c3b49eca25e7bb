"""Solves, log-determinant, inverse and Gaussian log-density on top of the Cholesky factor.

All functions take batch dimensions and are differentiable in every array argument.
:func:`mvn_logpdf` uses the whole-likelihood rule of :mod:`gpchol._linalg.gaussian`.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from gpchol._base.validate import as_float_array as _as_float
from gpchol._base.validate import check_square, check_tile_size, replicated_if_explicit
from gpchol._linalg.backends import Backend, array_platform, prepare
from gpchol._linalg.blocks import default_tile_size, symmetric_part, trsm
from gpchol._linalg.cholesky import chol
from gpchol._linalg.gaussian import DenseCovariance, GaussianRule, gaussian_loglik, gaussian_value
from gpchol._linalg.inverse import inverse_from_factor

__all__ = ["cho_inverse", "cho_solve", "logdet", "mvn_logpdf", "solve_triangular"]


def _one_device(x: object, name: str) -> jax.Array:
    """A float array on one device's terms (replicated when sharded over Explicit mesh
    axes, which the one-device algorithms cannot mix with their transposes)."""
    return replicated_if_explicit(_as_float(x, name))


def _rhs(L: jax.Array, b: ArrayLike, name: str = "b") -> tuple[jax.Array, bool]:
    """Validate ``b`` against ``L``; return ``(b, is_vector)`` (a vector is solved as
    ``b[..., None]``)."""
    b = _one_device(b, name)
    n = L.shape[-1]
    if b.ndim == 0:
        raise ValueError(f"{name} must have shape (..., n) or (..., n, k); got a scalar.")
    vector = b.ndim == 1 or b.ndim == L.ndim - 1
    if vector:
        if b.shape[-1] != n:
            raise ValueError(
                f"{name} has shape {tuple(b.shape)}, but the factor is {n}x{n}: a vector "
                f"right-hand side needs last dimension {n}."
            )
        return b, True
    if b.shape[-2] != n:
        raise ValueError(
            f"{name} has shape {tuple(b.shape)}, but the factor is {n}x{n}: a matrix "
            f"right-hand side needs shape (..., {n}, k)."
        )
    return b, False


def _operand(x: object, name: str) -> jax.Array:
    """``x`` as a float array; a Python ``int``/``float`` stays *weakly typed*.

    A weakly typed scalar takes the dtype of the arrays it meets (JAX's promotion rule),
    so ``mvn_logpdf(y_f32, 0.0, cov_f32)`` stays float32 under ``jax_enable_x64``; so does
    a Python number traced through ``jit`` (a weakly typed scalar, an ``int`` one made a
    weak float). NumPy scalars (``np.float64(0.0)``, a subclass of ``float``) keep their
    own dtype.
    """
    if type(x) in (int, float):
        return jnp.asarray(float(x))  # type: ignore[arg-type]
    if isinstance(x, jax.Array) and x.weak_type and x.ndim == 0:
        # a Python number passed through ``jit`` (a weakly typed scalar, an int one too)
        if jnp.issubdtype(x.dtype, jnp.integer):
            return x + 0.0  # a weak float
    return _one_device(x, name)


def _common_dtype(*xs: jax.Array) -> tuple[jax.Array, ...]:
    """The arrays cast to their promoted dtype (a weakly typed scalar does not promote)."""
    dt = jnp.result_type(*xs)
    return tuple(x.astype(dt) for x in xs)


def solve_triangular(
    L: ArrayLike, b: ArrayLike, *, lower: bool = True, transpose: bool = False
) -> jax.Array:
    r"""Solve ``op(L) x = b`` for a triangular ``L``.

    ``op(L)`` is ``L`` or, with ``transpose=True``, ``L^T``. Differentiable in ``L`` and
    ``b`` (both modes); batch dimensions broadcast.

    Args:
        L: ``(..., n, n)`` triangular matrix (only the triangle named by ``lower`` is read).
        b: ``(..., n)`` vector(s) or ``(..., n, k)`` matrix right-hand side.
        lower: whether ``L`` is lower (default) or upper triangular.
        transpose: solve with ``L^T`` instead of ``L``.

    Returns:
        ``x`` with the shape of ``b`` (batch dimensions broadcast).

    Example:
        >>> import jax.numpy as jnp, gpchol
        >>> L = jnp.array([[2.0, 0.0], [1.0, 1.0]])
        >>> gpchol.solve_triangular(L, jnp.array([2.0, 3.0])).tolist()
        [1.0, 2.0]
    """
    L = _one_device(L, "L")
    check_square(L, "L")
    b, vec = _rhs(L, b)
    return _solve_program(L, b, lower, transpose, vec)


def cho_solve(L: ArrayLike, b: ArrayLike) -> jax.Array:
    r"""Solve ``(L L^T) x = b`` given the lower Cholesky factor ``L``.

    Args:
        L: ``(..., n, n)`` lower Cholesky factor (e.g. from :func:`gpchol.cholesky`).
        b: ``(..., n)`` or ``(..., n, k)`` right-hand side.

    Returns:
        ``x`` with the shape of ``b``.

    Example:
        >>> import jax.numpy as jnp, gpchol
        >>> a = jnp.array([[4.0, 2.0], [2.0, 3.0]])
        >>> x = gpchol.cho_solve(gpchol.cholesky(a), jnp.array([1.0, 2.0]))
        >>> bool(jnp.allclose(a @ x, jnp.array([1.0, 2.0]), atol=1e-6))
        True
    """
    L = _one_device(L, "L")
    check_square(L, "L")
    b, vec = _rhs(L, b)
    return _cho_solve_program(L, b, vec)


def logdet(L: ArrayLike) -> jax.Array:
    r"""``log det(L L^T) = 2 sum_i log L_ii`` from a Cholesky factor.

    Args:
        L: ``(..., n, n)`` lower Cholesky factor.

    Returns:
        ``(...)`` log-determinants of ``A = L L^T`` (NaN if ``L`` is a failed, NaN factor).

    Example:
        >>> import jax.numpy as jnp, gpchol
        >>> L = gpchol.cholesky(jnp.array([[4.0, 2.0], [2.0, 3.0]]))
        >>> round(float(gpchol.logdet(L)), 5)  # log(8)
        2.07944
    """
    L = _one_device(L, "L")
    check_square(L, "L")
    return _logdet_program(L)


def cho_inverse(L: ArrayLike, *, tile_size: int | None = None) -> jax.Array:
    r"""``A^-1 = L^-T L^-1`` from the lower Cholesky factor ``L`` of ``A`` (tiled).

    Blocked triangular inverse followed by the blocked product ``W^T W``, exploiting the
    triangular structure (LAPACK's ``potri``). Differentiable.

    Args:
        L: ``(..., n, n)`` lower Cholesky factor.
        tile_size: block size; default depends on ``n``.

    Returns:
        ``(..., n, n)`` symmetric inverse of ``A = L L^T``.

    Example:
        >>> import jax.numpy as jnp, gpchol
        >>> a = jnp.array([[4.0, 2.0], [2.0, 3.0]])
        >>> inv = gpchol.cho_inverse(gpchol.cholesky(a))
        >>> bool(jnp.allclose(inv @ a, jnp.eye(2), atol=1e-6))
        True
    """
    L = _one_device(L, "L")
    check_square(L, "L")
    nb = check_tile_size(tile_size) or default_tile_size(L.shape[-1], L.dtype)
    if L.shape[-1] == 0:
        return L
    return _inverse_program(L, nb)


def _mvn_composed(r: jax.Array, cov: jax.Array, backend: Backend, nb: int | None) -> jax.Array:
    """log N(r | 0, cov) differentiated through the Cholesky adjoint (no custom rule)."""
    L, _ = chol(cov, backend, nb)
    return gaussian_value(r, L)[0]


def mvn_logpdf(
    y: ArrayLike,
    mean: ArrayLike,
    cov: ArrayLike,
    *,
    tile_size: int | None = None,
    backend: str | Backend = "auto",
    gradient: str = "auto",
) -> jax.Array:
    r"""Log-density of ``y`` under the multivariate normal ``N(mean, cov)``.

    .. math::
        \log p(y) = -\tfrac12 (y-\mu)^T K^{-1} (y-\mu) - \tfrac12 \log\det K
        - \tfrac{n}{2}\log 2\pi

    ``cov`` is symmetrized, ``(K + K^T)/2``. Differentiable in ``y``, ``mean`` and ``cov``
    (both modes). Batch dimensions broadcast: ``y`` and ``mean`` are ``(..., n)``, ``cov``
    is ``(..., n, n)``; the covariance is factored at its own batch shape.

    Args:
        y: ``(..., n)`` observations.
        mean: ``(..., n)`` mean, or a scalar. A Python number is weakly typed: it does
            not change the result's dtype (float32 ``y`` and ``cov`` give float32).
        cov: ``(..., n, n)`` symmetric positive-definite covariance.
        tile_size: block size for the factorization and its derivative.
        backend: Cholesky backend (see :func:`gpchol.cholesky`).
        gradient: ``"whole"`` uses the whole-likelihood rule
            ``Kbar = (alpha alpha^T - K^-1)/2`` with a tiled inverse; ``"composed"``
            differentiates through the Cholesky adjoint; ``"auto"`` picks the faster one
            as measured by ``benchmarks/bench_linalg.py``: ``"whole"`` on the CPU (where
            ``K^-1`` comes from LAPACK ``potri``), ``"composed"`` on GPUs.

    Returns:
        ``(...)`` log-densities, in the dtype ``y``, ``mean`` and ``cov`` promote to (a
        Python number as ``mean`` does not promote); NaN where ``cov`` is not positive
        definite.

    Example:
        >>> import jax.numpy as jnp, gpchol
        >>> float(gpchol.mvn_logpdf(jnp.zeros(2), 0.0, jnp.eye(2)))  # -log(2 pi)
        -1.8378770351409912
    """
    if gradient not in ("auto", "whole", "composed"):
        raise ValueError(f"gradient must be 'auto', 'whole' or 'composed'; got {gradient!r}.")
    cov, nb, be = prepare(cov, tile_size, backend, name="cov")
    y = _one_device(y, "y")
    mean = _operand(mean, "mean")
    n = cov.shape[-1]
    if y.ndim == 0 or y.shape[-1] != n:
        raise ValueError(
            f"y has shape {tuple(y.shape)} but cov is {n}x{n}: y needs shape (..., {n})."
        )
    if mean.ndim > 0 and mean.shape[-1] not in (1, n):
        raise ValueError(
            f"mean has shape {tuple(mean.shape)} but cov is {n}x{n}: mean needs shape "
            f"(..., {n}) or must be a scalar."
        )
    mode = gradient
    if gradient == "auto":
        mode = "whole" if be.whole_rule_default and array_platform(cov) == "cpu" else "composed"
    return _mvn_program(y, mean, cov, be, nb, mode)


# The functions above validate their arguments in Python, then run one compiled program
# per static choice and shape: eager calls (and eager gradients, whose tangent is then
# transposed as one program) compile a program each instead of one per operation; inside
# a caller's jit each is a nested call, which XLA inlines.


@partial(jax.jit, static_argnums=(2, 3, 4))
def _solve_program(L: jax.Array, b: jax.Array, lower: bool, trans: bool, vec: bool) -> jax.Array:
    L, b = _common_dtype(L, b[..., None] if vec else b)
    x = trsm(L, b, left=True, lower=lower, trans=trans)
    return x[..., 0] if vec else x


@partial(jax.jit, static_argnums=(2,))
def _cho_solve_program(L: jax.Array, b: jax.Array, vec: bool) -> jax.Array:
    L, b = _common_dtype(L, b[..., None] if vec else b)
    x = trsm(L, trsm(L, b, left=True), left=True, trans=True)
    return x[..., 0] if vec else x


@jax.jit
def _logdet_program(L: jax.Array) -> jax.Array:
    return 2.0 * jnp.sum(jnp.log(jnp.diagonal(L, axis1=-2, axis2=-1)), axis=-1)


@partial(jax.jit, static_argnums=(1,))
def _inverse_program(L: jax.Array, nb: int) -> jax.Array:
    return inverse_from_factor(jnp.tril(L), nb)


@partial(jax.jit, static_argnums=(3, 4, 5))
def _mvn_program(
    y: jax.Array, mean: jax.Array, cov: jax.Array, be: Backend, nb: int | None, mode: str
) -> jax.Array:
    y, mean, cov = _common_dtype(y, mean, cov)
    r = y - mean
    cov = symmetric_part(cov)
    n = cov.shape[-1]
    if n == 0:
        return jnp.zeros(jnp.broadcast_shapes(r.shape[:-1], cov.shape[:-2]), cov.dtype)
    batch = jnp.broadcast_shapes(r.shape[:-1], cov.shape[:-2])
    r = jnp.broadcast_to(r, batch + (n,))
    if mode == "whole":
        # cov = (A + A^T) / 2 above: symmetric bit for bit
        return gaussian_loglik(DenseCovariance(cov, symmetric=True), r, GaussianRule(be, nb))[0]
    return _mvn_composed(r, cov, be, nb)
