r"""NumPyro distributions on gpchol's differentiable Cholesky (for NUTS and SVI).

Import this module explicitly (``import gpchol.numpyro``); importing :mod:`gpchol` alone
never imports NumPyro.

* :class:`MultivariateNormal`: a drop-in replacement for
  ``numpyro.distributions.MultivariateNormal`` (same constraints, shapes, broadcasting,
  pytree behaviour and ``validate_args`` checks) whose factorization is
  :func:`gpchol.cholesky`'s and whose reverse-mode derivative is gpchol's blocked Murray
  adjoint (about ``2 n^3 / 3`` flops) instead of JAX's transposed JVP (about ``4 n^3``).
* :class:`GaussianProcessMarginal`: the marginal ``N(m(X), k(X, X) + noise I)`` of a GP
  with Gaussian noise at inputs ``X``, for ``numpyro.sample("y", ..., obs=y)``.
  Its :meth:`~GaussianProcessMarginal.predict` records the posterior predictive at test
  inputs as a sample site, so ``numpyro.infer.Predictive`` draws ``f(Xs)`` (or ``y(Xs)``)
  for a whole batch of posterior hyperparameter draws at once.
* :func:`latent_gp`: a non-centred latent GP ``f = m(X) + L z``, ``z ~ N(0, I)``, for
  non-Gaussian likelihoods.

Failed factorizations inside a sampler. When a covariance (or precision) matrix is not
numerically positive definite, gpchol's factor is NaN. These distributions do not let
that NaN reach the sampler: ``log_prob`` is ``-inf`` for that batch element, so NUTS/HMC
treats the step as divergent and rejects it, and its gradient is exactly zero (finite),
so neither the momentum nor the step-size adaptation is poisoned. This is done with a
"double where": the factor is replaced by the identity before anything is computed from
it, and the cotangents flowing back into the factorization are masked, so the Murray
adjoint never sees a NaN factor. ``sample``, ``scale_tril`` and ``entropy`` of a failed
element are NaN (there is no such distribution). A ``scale_tril`` given by the user is
used as is, like NumPyro does. (NumPyro >= 0.22 validates concrete parameters by default,
so a non-PD matrix given as a concrete array -- eagerly, under an eager ``jax.grad``, or
closed over inside ``jit`` -- raises ``ValueError`` in the constructor, as NumPyro's own
class does; inside NUTS/HMC/SVI, and for any argument of a jitted function, the
parameters are tracers, validation is skipped and the ``-inf`` rule applies. Pass
``validate_args=False`` to get it for concrete arrays.)

Example:
    >>> import jax, jax.numpy as jnp
    >>> import gpchol.numpyro as gnp
    >>> d = gnp.MultivariateNormal(jnp.zeros(2), jnp.array([[2.0, 0.5], [0.5, 1.0]]))
    >>> d.batch_shape, d.event_shape
    ((), (2,))
    >>> round(float(d.log_prob(jnp.zeros(2))), 4)
    -2.1177
    >>> not_pd = jnp.array([[1.0, 2.0], [2.0, 1.0]])
    >>> bad = gnp.MultivariateNormal(jnp.zeros(2), not_pd, validate_args=False)
    >>> float(bad.log_prob(jnp.zeros(2)))
    -inf
    >>> def logp(c):
    ...     return gnp.MultivariateNormal(0.0, c, validate_args=False).log_prob(jnp.zeros(2))
    >>> jax.grad(logp)(not_pd).tolist()
    [[0.0, 0.0], [0.0, 0.0]]
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from jax import lax, random
from jax.typing import ArrayLike, DTypeLike
from numpyro.distributions import constraints
from numpyro.distributions.batch_util import vmap_over
from numpyro.distributions.distribution import Distribution
from numpyro.distributions.util import lazy_property, validate_sample

from gpchol._base.validate import as_inputs, check_jitter, check_scalar_or_vector, is_concrete
from gpchol._gp import GaussianProcess, Posterior
from gpchol._linalg.backends import Backend, array_platform, prepare
from gpchol._linalg.blocks import mT, symmetric_part
from gpchol._linalg.cholesky import guarded_chol
from gpchol._linalg.gaussian import LOG_2PI, DenseCovariance, GaussianRule, gaussian_loglik
from gpchol._linalg.posterior_core import (
    SAMPLE_JITTER,
    relative_factor,
    relative_jitters,
    warn_if_failed,
)
from gpchol._linalg.solve import cho_inverse, solve_triangular
from gpchol.distributed import ShardedPosterior, gaussian_log_likelihood
from gpchol.kernels import Kernel
from gpchol.means import as_mean

__all__ = ["GaussianProcessMarginal", "MultivariateNormal", "latent_gp"]


@partial(jax.jit, static_argnums=(1, 2))
def _factor_jit(a: jax.Array, backend: Backend, nb: int | None) -> tuple[jax.Array, jax.Array]:
    # One compiled program per shape in eager use (inlined under an outer jit).
    return guarded_chol(symmetric_part(a), backend, nb)


def _factor(a: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Symmetrize ``a`` and factor it with the guarded gpchol Cholesky."""
    if a.shape[-1] == 0:
        return a, jnp.ones(a.shape[:-2], bool)
    a, nb, be = prepare(a, None, "auto", name="covariance")
    return _factor_jit(a, be, nb)


# ----------------------------------------------------------------------------------------
# Shape helpers
# ----------------------------------------------------------------------------------------


def _as_float(x: ArrayLike, name: str) -> jax.Array:
    """``x`` as a real floating array (integers and booleans cast, as NumPyro takes them)."""
    dtype = np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype
    if dtype.kind not in "biuf":
        what = "complex" if dtype.kind == "c" else "not numeric"
        raise TypeError(
            f"{name} must be a real numeric array; got dtype {dtype} ({what}): "
            f"pass e.g. `jnp.asarray({name}, jnp.float32)`."
        )
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    return x


