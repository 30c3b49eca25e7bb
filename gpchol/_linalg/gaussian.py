r"""The one Gaussian whole-likelihood rule of the package.

For ``log p = log N(r | 0, K)`` with ``K = L L^T`` and ``alpha = K^-1 r``, the derivative
(Rasmussen & Williams 2006, eq. 5.9) is::

    d logp = -alpha . dr + < W, dK >,      W = (alpha alpha^T - K^-1) / 2,

i.e. ``rbar = -alpha`` and ``Kbar = (alpha alpha^T - K^-1) / 2``: one factorization, two
solves and the inverse from the factor (LAPACK ``potri`` on the CPU, the tiled inverse
elsewhere), about ``n^3`` flops in all, against ~4 ``n^3`` for JAX's transposed Cholesky JVP.

:func:`gaussian_loglik` is the only place this rule is written. Its callers differ in
where ``K`` comes from and how ``<W, dK>`` is contracted, which a *covariance source*
says (any pytree with two methods):

* ``build(dtype, jitter) -> K`` builds the ``(..., n, n)`` covariance (``jitter`` added to
  its diagonal). It is called again to locate a failed pivot, so a source that builds
  ``K`` on the fly (the GP) never keeps it alive;
* ``contract(source_dot, alpha, kinv) -> <W, dK>`` with ``source_dot`` the source's
  tangent, its leaves that are not differentiated left as symbolic zeros (see
  :func:`is_symbolic_zero`): a dense matrix contracts the whole ``dK``
  (:class:`DenseCovariance`), the GP re-evaluates its kernel (by tiles of the lower
  triangle at larger ``n``, so that no ``n x n`` kernel intermediate is stored;
  ``gpchol._gp``).

On the CPU with gpchol's compiled handlers the factorization and the two solves are one
LAPACK call at every ``n`` (its ``info`` is the status: no search), and ``K^-1`` is LAPACK
``potri`` from ``n = 32`` on: at small ``n`` the cost is the number of operations, not
their flops. Higher derivatives differentiate that call by JAX's own rules.

The options (:class:`GaussianRule`) are the backend (host LAPACK factors in place on the
CPU when the backend allows it), the tile size, a jitter schedule (``K + j I`` tried in
order, a retry rebuilds ``K``), and ``guarded``: ``-inf`` with an exact zero gradient where
``K`` does not factor (what a sampler needs), instead of NaN.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gpchol._base.platform import platform_dependent
from gpchol._linalg.backends import Backend
from gpchol._linalg.blocks import default_tile_size
from gpchol._linalg.cholesky import first_factoring
from gpchol._linalg.host_lapack import chol_solve_cpu, compiled_lapack
from gpchol._linalg.inverse import inverse_from_factor
from gpchol._linalg.status import exact_status
from gpchol._linalg.triangular import cholesky, triangular_solve

__all__ = [
    "LOG_2PI",
    "DenseCovariance",
    "GaussianRule",
    "gaussian_factor",
    "gaussian_loglik",
    "gaussian_value",
    "is_symbolic_zero",
    "padded_rows_as_identity",
]

LOG_2PI = math.log(2.0 * math.pi)


def padded_rows_as_identity(
    K: jax.Array, mask_rows: jax.Array, mask_cols: jax.Array, on_diagonal: jax.Array
) -> jax.Array:
    """A block of the covariance with padded points (mask False) as identity rows and
    columns: the covariance is then block diagonal (the real points' block, and ``I``), so
    a padded point adds a zero residual and a zero log-determinant, and no tangent."""
    real = mask_rows[:, None] & mask_cols[None, :]
    return jnp.where(real, K, on_diagonal.astype(K.dtype))


def gaussian_value(r: jax.Array, L: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(log N(r | 0, L L^T), alpha)`` with ``alpha = (L L^T)^-1 r``.

    Args:
        r: ``(..., n)`` residuals.
        L: ``(..., n, n)`` lower factor (batch dimensions broadcast against ``r``'s).

    Returns:
        ``(...)`` log-densities and ``(..., n)`` ``alpha``.

    The solves use ``L`` as the factorization laid it out (no relayout copy).
    """
    n = L.shape[-1]
    batch = r.shape[:-1]
    if L.shape[:-2] != batch:
        L = jnp.broadcast_to(L, batch + L.shape[-2:])
    z = triangular_solve(L, r[..., None], left_side=True, lower=True)
    alpha = triangular_solve(L, z, left_side=True, lower=True, transpose_a=True)[..., 0]
    ld = 2.0 * jnp.sum(jnp.log(jnp.diagonal(L, axis1=-2, axis2=-1)), axis=-1)
    return -0.5 * (jnp.sum(z[..., 0] ** 2, axis=-1) + ld + n * LOG_2PI), alpha


def is_symbolic_zero(z: object) -> bool:
    """True for a symbolic-zero tangent (``custom_jvp(..., symbolic_zeros=True)``)."""
    return isinstance(z, jax.custom_derivatives.SymbolicZero)


def _instantiate(tree: Any) -> Any:
    return jax.tree.map(
        lambda z: jnp.zeros(z.aval.shape, z.aval.dtype) if is_symbolic_zero(z) else z,
        tree,
        is_leaf=is_symbolic_zero,
    )


@jax.tree_util.register_pytree_node_class
class DenseCovariance:
    """A covariance source holding the matrix itself: ``(..., n, n)`` symmetric ``K``.

    ``symmetric=True`` promises that ``cov`` equals its transpose bit for bit (e.g. it was
    made as ``(A + A^T) / 2``): the host LAPACK call then skips a relayout pass (its
    result is the same).
    """

    def __init__(self, cov: jax.Array, symmetric: bool = False) -> None:
        self.cov = cov
        self.symmetric = symmetric

    def tree_flatten(self) -> tuple[tuple[jax.Array], bool]:
        return (self.cov,), self.symmetric

    @classmethod
    def tree_unflatten(cls, aux: bool, children: tuple[jax.Array]) -> DenseCovariance:
        return cls(*children, symmetric=aux)

    def build(self, dtype: Any, jitter: float) -> jax.Array:
        K = self.cov.astype(dtype)
        if jitter:
            K = K + jnp.asarray(jitter, dtype) * jnp.eye(K.shape[-1], dtype=dtype)
        return K

    def contract(self, source_dot: DenseCovariance, alpha: jax.Array, kinv: jax.Array) -> jax.Array:
        """``<W, dK> = alpha^T dK alpha / 2 - <K^-1, dK> / 2`` (``W`` never formed)."""
        dK = _instantiate(source_dot).cov
        quad = jnp.einsum("...i,...ij,...j->...", alpha, dK, alpha)
        return 0.5 * quad - 0.5 * jnp.sum(kinv * dK, axis=(-2, -1))


@dataclasses.dataclass(frozen=True)
class GaussianRule:
    """Static options of :func:`gaussian_loglik`.

    Attributes:
        backend: the factorization :class:`~gpchol._linalg.backends.Backend`.
        nb: tile size (``None``: the backend's or the default).
        jitter: ``None`` or a schedule ``(j0, j1, ...)`` tried in order.
        guarded: ``-inf`` and a zero gradient where ``K`` does not factor (else NaN).
    """

    backend: Backend
    nb: int | None = None
    jitter: tuple[float, ...] | None = None
    guarded: bool = False


def _factor(K: jax.Array, rebuild: Any, rule: GaussianRule) -> tuple[jax.Array, jax.Array]:
    """``(L, status)`` of ``K`` on the device, ``K`` not kept for the status search.

    With a backend that XLA's LAPACK serves, ``K`` is factored in place and a failed pivot
    is located in a matrix rebuilt by ``rebuild()``; other backends use their forward.
    """
    if K.shape[-1] == 0:
        return K, jnp.zeros(K.shape[:-2], jnp.int32)
    if not rule.backend.host_lapack:
        return rule.backend.forward(K, rule.nb, rebuild=rebuild)
    L = cholesky(K)
    failed = ~jnp.all(jnp.isfinite(jnp.diagonal(L, axis1=-2, axis2=-1)), axis=-1)
    nb = rule.nb or default_tile_size(K.shape[-1], K.dtype)
    return L, exact_status(failed, rebuild, nb)


def _forward(
    source: Any, r: jax.Array, rule: GaussianRule
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``(L, value, alpha, status)`` of the source's covariance, trying the jitters."""
    return gaussian_factor(source, r, rule)[:4]


def _xla_solve(K: jax.Array, r: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(L, value, alpha)`` in XLA operations (JAX's own derivative rules)."""
    L = cholesky(K)
    value, alpha = gaussian_value(r, L)
    return L, value, alpha


@partial(jax.custom_jvp, nondiff_argnums=(2,))
def _host_solve(K: jax.Array, r: jax.Array, symmetric: bool) -> tuple[jax.Array, ...]:
    """``(L, value, alpha, status)`` by one LAPACK factor-and-solve call, in place."""
    L, alpha, quad, logdet, status = chol_solve_cpu(K, r, symmetric=symmetric)
    return L, -0.5 * (quad + logdet + r.shape[-1] * LOG_2PI), alpha, status


@_host_solve.defjvp
def _host_solve_jvp(
    symmetric: bool,
    primals: tuple[jax.Array, jax.Array],
    tangents: tuple[jax.Array, jax.Array],
) -> tuple[tuple[jax.Array, ...], tuple[Any, ...]]:
    # The LAPACK call's derivative is that of the same arithmetic in XLA operations (JAX's
    # Cholesky and triangular-solve rules). First-order derivatives never come here (the
    # whole-likelihood rule below evaluates the forward pass on primals); higher orders
    # (a Hessian of the likelihood) differentiate that rule, and so this call, through it.
    out = _host_solve(*primals, symmetric)
    _, (dL, dv, da) = jax.jvp(_xla_solve, primals, tangents)
    return out, (dL, dv, da, np.zeros(out[3].shape, jax.dtypes.float0))


def gaussian_factor(
    source: Any, r: jax.Array, rule: GaussianRule
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """``(L, value, alpha, status, jitter_used)`` of the source's covariance (not differentiable).

    The forward pass of :func:`gaussian_loglik` (``K`` built by ``source.build``, factored
    in place, the jitter schedule tried in order), with the factor and ``alpha = K^-1 r``
    kept: what a posterior holds. ``jitter_used`` is the jitter of the kept attempt.

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol._linalg.backends import backend
        >>> out = gaussian_factor(DenseCovariance(4.0 * jnp.eye(2)), jnp.ones(2),
        ...                       GaussianRule(backend("xla")))
        >>> out[0].tolist(), out[2].tolist(), int(out[3])
        ([[2.0, 0.0], [0.0, 2.0]], [0.25, 0.25], 0)
    """
    dtype = r.dtype
    n = r.shape[-1]
    symmetric = bool(getattr(source, "symmetric", False))

    def attempt(j: float) -> tuple[jax.Array, ...]:
        K = source.build(dtype, j)

        def rebuild() -> jax.Array:
            return source.build(dtype, j)

        def device(K: jax.Array, r: jax.Array) -> tuple[jax.Array, ...]:
            L, status = _factor(K, rebuild, rule)
            value, alpha = gaussian_value(r, L)
            return L, value, alpha, status

        def host(K: jax.Array, r: jax.Array) -> tuple[jax.Array, ...]:
            # row-major: column-major costs more at large n (design-measurements.md)
            return _host_solve(K, r, symmetric)

        # At every n: one LAPACK call factors, solves and gives the status (no status
        # search as after XLA's potrf; benchmarks/results/design-measurements.md).
        if (
            rule.backend.host_lapack
            and compiled_lapack()
            and n >= 1
            and r.shape[:-1] == K.shape[:-2]
            and dtype in (jnp.float32, jnp.float64)
        ):
            return platform_dependent(K, r, cpu=host, default=device)
        return device(K, r)

    def tried(j: float) -> tuple[jax.Array, ...]:
        return (*attempt(j), jnp.full(r.shape[:-1], j, dtype))

    L, value, alpha, status, used = first_factoring(tried, rule.jitter or (0.0,), 3)
    ok = status == 0
    if rule.guarded:
        eye = jnp.eye(n, dtype=L.dtype)
        L = jnp.where(ok[..., None, None], L, eye)
        alpha = jnp.where(ok[..., None], alpha, 0.0)
        value = jnp.where(ok, value, -jnp.inf)
    else:
        value = jnp.where(ok, value, jnp.nan)
    return L, value, alpha, status, used


@partial(jax.custom_jvp, nondiff_argnums=(2,))
def gaussian_loglik(source: Any, r: jax.Array, rule: GaussianRule) -> tuple[jax.Array, jax.Array]:
    """``(log N(r | 0, K), status)`` with ``K = source.build(...)`` and the whole rule.

    Args:
        source: a covariance source (see the module docstring), e.g.
            ``DenseCovariance(K)``; differentiable.
        r: ``(..., n)`` residuals ``y - mean``; differentiable.
        rule: the static :class:`GaussianRule`.

    Returns:
        ``(...)`` log-densities (NaN, or ``-inf`` when guarded, where ``K`` does not
        factor for any jitter) and the int32 LAPACK status of the last attempt.

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol._linalg.backends import backend
        >>> rule = GaussianRule(backend("xla"))
        >>> value, status = gaussian_loglik(DenseCovariance(jnp.eye(2)), jnp.zeros(2), rule)
        >>> round(float(value), 6), int(status)  # -log(2 pi)
        (-1.837877, 0)
    """
    _, value, _, status = _forward(source, r, rule)
    return value, status


def _gaussian_loglik_jvp(
    rule: GaussianRule, primals: tuple[Any, jax.Array], tangents: tuple[Any, Any]
) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, Any]]:  # Any: a float0 array
    # d logp = -alpha . dr + <W, dK>, W = (alpha alpha^T - K^-1) / 2 (R&W 2006, eq. 5.9),
    # written linear in the tangents so JAX transposes it for reverse mode. Symbolic-zero
    # tangents are skipped: K^-1 is not formed when only r is differentiated.
    source, r = primals
    source_dot, r_dot = tangents
    L, value, alpha, status = _forward(source, r, rule)
    out = jnp.zeros_like(value)
    if not is_symbolic_zero(r_dot):
        out = out - jnp.sum(alpha * r_dot, axis=-1)
    if not all(is_symbolic_zero(z) for z in jax.tree.leaves(source_dot, is_leaf=is_symbolic_zero)):
        nb = rule.nb or default_tile_size(L.shape[-1], L.dtype)
        kinv = inverse_from_factor(L, nb)
        out = out + source.contract(source_dot, alpha, kinv).astype(out.dtype)
    if rule.guarded:
        out = jnp.where(status == 0, out, 0.0)
    float0 = np.zeros(status.shape, jax.dtypes.float0)
    return (value, status), (out, float0)


gaussian_loglik.defjvp(_gaussian_loglik_jvp, symbolic_zeros=True)
