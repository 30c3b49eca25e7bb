"""Solves, log-determinant, inverse and Gaussian log-density on top of the Cholesky factor.

All functions take batch dimensions and are differentiable in every array argument.
:func:`mvn_logpdf` has its own whole-likelihood derivative rule (see :func:`_mvn_core`).
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp

from gpchol._base.validate import as_float_array, check_square, check_tile_size
from gpchol._linalg.cholesky import (
    _array_platform,
    _blocks,
    _chol,
    _mT,
    _prepare,
    _put,
    _symmetrize,
    _trsm,
    default_tile_size,
)
from gpchol._linalg.host_lapack import HOST_MIN_N, cho_inverse_cpu, chol_solve_cpu

__all__ = ["cho_inverse", "cho_solve", "logdet", "mvn_logpdf", "solve_triangular"]


def _rhs(L, b, name="b"):
    """Validate ``b`` against ``L``; return ``(b as (..., n, k), was_vector)``."""
    b = as_float_array(b, name)
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
        return b[..., None], True
    if b.shape[-2] != n:
        raise ValueError(
            f"{name} has shape {tuple(b.shape)}, but the factor is {n}x{n}: a matrix "
            f"right-hand side needs shape (..., {n}, k)."
        )
    return b, False


def _common_dtype(*xs):
    dt = jnp.result_type(*xs)
    return tuple(x.astype(dt) for x in xs)


def solve_triangular(L, b, *, lower=True, transpose=False):
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
    L = as_float_array(L, "L")
    check_square(L, "L")
    b, vec = _rhs(L, b)
    L, b = _common_dtype(L, b)
    x = _trsm(L, b, left=True, lower=lower, trans=transpose)
    return x[..., 0] if vec else x


def cho_solve(L, b):
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
    L = as_float_array(L, "L")
    check_square(L, "L")
    b, vec = _rhs(L, b)
    L, b = _common_dtype(L, b)
    x = _trsm(L, _trsm(L, b, left=True), left=True, trans=True)
    return x[..., 0] if vec else x


def logdet(L):
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
    L = as_float_array(L, "L")
    check_square(L, "L")
    return 2.0 * jnp.sum(jnp.log(jnp.diagonal(L, axis1=-2, axis2=-1)), axis=-1)


# ----------------------------------------------------------------------------------------
# Inverse from the factor (tiled trtri + lauum)
# ----------------------------------------------------------------------------------------


def _trtri_blocked(L, nb):
    """``L^-1`` for lower-triangular ``L`` by blocks from the last to the first.

    For block column ``j:k``: ``W_jj = L_jj^-1``; ``W[k:, j:k] = -W[k:, k:] L[k:, j:k]
    W_jj``. About ``n^3 / 3`` useful flops (the GEMM runs on the full trailing block).
    """
    n = L.shape[-1]
    w = jnp.zeros_like(L)
    for j, k in reversed(_blocks(n, nb)):
        eye = jnp.broadcast_to(jnp.eye(k - j, dtype=L.dtype), L.shape[:-2] + (k - j, k - j))
        wjj = _trsm(L[..., j:k, j:k], eye, left=True)
        w = _put(w, wjj, j, j)
        if k < n:
            panel = -(w[..., k:, k:] @ L[..., k:, j:k]) @ wjj
            w = _put(w, panel, k, j)
    return w


def _lauum_lower(W, nb):
    """``W^T W`` for lower-triangular ``W``, lower block columns computed, then mirrored."""
    n = W.shape[-1]
    out = jnp.zeros_like(W)
    for j, k in _blocks(n, nb):
        col = _mT(W[..., j:, j:]) @ W[..., j:, j:k]  # rows j:, cols j:k of W^T W
        out = _put(out, col, j, j)
    low = jnp.tril(out)
    return low + _mT(jnp.tril(low, -1))


def _cho_inverse_tiled(L, nb):
    return _lauum_lower(_trtri_blocked(L, nb), nb)


def _cho_inverse(L, nb, *, column_major=False):
    """``A^-1`` from the lower factor: LAPACK ``potri`` on the CPU, tiled elsewhere."""
    return cho_inverse_cpu(L, partial(_cho_inverse_tiled, nb=nb), column_major=column_major)


def cho_inverse(L, *, tile_size=None):
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
    L = as_float_array(L, "L")
    check_square(L, "L")
    nb = check_tile_size(tile_size) or default_tile_size(L.shape[-1], L.dtype)
    if L.shape[-1] == 0:
        return L
    return _cho_inverse(jnp.tril(L), nb)


# ----------------------------------------------------------------------------------------
# Gaussian log-density
# ----------------------------------------------------------------------------------------

_LOG_2PI = math.log(2.0 * math.pi)


def _mvn_value(r, L):
    """``(value, alpha)``: log N(r | 0, L L^T) and ``alpha = (L L^T)^-1 r``."""
    n = L.shape[-1]
    z = _trsm(L, r[..., None], left=True)
    alpha = _trsm(L, z, left=True, trans=True)[..., 0]
    quad = jnp.sum(z[..., 0] ** 2, axis=-1)
    ld = 2.0 * jnp.sum(jnp.log(jnp.diagonal(L, axis1=-2, axis2=-1)), axis=-1)
    return -0.5 * (quad + ld + n * _LOG_2PI), alpha


def _mvn_forward(r, cov, backend, nb):
    """``(L, value, alpha)`` for the whole-likelihood rule.

    On the CPU (XLA backend, ``r`` and ``cov`` of one batch shape) one host LAPACK call
    factors and solves (:func:`gpchol._linalg.host_lapack.chol_solve_cpu`): no status search,
    NaN mask or relayout pass over ``n x n`` buffers, and the row-major factor goes to
    ``potri`` as it is. Elsewhere: :func:`gpchol._linalg.cholesky._chol` and two solves.
    """
    n = cov.shape[-1]

    def device(r, cov):
        L, _ = _chol(cov, backend, nb)
        value, alpha = _mvn_value(r, L)
        return L, value, alpha

    def host(r, cov):
        L, alpha, quad, logdet, _ = chol_solve_cpu(cov, r)
        return L, -0.5 * (quad + logdet + n * _LOG_2PI), alpha

    if (
        backend != "xla"
        or n < HOST_MIN_N
        or r.shape[:-1] != cov.shape[:-2]
        or cov.dtype not in (jnp.float32, jnp.float64)
    ):
        return device(r, cov)
    return jax.lax.platform_dependent(r, cov, cpu=host, default=device)


@partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _mvn_core(r, cov, backend, nb):
    """log N(r | 0, cov) for symmetric ``cov``, with the whole-likelihood derivative rule.

    Derivative (e.g. Rasmussen & Williams 2006, eq. 5.9), with ``alpha = K^-1 r``::

        d logp = -alpha . dr + < (alpha alpha^T - K^-1) / 2, dK >

    The JVP rule below states it as a linear function of the tangents; JAX transposes it
    for reverse mode into ``rbar = -alpha * g`` and ``Kbar = g (alpha alpha^T - K^-1) / 2``,
    with ``K^-1`` from the factor by the tiled inverse (:func:`_cho_inverse`). When the
    covariance tangent is a symbolic zero (differentiating in ``r`` only) ``K^-1`` is not
    formed.
    """
    return _mvn_forward(r, cov, backend, nb)[1]


@_mvn_core.defjvp
def _mvn_core_jvp(backend, nb, primals, tangents):
    r, cov = primals
    r_dot, cov_dot = tangents
    L, value, alpha = _mvn_forward(r, cov, backend, nb)
    return value, _whole_tangent(L, alpha, r_dot, cov_dot, nb)


def _whole_tangent(L, alpha, r_dot, cov_dot, nb):
    """Tangent of ``log N(r | 0, K)``: ``-alpha . dr + alpha^T dK alpha / 2 - <K^-1, dK> / 2``.

    The whole-likelihood rule's JVP (R&W 2006, eq. 5.9), shared by every Gaussian
    likelihood of the package. Symbolic-zero tangents are skipped (``K^-1`` is not formed
    when only ``r`` is differentiated). ``L`` is the factor of ``K``, ``alpha = K^-1 r``.
    """
    out = jnp.zeros(alpha.shape[:-1], alpha.dtype)
    if not isinstance(r_dot, jax.custom_derivatives.SymbolicZero):
        out = out - jnp.sum(alpha * r_dot, axis=-1)
    if not isinstance(cov_dot, jax.custom_derivatives.SymbolicZero):
        kinv = _cho_inverse(L, nb or default_tile_size(L.shape[-1], L.dtype))
        quad = jnp.einsum("...i,...ij,...j->...", alpha, cov_dot, alpha)
        out = out + 0.5 * quad - 0.5 * jnp.sum(kinv * cov_dot, axis=(-2, -1))
    return out


_mvn_core.defjvp(_mvn_core_jvp, symbolic_zeros=True)


def _mvn_composed(r, cov, backend, nb):
    """log N(r | 0, cov) differentiated through the Cholesky adjoint (no custom rule)."""
    L, _ = _chol(cov, backend, nb)
    return _mvn_value(r, L)[0]


def mvn_logpdf(y, mean, cov, *, tile_size=None, backend="auto", gradient="auto"):
    r"""Log-density of ``y`` under the multivariate normal ``N(mean, cov)``.

    .. math::
        \log p(y) = -\tfrac12 (y-\mu)^T K^{-1} (y-\mu) - \tfrac12 \log\det K
        - \tfrac{n}{2}\log 2\pi

    ``cov`` is symmetrized, ``(K + K^T)/2``. Differentiable in ``y``, ``mean`` and ``cov``
    (both modes). Batch dimensions broadcast: ``y`` and ``mean`` are ``(..., n)``, ``cov``
    is ``(..., n, n)``; the covariance is factored at its own batch shape.

    Args:
        y: ``(..., n)`` observations.
        mean: ``(..., n)`` mean, or a scalar.
        cov: ``(..., n, n)`` symmetric positive-definite covariance.
        tile_size: block size for the factorization and its derivative.
        backend: Cholesky backend (see :func:`gpchol.cholesky`).
        gradient: ``"whole"`` uses the whole-likelihood rule
            ``Kbar = (alpha alpha^T - K^-1)/2`` with a tiled inverse; ``"composed"``
            differentiates through the Cholesky adjoint; ``"auto"`` picks the faster one
            as measured by ``benchmarks/bench_linalg.py``: ``"whole"`` on the CPU (where
            ``K^-1`` comes from LAPACK ``potri``), ``"composed"`` on GPUs.

    Returns:
        ``(...)`` log-densities; NaN where ``cov`` is not positive definite.

    Example:
        >>> import jax.numpy as jnp, gpchol
        >>> float(gpchol.mvn_logpdf(jnp.zeros(2), 0.0, jnp.eye(2)))  # -log(2 pi)
        -1.8378770351409912
    """
    if gradient not in ("auto", "whole", "composed"):
        raise ValueError(f"gradient must be 'auto', 'whole' or 'composed'; got {gradient!r}.")
    cov, nb, be = _prepare(cov, tile_size, backend, name="cov")
    y = as_float_array(y, "y")
    mean = as_float_array(mean, "mean")
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
    y, mean, cov = _common_dtype(y, mean, cov)
    r = y - mean
    cov = _symmetrize(cov)
    if n == 0:
        return jnp.zeros(jnp.broadcast_shapes(r.shape[:-1], cov.shape[:-2]), cov.dtype)
    batch = jnp.broadcast_shapes(r.shape[:-1], cov.shape[:-2])
    r = jnp.broadcast_to(r, batch + (n,))
    mode = gradient
    if gradient == "auto":
        mode = "whole" if be != "cuda" and _array_platform(cov) == "cpu" else "composed"
    if mode == "whole":
        return _mvn_core(r, cov, be, nb)
    return _mvn_composed(r, cov, be, nb)