def _mvn_params(loc: Any, matrix: Any, kind: str) -> tuple[jax.Array, jax.Array]:
    """Check and promote ``loc`` and the ``(..., n, n)`` matrix to a common rank."""
    matrix = _as_float(matrix, kind)
    if matrix.ndim < 2 or matrix.shape[-1] != matrix.shape[-2]:
        raise ValueError(f"{kind} must have shape (..., n, n); got shape {tuple(matrix.shape)}.")
    loc = _as_float(loc, "loc")
    if loc.ndim == 0:
        loc = loc[None]
    n = matrix.shape[-1]
    if loc.shape[-1] not in (1, n):
        raise ValueError(
            f"loc has shape {tuple(loc.shape)} but {kind} is {n}x{n}: loc needs shape "
            f"(..., {n}) (or (..., 1), or a scalar)."
        )
    ndim = max(loc.ndim + 1, matrix.ndim)
    loc = _promote_rank(loc[..., None], ndim)[..., 0]
    return loc, _promote_rank(matrix, ndim)


def _promote_rank(x: jax.Array, ndim: int) -> jax.Array:
    """Prepend singleton dimensions to ``x`` up to ``ndim`` (NumPyro's ``promote_shapes``)."""
    return jnp.reshape(x, (1,) * (ndim - x.ndim) + x.shape) if x.ndim < ndim else x


def _sum_sq_columns(
    L: jax.Array, r: jax.Array, op: Callable[[jax.Array, jax.Array], jax.Array]
) -> jax.Array:
    """``sum((op(L', R'))**2 over n)`` for every vector of ``r``, without broadcasting ``L``.

    ``r`` has shape ``R + (n,)`` and ``L`` shape ``B + (n, n)`` with ``B`` broadcastable to
    ``R``. The batch axes of ``r`` along which ``L`` is constant (size 1 in ``L``) become
    right-hand-side columns, so one triangular solve handles all of them (e.g. the
    sample dimensions of a ``log_prob`` call) and ``L`` is never copied per sample.

    Returns:
        Shape ``broadcast(R, B)``.
    """
    n = r.shape[-1]
    lb = L.shape[:-2]
    rb = r.shape[:-1]
    nd = max(len(lb), len(rb))
    lb = (1,) * (nd - len(lb)) + lb
    rb = (1,) * (nd - len(rb)) + rb
    target = tuple(jnp.broadcast_shapes((a,), (b,))[0] for a, b in zip(lb, rb, strict=True))
    L = jnp.reshape(L, lb + (n, n))
    r = jnp.broadcast_to(jnp.reshape(r, rb + (n,)), target + (n,))
    col = [i for i in range(nd) if lb[i] == 1 and target[i] != 1]
    bat = [i for i in range(nd) if i not in col]
    bat_shape = tuple(target[i] for i in bat)
    col_shape = tuple(target[i] for i in col)
    rt = jnp.transpose(r, bat + [nd] + col).reshape(bat_shape + (n, math.prod(col_shape)))
    Lt = jnp.reshape(L, bat_shape + (n, n)) if bat_shape else jnp.reshape(L, (n, n))
    z = op(Lt, rt)
    m = jnp.sum(z * z, axis=-2).reshape(bat_shape + col_shape)
    return jnp.transpose(m, tuple(np.argsort(bat + col)))


def _solve_lower(L: jax.Array, b: jax.Array) -> jax.Array:
    return solve_triangular(L, b, lower=True)


def _upper_t_matmul(M: jax.Array, b: jax.Array) -> jax.Array:
    # M^T b with M lower triangular (the precision path: r^T P r = ||M^T r||^2).
    return mT(M) @ b


def _half_logdet(F: jax.Array, kind: str) -> jax.Array:
    """``log det(Sigma) / 2`` from the factor ``F`` of the given parametrization."""
    d = jnp.diagonal(F, axis1=-2, axis2=-1)
    if kind == "scale_tril":
        return jnp.sum(jnp.log(jnp.abs(d)), axis=-1)
    s = jnp.sum(jnp.log(d), axis=-1)
    return -s if kind == "precision_matrix" else s


# One program per parametrization and shapes: an eager log_prob (or its eager gradient)
# compiles it once instead of one small program per operation; a nested call, inlined by
# XLA, inside a caller's jit (NUTS, SVI).
@partial(jax.jit, static_argnums=(4,))
def _log_prob_program(
    F: jax.Array, ok: jax.Array | None, loc: jax.Array, value: jax.Array, kind: str
) -> jax.Array:
    """``log N(value | loc, Sigma)`` from the factor ``F`` (``-inf`` where ``ok`` is False)."""
    n = F.shape[-1]
    r = value - loc
    if kind == "precision_matrix":
        maha = _sum_sq_columns(F, r[..., ::-1], _upper_t_matmul)
    else:
        maha = _sum_sq_columns(F, r, _solve_lower)
    lp = -0.5 * maha - _half_logdet(F, kind) - 0.5 * n * LOG_2PI
    if ok is not None:
        lp = jnp.where(ok, lp, -jnp.inf)
    return lp


@partial(jax.jit, static_argnums=(3, 4))
def _whole_program(
    cov: jax.Array,
    value: jax.Array,
    loc: jax.Array,
    batch_shape: tuple[int, ...],
    rule: GaussianRule,
) -> jax.Array:
    """``log N(value | loc, cov)`` by the whole-likelihood rule (one observation each)."""
    n = cov.shape[-1]
    # in the promoted dtype, as the factor path and NumPyro (a float32 covariance with
    # float64 values is a float64 density)
    dtype = jnp.result_type(cov, value, loc)
    r = jnp.broadcast_to(value - loc, batch_shape + (n,)).astype(dtype)
    cov = symmetric_part(cov).astype(dtype)
    return gaussian_loglik(DenseCovariance(cov, symmetric=True), r, rule)[0]


# ----------------------------------------------------------------------------------------
# MultivariateNormal
# ----------------------------------------------------------------------------------------


class MultivariateNormal(Distribution):
    r"""Multivariate normal ``N(loc, Sigma)`` factored and differentiated by gpchol.

    Drop-in for ``numpyro.distributions.MultivariateNormal``: the same ``arg_constraints``,
    ``support``, batch/event shapes and broadcasting (``loc`` and the matrix are
    broadcast against each other, NumPyro's way), ``sample``/``rsample``, ``log_prob``,
    ``mean``, ``variance``, ``entropy``, ``expand``, ``infer_shapes`` and
    ``validate_args``; ``numpyro.distributions.kl_divergence`` against this class or
    NumPyro's (so ``TraceMeanField_ELBO`` takes it as prior or guide). It is a pytree
    like every NumPyro distribution, so it works under ``jit``, ``vmap``, ``grad``, NUTS
    and SVI; ``vmap_over(d, loc=..., covariance_matrix=...)``
    (``numpyro.distributions.batch_util``) gives the ``out_axes`` of a vmapped constructor,
    derived matrices included. NumPyro's own ``test/test_distributions.py`` passes on it
    (``tests/test_numpyro_upstream.py``).

    Exactly one of ``covariance_matrix``, ``precision_matrix`` and ``scale_tril`` is
    given. Nothing is factored in ``__init__``: the factor is computed when first needed
    (once per call of ``log_prob``/``sample``; concrete results are cached on the
    instance):

    * covariance: ``L = chol(Sigma)`` with :func:`gpchol.cholesky`'s forward pass; the
      gradient of ``log_prob`` wrt ``Sigma`` runs through the blocked Murray adjoint
      (``O(2 n^3 / 3)``), wrt ``loc`` through two triangular solves;
    * precision: ``M = chol(J P J)`` (``J`` reverses the order) so that ``P = U U^T`` with
      ``U = J M J`` upper triangular; ``log_prob`` uses ``r^T P r = ||M^T J r||^2`` and
      ``log det Sigma = -2 sum log diag M`` (no inverse); ``scale_tril = J M^{-T} J``;
    * scale_tril: used as given (``log|diag|``, as NumPyro).

    .. math::
        \log p(x) = -\tfrac12 (x-\mu)^T \Sigma^{-1} (x-\mu) - \tfrac12 \log\det\Sigma
        - \tfrac{n}{2}\log 2\pi

    **Failure:** where the covariance/precision is not numerically positive definite,
    ``log_prob`` is ``-inf`` (so a sampler rejects the step) and its gradient is zero,
    never NaN; ``sample``, ``scale_tril`` and ``entropy`` are NaN there.

    Args:
        loc: ``(..., n)`` mean, or a scalar (broadcast). Default 0.
        covariance_matrix: ``(..., n, n)`` symmetric positive-definite covariance
            (symmetrized, ``(S + S^T)/2``, before factoring, as ``jnp.linalg.cholesky``).
        precision_matrix: ``(..., n, n)`` symmetric positive-definite precision.
        scale_tril: ``(..., n, n)`` lower-triangular factor with positive diagonal.
        validate_args: check the parameters' constraints (and ``log_prob``'s support),
            as NumPyro: ``ValueError`` for an invalid parameter, e.g. a non-PD covariance.
            Concrete parameters are checked also when the distribution is built inside
            ``jit`` (arrays closed over); traced ones (NUTS, SVI) are not. Keyword-only.

    The arguments are NumPyro's, in NumPyro's order, so that
    ``MultivariateNormal(loc, cov, prec, tril)`` means the same in both.

    Shapes: ``batch_shape = broadcast(loc.shape[:-1], matrix.shape[:-2])``,
    ``event_shape = (n,)``; ``log_prob(x)`` takes ``sample_shape + batch_shape + (n,)``
    (any shape broadcastable to it) and returns ``sample_shape + batch_shape``.

    Raises:
        ValueError: not exactly one matrix given; a ``loc`` whose last dimension is not
            ``1`` or ``n``; an invalid parameter with ``validate_args=True``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import numpyro
        >>> import gpchol.numpyro as gnp
        >>> cov = jnp.array([[1.0, 0.3], [0.3, 2.0]])
        >>> d = gnp.MultivariateNormal(jnp.array([0.0, 1.0]), cov)
        >>> x = d.sample(jax.random.PRNGKey(0), (3,))
        >>> x.shape, d.log_prob(x).shape
        ((3, 2), (3,))
        >>> g = jax.grad(lambda c: gnp.MultivariateNormal(0.0, c).log_prob(x[0]))(cov)
        >>> g.shape
        (2, 2)
    """

    arg_constraints: ClassVar[dict[str, Any]] = {
        "loc": constraints.real_vector,
        "covariance_matrix": constraints.positive_definite,
        "precision_matrix": constraints.positive_definite,
        "scale_tril": constraints.lower_cholesky,
    }
    support = constraints.real_vector
    reparametrized_params: ClassVar[list[str]] = [
        "loc",
        "covariance_matrix",
        "precision_matrix",
        "scale_tril",
    ]
    # The given matrix and every cached factor travel as pytree leaves (None if absent);
    # which parametrization was given is static.
    pytree_data_fields = (
        "loc",
        "covariance_matrix",
        "precision_matrix",
        "scale_tril",
        "_factor_cache",
    )
    pytree_aux_fields = ("_kind",)

    def __init__(
        self,
        loc: Any = 0.0,
        covariance_matrix: Any = None,
        precision_matrix: Any = None,
        scale_tril: Any = None,
        *,
        validate_args: bool | None = None,
    ) -> None:
        given = {
            "covariance_matrix": covariance_matrix,
            "precision_matrix": precision_matrix,
            "scale_tril": scale_tril,
        }
        named = [k for k, v in given.items() if v is not None]
        if len(named) != 1:
            raise ValueError(
                "MultivariateNormal needs exactly one of covariance_matrix, "
                f"precision_matrix and scale_tril; got {named or 'none'}."
            )
        kind = named[0]
        # Concrete arguments stay concrete even when this runs inside the caller's `jit`
        # (an array closed over, not passed in), so that `validate_args` can check them
        # there, as NumPyro does; traced arguments are traced as usual.
        with jax.ensure_compile_time_eval():
            loc, matrix = _mvn_params(loc, given[kind], kind)
        n = matrix.shape[-1]
        self._kind = kind
        self.loc = loc
        setattr(self, kind, matrix)
        self._factor_cache: tuple[jax.Array, jax.Array | None] | None = None
        batch_shape = lax.broadcast_shapes(loc.shape[:-1], matrix.shape[:-2])
        super().__init__(batch_shape=batch_shape, event_shape=(n,), validate_args=validate_args)

    def validate_args(self, strict: bool = True) -> None:
        """Check the parameters' constraints; ``ValueError`` names the invalid one.

        The checks of concrete parameters are evaluated eagerly also under the caller's
        ``jit`` (NumPyro >= 0.22 does the same; 0.21 traced them and skipped them).

        Args:
            strict: raise ``RuntimeError`` for parameters that are traced (so cannot be
                checked) instead of skipping them, as NumPyro.
        """
        with jax.ensure_compile_time_eval():
            super().validate_args(strict)

    # ------------------------------------------------------------------ the factor
    def _get_factor(self) -> tuple[jax.Array, jax.Array | None]:
        """``(F, ok)``: the guarded factor of the given matrix and where it succeeded.

        ``F`` is ``L = chol(Sigma)`` (covariance), ``M = chol(J P J)`` (precision) or the
        given ``scale_tril`` (then ``ok`` is None). Cached only when concrete.
        """
        if self._factor_cache is not None:
            return self._factor_cache
        out: tuple[jax.Array, jax.Array | None]
        if self._kind == "scale_tril":
            out = (self.scale_tril, None)
        elif self._kind == "precision_matrix":
            out = _factor(self.precision_matrix[..., ::-1, ::-1])
        else:
            out = _factor(self.covariance_matrix)
        if not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(out)):
            self._factor_cache = out
        return out

    @lazy_property
    def scale_tril(self) -> jax.Array:
        """``(..., n, n)`` lower Cholesky factor of the covariance (NaN where it failed)."""
        F, ok = self._get_factor()
        assert ok is not None  # a given scale_tril is stored, never computed here
        if self._kind == "precision_matrix":
            n = F.shape[-1]
            eye = jnp.broadcast_to(jnp.eye(n, dtype=F.dtype), F.shape)
            minv_t = solve_triangular(F, eye, lower=True, transpose=True)  # M^-T, upper
            F = minv_t[..., ::-1, ::-1]
        return jnp.where(ok[..., None, None], F, jnp.nan)

    @lazy_property
    def covariance_matrix(self) -> jax.Array:
        """``(..., n, n)`` covariance ``L L^T``."""
        L = self.scale_tril
        return L @ mT(L)

    @lazy_property
    def precision_matrix(self) -> jax.Array:
        """``(..., n, n)`` precision ``Sigma^-1`` (from the factor, gpchol's tiled inverse)."""
        return cho_inverse(self.scale_tril)

    # ------------------------------------------------------------------ moments
    @property
    def mean(self) -> jax.Array:
        """``batch_shape + (n,)`` mean."""
        return jnp.broadcast_to(self.loc, self.shape())

    @property
    def variance(self) -> jax.Array:
        """``batch_shape + (n,)`` marginal variances."""
        if self._kind == "covariance_matrix":
            v = jnp.diagonal(self.covariance_matrix, axis1=-2, axis2=-1)
        else:
            v = jnp.sum(self.scale_tril**2, axis=-1)
        return jnp.broadcast_to(v, self.batch_shape + self.event_shape)

    # ------------------------------------------------------------------ sampling
    def sample(self, key: jax.Array, sample_shape: tuple[int, ...] = ()) -> jax.Array:
        """Draw ``loc + L eps`` with ``eps ~ N(0, I)``.

        Args:
            key: a JAX PRNG key.
            sample_shape: leading shape of the draws.

        Returns:
            ``sample_shape + batch_shape + (n,)``; NaN where the factorization failed.
        """
        eps = random.normal(key, shape=tuple(sample_shape) + self.batch_shape + self.event_shape)
        L = self.scale_tril
        return self.loc + jnp.squeeze(L @ eps[..., None], axis=-1)

    # ------------------------------------------------------------------ densities
    def _whole_likelihood(self, value: jax.Array) -> jax.Array | None:
        """``log_prob`` by the whole-likelihood rule, or None where it does not apply.

        It applies to a covariance that is being traced (under ``jit``/``grad``; a
        concrete one keeps its cached factor), on the CPU (where ``K^-1`` comes from LAPACK
        ``potri`` and this rule is the faster one: ``benchmarks/bench_numpyro.py``), with
        one observation per covariance (the NUTS/SVI case: ``value`` has the batch shape
        of the covariance). Other cases go through the factor and the Murray adjoint.
        """
        if self._kind != "covariance_matrix" or self._factor_cache is not None:
            return None
        cov = self.covariance_matrix
        if not isinstance(cov, jax.core.Tracer):
            return None
        n = cov.shape[-1]
        if value.shape[:-1] != self.batch_shape or cov.shape[:-2] != self.batch_shape:
            return None
        cov, nb, be = prepare(cov, None, "auto", name="covariance")
        if not be.whole_rule_default or array_platform(cov) != "cpu" or n == 0:
            return None
        rule = GaussianRule(be, nb, guarded=True)
        return _whole_program(cov, value, self.loc, self.batch_shape, rule)

    @validate_sample
    def log_prob(self, value: ArrayLike) -> jax.Array:
        """Log-density; ``-inf`` (zero gradient) where the factorization failed.

        Args:
            value: ``sample_shape + batch_shape + (n,)`` (broadcastable).

        Returns:
            ``sample_shape + batch_shape`` log-densities.
        """
        value = jnp.asarray(value)
        whole = self._whole_likelihood(value)
        if whole is not None:
            return whole
        F, ok = self._get_factor()
        return _log_prob_program(F, ok, self.loc, value, self._kind)

    def entropy(self) -> jax.Array:
        """``batch_shape`` entropies, ``n (1 + log 2 pi) / 2 + log det Sigma / 2``."""
        F, ok = self._get_factor()
        n = F.shape[-1]
        h = 0.5 * n * (LOG_2PI + 1.0) + _half_logdet(F, self._kind)
        if ok is not None:
            h = jnp.where(ok, h, jnp.nan)
        return jnp.broadcast_to(h, self.batch_shape)

    @classmethod
    def infer_shapes(
        cls,
        loc: tuple[int, ...] = (),
        covariance_matrix: tuple[int, ...] | None = None,
        precision_matrix: tuple[int, ...] | None = None,
        scale_tril: tuple[int, ...] | None = None,
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Batch and event shapes from the parameters' shapes (as NumPyro's)."""
        mats = [m for m in (covariance_matrix, precision_matrix, scale_tril) if m is not None]
        if len(mats) != 1:
            raise ValueError(
                "infer_shapes needs exactly one of covariance_matrix, precision_matrix and "
                "scale_tril."
            )
        loc = tuple(loc) or (1,)
        m = tuple(mats[0])
        batch_shape = lax.broadcast_shapes(loc[:-1], m[:-2])
        event_shape = lax.broadcast_shapes(loc[-1:], m[-1:])
        return batch_shape, event_shape


# ----------------------------------------------------------------------------------------
# Gaussian-process marginal and latent GP
# ----------------------------------------------------------------------------------------


def _diag_term(noise: ArrayLike, jitter: float | None, n: int, dtype: DTypeLike) -> jax.Array:
    noise = jnp.asarray(noise)
    check_scalar_or_vector(noise.shape, n, "noise", "variance per point")
    d = jnp.broadcast_to(noise.astype(dtype), (n,))
    return d + (jitter or 0.0)


def _gp_covariance(kernel: Any, X: jax.Array, noise: ArrayLike, jitter: float | None) -> jax.Array:
    """``k(X, X) + diag(noise) + jitter I``, ``(n, n)``: one compiled program per kernel
    structure and shapes for a gpchol kernel (a pytree), traced as is for a plain callable."""
    if isinstance(kernel, Kernel):
        return _gp_covariance_program(kernel, X, noise, jitter)
    return _gp_covariance_of(kernel, X, noise, jitter)


def _gp_covariance_of(
    kernel: Any, X: jax.Array, noise: ArrayLike, jitter: float | None
) -> jax.Array:
    K = kernel(X, X)
    return K + jnp.diag(_diag_term(noise, jitter, X.shape[0], K.dtype))


_gp_covariance_program = jax.jit(_gp_covariance_of, static_argnums=(3,))


# the factor of a posterior covariance with relative jitters, as Posterior.sample's
_relative_factor_program = jax.jit(relative_factor, static_argnums=(1, 2))


def _kl_normal(p: Any, q: Any) -> jax.Array:
    r"""``KL(p || q)`` of two multivariate normals (gpchol's or NumPyro's), per batch element.

    With ``p = N(m_p, L_p L_p^T)`` and ``q = N(m_q, L_q L_q^T)`` (Rasmussen & Williams 2006,
    eq. A.23, written with the factors):

    .. math::
        \tfrac12\left(\|L_q^{-1} L_p\|_F^2 + \|L_q^{-1}(m_p - m_q)\|^2 - n\right)
        + \textstyle\sum_i \log |L_{q,ii}| - \sum_i \log |L_{p,ii}|

    Two triangular solves, no inverse; NaN where either factor failed (as ``entropy``).
    Registered with ``numpyro.distributions.kl_divergence`` below, so NumPyro's
    ``TraceMeanField_ELBO`` takes gpchol's normals as prior or guide.
    """
    if p.event_shape != q.event_shape:
        raise ValueError(
            f"kl_divergence of multivariate normals of event shapes {p.event_shape} and "
            f"{q.event_shape}: both must have the same dimension."
        )
    (n,) = p.event_shape
    batch = jnp.broadcast_shapes(p.batch_shape, q.batch_shape)
    Lp = jnp.broadcast_to(p.scale_tril, batch + (n, n))
    Lq = jnp.broadcast_to(q.scale_tril, batch + (n, n))
    dm = jnp.broadcast_to(p.loc - q.loc, batch + (n,))
    M = solve_triangular(Lq, Lp, lower=True)
    z = solve_triangular(Lq, dm, lower=True)
    logdet = jnp.sum(
        jnp.log(jnp.abs(jnp.diagonal(Lq, axis1=-2, axis2=-1)))
        - jnp.log(jnp.abs(jnp.diagonal(Lp, axis1=-2, axis2=-1))),
        axis=-1,
    )
    return 0.5 * (jnp.sum(M * M, axis=(-2, -1)) + jnp.sum(z * z, axis=-1) - n) + logdet


# A gpchol normal against either kind: NumPyro dispatches kl_divergence on the pair's types.
for _pair in (
    (MultivariateNormal, MultivariateNormal),
    (MultivariateNormal, numpyro.distributions.MultivariateNormal),
    (numpyro.distributions.MultivariateNormal, MultivariateNormal),
):
    numpyro.distributions.kl_divergence.register(*_pair)(_kl_normal)


class GaussianProcessMarginal(MultivariateNormal):
    r"""Marginal distribution of a GP with Gaussian noise at the inputs ``X``.

    ``y ~ N(m(X), k(X, X) + diag(noise) + jitter I)``, event shape ``(n,)``: use it as
    ``numpyro.sample("y", GaussianProcessMarginal(k, X, noise), obs=y)`` with priors on
    the kernel's parameters. It is a :class:`MultivariateNormal` in the covariance
    parametrization, so the gradient wrt the kernel parameters, the noise and the mean
    runs through gpchol's Murray adjoint, and a failed factorization gives ``-inf`` with
    zero gradient (see :class:`MultivariateNormal`).

    Args:
        kernel: a gpchol kernel (or any callable ``k(X1, X2) -> (n1, n2)``).
        X: ``(n, d)`` inputs (``(n,)`` is read as ``(n, 1)``).
        noise: observation-noise variance, a scalar or ``(n,)``.
        mean: the prior mean: a number, a :class:`gpchol.means.Mean` or a callable
            ``X -> (n,)`` (see :func:`gpchol.as_mean`). Default 0.
        jitter: ``None`` or a float added to the diagonal (a fixed value, not a schedule).
        mesh: ``None`` (one device), or a ``jax.sharding.Mesh``: then ``log_prob``
            is computed by ``gpchol.distributed.gaussian_log_likelihood(kernel, kernel,
            X, y - m(X), noise + jitter, mesh)`` (each device builds and factors only its
            own covariance tiles; ``noise`` a scalar or ``(n,)``). On this path only
            ``log_prob`` (of one ``(n,)`` vector) is sharded: ``sample``, ``scale_tril``
            and the matrix properties build the dense matrix, and a failure follows that
            function's status (a failed status or NaN is mapped to ``-inf``; the gradient
            of a failed step is not guarded on this path).
        validate_args: as for :class:`MultivariateNormal` (the covariance and ``loc`` are
            checked). Inside ``jit``, the moments of concrete arguments are computed
            eagerly and checked only with ``validate_args=True``; with the default they
            are traced and not checked there.

    It follows NumPyro's conventions: ``sample(key, sample_shape)``, ``expand``,
    ``mask``, ``to_event``, a pytree (``jit``/``vmap``/``lax.map``), and
    ``numpyro.distributions.batch_util.vmap_over(d, kernel=..., X=..., noise=...,
    mean=...)`` for the ``out_axes`` of a vmapped constructor (one axis for all).

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol import kernels
        >>> import gpchol.numpyro as gnp
        >>> X = jnp.linspace(0.0, 1.0, 5)
        >>> d = gnp.GaussianProcessMarginal(kernels.ExpSquared(0.3), X, noise=0.1)
        >>> d.event_shape, d.log_prob(jnp.zeros(5)).shape
        ((5,), ())
    """

    # numpyro's base class leaves these untyped, so mypy infers fixed-length tuples
    pytree_data_fields = ("kernel", "X", "noise", "mean_function")  # type: ignore[assignment]
    pytree_aux_fields = ("jitter", "mesh")  # type: ignore[assignment]

    def __init__(
        self,
        kernel: Any,
        X: Any,
        noise: Any,
        mean: Any = 0.0,
        *,
        jitter: Any = None,
        mesh: Any = None,
        validate_args: bool | None = None,
    ) -> None:
        if not callable(kernel):
            raise TypeError(f"kernel must be callable as k(X1, X2); got {kernel!r}.")
        if validate_args not in (None, True, False):
            raise TypeError(f"validate_args must be None, True or False; got {validate_args!r}.")
        self.jitter = (check_jitter(jitter, schedule=False) or (None,))[0]
        self.mesh = mesh
        # With validate_args=True and concrete arguments (closed over inside the caller's
        # `jit`), the moments are computed eagerly so that they can be validated there, as
        # NumPyro validates concrete parameters. Otherwise they are traced as usual (an
        # n x n matrix is not made a constant of the caller's program for nothing).
        eager = validate_args is True and is_concrete(*jax.tree_util.tree_leaves((kernel, X)))
        eager = eager and is_concrete(*jax.tree_util.tree_leaves((noise, mean)))
        with jax.ensure_compile_time_eval() if eager else contextlib.nullcontext():
            X = as_inputs(X)
            self.mean_function = as_mean(mean)
            loc = self.mean_function(X)
            cov = None if mesh is not None else _gp_covariance(kernel, X, noise, self.jitter)
        n = X.shape[0]
        self.kernel = kernel
        self.X = X
        self.noise = noise
        if cov is None:
            self._kind = "covariance_matrix"
            self.loc = loc
            self._factor_cache = None
            Distribution.__init__(
                self, batch_shape=(), event_shape=(n,), validate_args=validate_args
            )
            return
        super().__init__(loc, cov, validate_args=validate_args)

    @classmethod
    def infer_shapes(  # type: ignore[override]  # NumPyro passes the constructor's arguments
        cls,
        kernel: Any = None,
        X: tuple[int, ...] = (),
        noise: tuple[int, ...] = (),
        mean: tuple[int, ...] = (),
        **kwargs: Any,
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``((), (n,))`` from the shape of ``X`` (``(n, d)`` or ``(n,)``)."""
        return (), tuple(X)[:1]

    @lazy_property
    def covariance_matrix(self) -> jax.Array:
        """``(n, n)`` covariance ``k(X, X) + diag(noise) + jitter I`` (dense)."""
        return _gp_covariance(self.kernel, self.X, self.noise, self.jitter)

    @validate_sample
    def log_prob(self, value: ArrayLike) -> jax.Array:
        """Log marginal likelihood of ``value`` (``-inf`` where the factorization fails).

        Args:
            value: ``sample_shape + (n,)`` observations.

        Returns:
            ``sample_shape`` log-densities.
        """
        if self.mesh is None:
            return MultivariateNormal.log_prob.__wrapped__(self, value)
        value = jnp.asarray(value)
        n = self.event_shape[0]
        if value.shape != (n,):
            raise ValueError(
                f"with mesh=..., log_prob takes one observation vector of shape ({n},); "
                f"got shape {tuple(value.shape)}."
            )
        noise = jnp.asarray(self.noise) + (self.jitter or 0.0)
        out = gaussian_log_likelihood(
            self.kernel, self.kernel, self.X, value - self.loc, noise, self.mesh
        )
        lp, status = out if isinstance(out, tuple) else (out, 0)
        return jnp.where((status != 0) | jnp.isnan(lp), -jnp.inf, lp)

    # ------------------------------------------------------------------ posterior
    def condition(self, y: ArrayLike) -> Posterior | ShardedPosterior:
        """The GP posterior given observations ``y`` at ``X`` (a :class:`gpchol.Posterior`).

        The same model as this distribution (kernel, noise, mean, jitter), conditioned by
        :meth:`gpchol.GaussianProcess.condition`: one factorization, ``alpha = K^-1
        (y - m(X))``, then ``mean``/``variance``/``covariance``/``sample`` at test inputs.
        Works under ``jit`` and ``vmap`` (a pytree); a failed factorization gives NaN
        predictions and the posterior's ``status``. With ``mesh=...``, the posterior is
        built on one device (dense), not sharded.

        Args:
            y: ``(n,)`` observations.

        Returns:
            A :class:`gpchol.Posterior` (a :class:`gpchol.distributed.ShardedPosterior`
            when ``X`` is placed on a multi-device mesh).

        Raises:
            TypeError: the kernel is a plain callable, not a gpchol kernel (the posterior
                needs the kernel's ``diag``).

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import kernels
            >>> import gpchol.numpyro as gnp
            >>> X = jnp.linspace(0.0, 1.0, 5)
            >>> d = gnp.GaussianProcessMarginal(kernels.ExpSquared(0.3), X, noise=0.1)
            >>> d.condition(jnp.sin(X)).mean(jnp.array([0.5, 2.0])).shape
            (2,)
        """
        return self._gp().condition(y)

    def _gp(self) -> GaussianProcess:
        """This model as a :class:`gpchol.GaussianProcess` (the posterior's machinery)."""
        if not isinstance(self.kernel, Kernel):
            raise TypeError(
                "condition/predict need a gpchol kernel (gpchol.kernels.*) for the posterior; "
                f"this distribution's kernel is {type(self.kernel).__name__}."
            )
        return GaussianProcess(
            self.kernel, self.X, noise=self.noise, mean=self.mean_function, jitter=self.jitter
        )

    def predictive(
        self,
        y: ArrayLike,
        Xs: ArrayLike,
        *,
        kernel: Any = None,
        include_noise: bool = False,
        noise: ArrayLike | None = None,
        joint: bool = True,
        jitter: Any = SAMPLE_JITTER,
    ) -> Distribution:
        r"""The posterior predictive at test inputs ``Xs`` given ``y``, as a distribution.

        Rasmussen & Williams (2006), Alg. 2.1: with ``K = k(X, X) + diag(noise) = L L^T``
        and ``alpha = K^-1 (y - m(X))``, ``f(Xs) | y ~ N(m(Xs) + k(Xs, X) alpha,
        k(Xs, Xs) - V^T V)``, ``V = L^-1 k(X, Xs)``: the moments are
        :class:`gpchol.Posterior`'s (:meth:`condition`; jitted, blocked over test points).
        For ``y(Xs)`` the test points' noise variance is added to the diagonal.

        Args:
            y: ``(n,)`` observations at ``X``.
            Xs: ``(m, d)`` test inputs (``(m,)`` is read as ``(m, 1)``).
            kernel: ``None`` (the whole model) or one additive part of the model's kernel:
                the posterior of that component (no prior mean added), see
                :meth:`gpchol.Posterior.mean`.
            include_noise: predict ``y(Xs) = f(Xs) + eps`` instead of the latent ``f``.
            noise: the test points' own noise variance, a scalar or ``(m,)`` (implies
                ``include_noise``; heteroscedastic models need it for ``y(Xs)``). Default:
                with ``include_noise``, this model's noise (which must then be a scalar).
            joint: ``True``: the joint ``(m,)`` Gaussian (``m x m`` covariance, factored
                with the relative ``jitter`` schedule as :meth:`gpchol.Posterior.sample`);
                draws are smooth functions. ``False``: independent marginals
                ``Normal(mean, sd).to_event(1)`` from the posterior variances only (no
                ``m x m`` matrix; enough for pointwise predictive bands).
            jitter: schedule of diagonal jitter, relative to the largest predictive
                variance, for ``joint=True`` (``"auto"``: as :meth:`gpchol.Posterior.sample`;
                when every value fails the distribution's draws are NaN, with a
                ``RuntimeWarning`` outside ``jit``).

        Returns:
            A NumPyro distribution with ``event_shape == (m,)``:
            :class:`MultivariateNormal` (``loc``, ``scale_tril``) for ``joint=True``,
            else an ``Independent`` ``Normal`` (``base_dist.loc``, ``base_dist.scale``).
            NaN parameters where a factorization failed (no validation is done on them).

        Example:
            >>> import jax, jax.numpy as jnp
            >>> from gpchol import kernels
            >>> import gpchol.numpyro as gnp
            >>> X = jnp.linspace(0.0, 1.0, 5)
            >>> d = gnp.GaussianProcessMarginal(kernels.ExpSquared(0.3), X, noise=0.1)
            >>> p = d.predictive(jnp.sin(X), jnp.array([0.5, 2.0]), include_noise=True)
            >>> p.event_shape, p.sample(jax.random.PRNGKey(0)).shape
            ((2,), (2,))
        """
        return self._predictive(y, Xs, kernel, include_noise, noise, joint, jitter)

    def _predictive(
        self,
        y: ArrayLike,
        Xs: ArrayLike,
        kernel: Any,
        include_noise: bool,
        noise: ArrayLike | None,
        joint: bool,
        jitter: Any,
    ) -> Distribution:
        """:meth:`predictive`, called by it and by :meth:`predict` (a failed factor's warning
        then names their caller's line)."""
        if not isinstance(joint, (bool, np.bool_)):
            raise TypeError(f"joint must be True or False; got {joint!r}.")
        if not isinstance(include_noise, (bool, np.bool_)):
            raise TypeError(f"include_noise must be True or False; got {include_noise!r}.")
        post = self.condition(y)
        opts = {"kernel": kernel, "include_noise": bool(include_noise), "noise": noise}
        if not joint:
            mu, var = post.mean_and_variance(Xs, **opts)
            base = numpyro.distributions.Normal(mu, jnp.sqrt(var), validate_args=False)
            return base.to_event(1)
        if not isinstance(post, Posterior):
            raise ValueError(
                "joint=True needs the m x m posterior covariance, which the sharded posterior "
                "(X placed on a device mesh) does not form; pass joint=False for the "
                "marginals, or X on one device."
            )
        mu = post.mean(Xs, kernel=kernel)
        C = post.covariance(Xs, **opts)
        rel, eigen = relative_jitters(jitter, C.dtype)
        Ls = C
        if C.shape[-1]:
            Ls, status = _relative_factor_program(C, rel, eigen)
            warn_if_failed(status, rel, eigen, "predictive", stacklevel=3)
        return MultivariateNormal(mu, scale_tril=Ls, validate_args=False)

    def predict(
        self,
        name: str,
        y: ArrayLike,
        Xs: ArrayLike,
        *,
        kernel: Any = None,
        include_noise: bool = False,
        noise: ArrayLike | None = None,
        joint: bool = True,
        jitter: Any = SAMPLE_JITTER,
    ) -> jax.Array:
        """Sample the posterior predictive at ``Xs`` as the NumPyro site ``name``.

        ``numpyro.sample(name, self.predictive(y, Xs, ...))``: inside a model, after the
        observation site, so that ``numpyro.infer.Predictive(model, posterior_samples)``
        returns one predictive draw per posterior draw, ``(num_draws, m)``. Predictive
        maps the model over the draws as a traced program (``parallel=False``, its
        default, one draw at a time in a ``lax.map``; ``parallel=True`` with ``vmap``,
        all draws at once, so memory grows with the number of draws times ``n^2``).
        Pass the value the observation site returns as ``y`` (the data when observed, a
        prior draw when not).

        Args:
            name: the site's name; the other arguments are :meth:`predictive`'s.

        Returns:
            ``(m,)`` the site's value.

        Example:
            >>> import jax, jax.numpy as jnp
            >>> import numpyro, numpyro.distributions as dist
            >>> from numpyro.infer import Predictive
            >>> from gpchol import kernels
            >>> import gpchol.numpyro as gnp
            >>> def model(X, y=None, Xs=None):
            ...     ls = numpyro.sample("ls", dist.LogNormal(0.0, 1.0))
            ...     gp = gnp.GaussianProcessMarginal(kernels.ExpSquared(ls), X, noise=0.1)
            ...     y = numpyro.sample("y", gp, obs=y)
            ...     if Xs is not None:
            ...         gp.predict("f_star", y, Xs)
            >>> X = jnp.linspace(0.0, 1.0, 6)
            >>> draws = {"ls": jnp.array([0.2, 0.3, 0.5])}
            >>> out = Predictive(model, draws)(jax.random.PRNGKey(0), X, jnp.sin(X),
            ...                                Xs=jnp.array([0.1, 0.7]))
            >>> out["f_star"].shape
            (3, 2)
        """
        return numpyro.sample(
            name, self._predictive(y, Xs, kernel, include_noise, noise, joint, jitter)
        )


# ----------------------------------------------------------------------------------------
# vmap_over: the out_axes of a vmapped constructor, NumPyro's convention
# ----------------------------------------------------------------------------------------

_MATRICES = ("covariance_matrix", "precision_matrix", "scale_tril")


def _axes_like(d: Distribution, given: dict[str, Any], derived: Any) -> Distribution:
    """A copy of ``d`` whose pytree data fields hold vmap axes instead of arrays.

    ``given`` maps data fields to the axes of the arguments they come from; every matrix
    (the given one and those computed from it, possibly cached by a lazy property) and
    ``loc``, unless given, get ``derived``; gpchol's cached factor is only ever concrete,
    never the output of a vmapped function, so it gets ``None``.
    """
    axes = copy.copy(d)
    for field in type(d).gather_pytree_data_fields():
        setattr(axes, field, given.get(field, derived if field in _MATRICES else None))
    return axes


@vmap_over.register
def _vmap_over_multivariate_normal(
    d: MultivariateNormal,
    loc: Any = None,
    covariance_matrix: Any = None,
    precision_matrix: Any = None,
    scale_tril: Any = None,
) -> Distribution:
    # Every matrix attribute derives from the one given: they share its axis.
    axis = next(
        (a for a in (covariance_matrix, precision_matrix, scale_tril) if a is not None), None
    )
    return _axes_like(d, {"loc": loc}, axis)


@vmap_over.register
def _vmap_over_gp_marginal(
    d: GaussianProcessMarginal,
    kernel: Any = None,
    X: Any = None,
    noise: Any = None,
    mean: Any = None,
) -> Distribution:
    # loc and the matrices derive from several arguments: they take the one axis given
    # (an unbatched output under a mapped out_axes is broadcast by vmap, so this is safe).
    given = {"kernel": kernel, "X": X, "noise": noise, "mean_function": mean}
    ints = {a for a in jax.tree_util.tree_leaves(list(given.values())) if isinstance(a, int)}
    if len(ints) > 1:
        raise ValueError(
            "vmap_over(GaussianProcessMarginal, ...) needs one axis for all its arguments; "
            f"got {sorted(ints)}."
        )
    axis = next(iter(ints), None)
    return _axes_like(d, {"loc": axis, **given}, axis)


def latent_gp(
    name: str, kernel: Any, X: ArrayLike, mean: Any = 0.0, jitter: float | None = 1e-6
) -> jax.Array:
    r"""A latent GP ``f ~ GP(m, k)`` at ``X``, non-centred, as NumPyro sites.

    Samples ``z ~ N(0, I_n)`` at the site ``f"{name}_z"`` and returns
    ``f = m(X) + L z`` with ``L = chol(k(X, X) + jitter I)`` (gpchol's factor and
    adjoint), recorded as the deterministic site ``name``. The non-centred form is the
    one NUTS mixes well on for non-Gaussian likelihoods (Poisson, Bernoulli, ...).

    A failed factorization adds ``-inf`` to the log-density through the factor site
    ``f"{name}_cholesky_failed"`` (0 otherwise), with zero gradient, so the sampler
    rejects the step; ``f`` is then ``m(X) + z`` (finite, never used).

    Args:
        name: site name of ``f``.
        kernel: a gpchol kernel (or any callable ``k(X1, X2)``).
        X: ``(n, d)`` inputs (``(n,)`` is read as ``(n, 1)``).
        mean: a number, a :class:`gpchol.means.Mean` or a callable ``X -> (n,)``.
        jitter: a float added to the diagonal of ``k(X, X)``. Default ``1e-6``.

    Returns:
        ``(n,)`` latent function values.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import Predictive
        >>> from gpchol import kernels
        >>> import gpchol.numpyro as gnp
        >>> X = jnp.linspace(0.0, 1.0, 6)
        >>> def model(counts=None):
        ...     f = gnp.latent_gp("f", kernels.ExpSquared(0.3), X)
        ...     numpyro.sample("y", dist.Poisson(jnp.exp(f)), obs=counts)
        >>> draws = Predictive(model, num_samples=2)(jax.random.PRNGKey(0))
        >>> draws["f"].shape, draws["y"].shape
        ((2, 6), (2, 6))
    """
    X = as_inputs(X)
    n = X.shape[0]
    j = (check_jitter(jitter, schedule=False) or (0.0,))[0]
    K = _gp_covariance(kernel, X, 0.0, j)
    L, ok = _factor(K)
    z = numpyro.sample(
        f"{name}_z", numpyro.distributions.Normal(jnp.zeros(n, K.dtype), 1.0).to_event(1)
    )
    numpyro.factor(f"{name}_cholesky_failed", jnp.where(ok, 0.0, -jnp.inf))
    f = as_mean(mean)(X) + L @ z
    return numpyro.deterministic(name, f)
