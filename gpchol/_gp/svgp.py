r"""The stochastic variational GP (SVGP; Hensman, Fusi & Lawrence 2013; Hensman, Matthews &
Ghahramani 2015): inducing points, any likelihood, minibatches.

With ``M`` inducing inputs ``Z`` and inducing values ``u = f(Z) ~ N(m(Z), K_uu)``, the
variational posterior ``q(u)`` is Gaussian and ``q(f) = int p(f | u) q(u) du``. In the
*whitened* parameterisation ``u = m(Z) + L_z v`` (``K_uu = L_z L_z^T``, gpchol's factor)
with ``q(v) = N(q_mu, S S^T)``, ``S = tril(q_sqrt)``, and ``p(v) = N(0, I)``; unwhitened,
``q(u - m(Z)) = N(q_mu, S S^T)`` directly, which is the whitened model with
``(L_z^-1 q_mu, L_z^-1 S)`` (still lower triangular). At inputs ``x``, with
``A = L_z^-1 k(Z, x)``:

.. math::
    \mu(x) = m(x) + A^T q_\mu, \qquad
    v(x) = k(x, x) - \|A\|^2 + \|S^T A\|^2 \quad\text{(column-wise)},

and the evidence lower bound on a minibatch ``B`` of ``b`` of the ``N`` observations,
an unbiased estimate of the whole-data bound, is

.. math::
    \mathcal{L} = \frac{N}{b} \sum_{i \in B} E_{N(f_i; \mu_i, v_i)}[\log p(y_i \mid f_i)]
    - \mathrm{KL}(q(v) \,\|\, N(0, I)), \quad
    \mathrm{KL} = \tfrac12 (\|S\|_F^2 + \|q_\mu\|^2 - M) - \sum_j \log |S_{jj}|.

The expected log likelihood comes from the likelihood (:mod:`gpchol._gp.likelihoods`):
closed form for :class:`~gpchol._gp.likelihoods.Gaussian`, Gauss-Hermite quadrature for
the others. ``K_uu`` is factored by :func:`gpchol.cholesky_with_status` (gpchol's factor
and adjoint, the model's jitter schedule; a failed factor gives NaN and a status); the
solves with ``L_z`` are triangular solves, ``O(M^2 b)`` per minibatch.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from gpchol import SVGP, kernels, likelihoods
    >>> X = jnp.linspace(0.0, 1.0, 50)[:, None]
    >>> y = jnp.sin(6.0 * X[:, 0])
    >>> model = SVGP(kernels.ExpSquared(0.2), inducing=X[::10], num_data=50,
    ...              likelihood=likelihoods.Gaussian(0.01), jitter=1e-6)
    >>> elbo = jax.jit(SVGP.elbo)(model, X[:16], y[:16])
    >>> mean, var = model.predict(X[:3])
    >>> mean.shape, var.shape
    ((3,), (3,))
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from gpchol._base.errors import NotPositiveDefiniteError
from gpchol._base.pytrees import AttrPytree, register_fields
from gpchol._base.validate import as_inputs, check_finite_rows, check_int, check_jitter, is_concrete
from gpchol._gp.likelihoods import Likelihood
from gpchol._linalg import posterior_core as core
from gpchol._linalg.blocks import trsm
from gpchol._linalg.status import raise_if_failed
from gpchol._routing import cholesky_with_status
from gpchol.kernels import Kernel, as_kernel
from gpchol.means import Mean, as_mean

__all__ = ["SVGP", "SVGPPosterior", "SVGPSolver"]


def _check_likelihood(likelihood: object) -> Likelihood:
    supported = "gpchol.likelihoods.Gaussian(noise), Bernoulli() or Poisson()"
    if isinstance(likelihood, type) and issubclass(likelihood, Likelihood):
        raise TypeError(
            f"likelihood must be an instance, not the class {likelihood.__name__}; e.g. "
            f"likelihood={likelihood.__name__}()."
        )
    if not isinstance(likelihood, Likelihood):
        raise TypeError(
            f"likelihood {likelihood!r} (of type {type(likelihood).__name__}) is not supported "
            f"by SVGP: pass {supported}, or a subclass of gpchol.likelihoods.Likelihood."
        )
    return likelihood


def _check_inducing(inducing: Any) -> jax.Array:
    Z = as_inputs(inducing, "inducing")
    if Z.shape[0] == 0:
        raise ValueError("inducing (the inducing inputs Z) must have at least one row.")
    check_finite_rows(Z, "inducing (the inducing inputs Z)", "give finite inducing inputs")
    return Z


def _check_variational(q_mu: Any, q_sqrt: Any, M: int, dtype: Any) -> tuple[jax.Array, jax.Array]:
    q_mu = jnp.zeros((M,), dtype) if q_mu is None else jnp.asarray(q_mu)
    q_sqrt = jnp.eye(M, dtype=dtype) if q_sqrt is None else jnp.asarray(q_sqrt)
    # integer values are learnable parameters all the same (as integer inducing inputs)
    q_mu = q_mu if jnp.issubdtype(q_mu.dtype, jnp.inexact) else q_mu.astype(dtype)
    q_sqrt = q_sqrt if jnp.issubdtype(q_sqrt.dtype, jnp.inexact) else q_sqrt.astype(dtype)
    if q_mu.shape != (M,):
        raise ValueError(
            f"q_mu must have shape ({M},), one value per inducing input; got {q_mu.shape}."
        )
    if q_sqrt.shape != (M, M):
        raise ValueError(
            f"q_sqrt must have shape ({M}, {M}) (its lower triangle is used); got {q_sqrt.shape}."
        )
    return q_mu, q_sqrt


class SVGP(AttrPytree):
    r"""A sparse variational GP with ``M`` inducing inputs, trained on minibatches.

    A pytree: the kernel, the inducing inputs, the likelihood's parameters, the mean and
    the variational parameters ``q_mu`` ``(M,)`` and ``q_sqrt`` ``(M, M)`` (lower
    triangle used) are its leaves, so an optax optimiser updates the whole model (or the
    subset you choose), ``jax.grad`` gives an SVGP of gradients, and ``jax.vmap`` maps over
    a batch of models; ``num_data``, ``whiten``, the jitter schedule, the backend and the
    tile size are static. See the module docstring for the formulas.

    Args:
        kernel: a :class:`gpchol.kernels.Kernel` (or ``f(x1, x2) -> scalar``).
        inducing: ``(M, d)`` inducing inputs ``Z`` (``(M,)`` is read as ``(M, 1)``).
            Keyword-only, as are the following.
        likelihood: a :class:`gpchol.likelihoods.Likelihood` instance:
            ``Gaussian(noise)``, ``Bernoulli()``, ``Poisson()`` or your own subclass.
        num_data: ``N``, the number of observations the minibatches are drawn from: the
            data term of :meth:`elbo` is scaled by ``N / b``.
        mean: the prior mean (``None``: zero; a number, a :class:`gpchol.means.Mean` or
            a callable ``X -> (n,)``).
        whiten: the whitened parameterisation (default; better conditioned for
            gradient-based training) or ``q(u)`` directly.
        q_mu: ``(M,)`` initial variational mean; default zeros.
        q_sqrt: ``(M, M)`` initial factor ``S`` of the variational covariance ``S S^T``;
            default the identity (whitened: ``q`` equals the prior; unwhitened: pass the
            prior's factor to start at the prior).
        jitter: ``None``, a float added to the diagonal of ``K_uu``, or a tuple tried in
            order (see :func:`gpchol.cholesky_with_status`). Never added unless asked
            for; inducing inputs close together make ``K_uu`` singular to rounding, where
            ``jitter=1e-6`` (float64) or ``1e-4`` (float32) is usual.
        backend: the Cholesky backend of ``K_uu`` (``"auto"``, ``"xla"``, ``"tiled"``,
            ``"cuda"``).
        tile_size: the factor's block size (``None``: automatic).

    Shapes: ``inducing (M, d)``, minibatch ``X (b, d)`` and ``y (b,)``, test ``Xs (m, d)``.

    Example:
        Training on minibatches with optax (the transforms keep the kernel's and the
        noise's parameters positive)::

            import jax, optax, gpchol
            from gpchol import kernels, likelihoods
            kernel = kernels.ExpSquared(1.0)
            model = gpchol.SVGP(kernel, inducing=gpchol.inducing_points(X, 256, kernel=kernel),
                                likelihood=likelihoods.Gaussian(0.1), num_data=len(X),
                                jitter=1e-6)
            t = model.default_transforms()
            u = gpchol.to_unconstrained(model, t)
            opt = optax.adam(1e-2)
            state = opt.init(u)

            @jax.jit
            def step(u, state, Xb, yb):
                loss = lambda u: -gpchol.to_constrained(u, t).elbo(Xb, yb)
                value, grad = jax.value_and_grad(loss)(u)
                updates, state = opt.update(grad, state, u)
                return optax.apply_updates(u, updates), state, value

            batches = gpchol.minibatches((X, y), 1024, jax.random.PRNGKey(0), epochs=20)
            for Xb, yb in batches:
                u, state, value = step(u, state, Xb, yb)
            model = gpchol.to_constrained(u, t)
            mean, var = model.predict(Xs)
    """

    def __init__(
        self,
        kernel: Kernel,
        *,
        inducing: Any,
        likelihood: Likelihood,
        num_data: int,
        mean: Any = None,
        whiten: bool = True,
        q_mu: Any = None,
        q_sqrt: Any = None,
        jitter: Any = None,
        backend: str = "auto",
        tile_size: int | None = None,
    ) -> None:
        if not isinstance(kernel, Kernel):
            kernel = as_kernel(kernel)
        Z = _check_inducing(inducing)
        self.kernel = kernel
        self.inducing = Z
        self.likelihood = _check_likelihood(likelihood)
        self.mean = mean if isinstance(mean, Mean) else as_mean(mean)
        self.q_mu, self.q_sqrt = _check_variational(q_mu, q_sqrt, Z.shape[0], Z.dtype)
        self.num_data = check_int(num_data, "num_data", "the number of observations")
        if not isinstance(whiten, (bool, np.bool_)):
            raise TypeError(f"whiten must be True or False; got {whiten!r}.")
        self.whiten = bool(whiten)
        self.jitter = check_jitter(jitter)
        self.backend = backend
        self.tile_size = tile_size

    _CHILDREN = ("kernel", "inducing", "likelihood", "mean", "q_mu", "q_sqrt")
    _AUX = ("num_data", "whiten", "jitter", "backend", "tile_size")

    def default_transforms(self) -> SVGP:
        """Transforms for optimisation: the kernel's, the mean's and the likelihood's own
        (positive lengthscales, variances, noise), identity for the mean, the inducing inputs
        and the variational parameters. An SVGP-shaped pytree prefix for
        :func:`gpchol.to_unconstrained` and :func:`gpchol.to_constrained`."""
        children = (
            self.kernel.default_transforms(),
            None,
            self.likelihood.default_transforms(),
            None,  # a mean's parameters are unconstrained (Mean.default_transforms)
            None,
            None,
        )
        return self.tree_unflatten(self.tree_flatten()[1], children)

    def __repr__(self) -> str:
        shape: tuple[int, ...] = getattr(self.inducing, "shape", ())  # any tree_map'd leaf
        return (
            f"SVGP(kernel={type(self.kernel).__name__}, "
            f"M={shape[0] if len(shape) else None}, "
            f"likelihood={self.likelihood!r}, num_data={self.num_data}, whiten={self.whiten})"
        )

    # ------------------------------------------------------------------------ pieces
    @property
    def num_inducing(self) -> int:
        """``M``, the number of inducing inputs."""
        return self.inducing.shape[0]

    def _inputs(self, X: ArrayLike, name: str) -> jax.Array:
        X = as_inputs(X, name)
        d = self.inducing.shape[1]
        if X.shape[1] != d:
            raise ValueError(
                f"inducing (the inducing inputs Z) has {d} column(s) but {name} has "
                f"{X.shape[1]}: both must have one column per input dimension."
            )
        # an inf row would silently count as a point far from every inducing input
        check_finite_rows(X, name, "drop or impute those rows first")
        return X

    def factor(self) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Cholesky factor of ``K_uu = k(Z, Z)`` (+ jitter), with status.

        Returns:
            ``(L_z, status, jitter_used)``: ``(M, M)`` lower triangular (all NaN when the
            factorization failed), the int32 status (0 on success, else the 1-based
            failing pivot) and the jitter added (0 if none).
        """
        Kuu = self.kernel(self.inducing, self.inducing)
        out = cholesky_with_status(
            Kuu, tile_size=self.tile_size, backend=self.backend, jitter=self.jitter
        )
        if self.jitter is None:
            return out[0], out[1], jnp.zeros((), Kuu.dtype)
        return out[0], out[1], out[2]

    def whitened(self, Lz: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(q_mu, S)`` of the whitened ``q(v)``, ``S`` lower triangular: the model's own
        when whitened, ``(L_z^-1 q_mu, L_z^-1 tril(q_sqrt))`` otherwise."""
        S = jnp.tril(self.q_sqrt).astype(Lz.dtype)
        m = self.q_mu.astype(Lz.dtype)
        if self.whiten:
            return m, S
        return trsm(Lz, m[:, None], left=True)[:, 0], jnp.tril(trsm(Lz, S, left=True))

    def prior_kl(self, Lz: jax.Array | None = None) -> jax.Array:
        """``KL(q(u) || p(u))`` (equal to the whitened ``KL(q(v) || N(0, I))``).

        Args:
            Lz: the factor of ``K_uu`` (from :meth:`factor`); computed when ``None``.
        """
        if Lz is None:
            Lz = self.factor()[0]
        m, S = self.whitened(Lz)
        M = m.shape[0]
        logdiag = jnp.log(jnp.abs(jnp.diagonal(S)))
        return 0.5 * (jnp.sum(S * S) + jnp.dot(m, m) - M) - jnp.sum(logdiag)

    def solver(self, Lz: jax.Array) -> SVGPSolver:
        """The posterior core's solver of ``q(f)`` given the factor ``L_z`` of ``K_uu``."""
        m, S = self.whitened(Lz)
        return SVGPSolver(self.kernel, self.inducing.astype(Lz.dtype), self.mean, Lz, m, S)

    def marginals(self, Lz: jax.Array, X: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Mean and variance of ``q(f(x))`` at each row of ``X`` ``(b, d)``: ``(b,)`` each
        (the solver's block, as the posterior core predicts it)."""
        solver = self.solver(Lz)
        X = X.astype(Lz.dtype)
        mu, V = solver.project(X, None, True)
        V = cast(jax.Array, V)  # asked for (whiten=True)
        var = solver.prior_variance(X, None) - jnp.sum(V * V, axis=0)
        return solver.prior_mean(X).astype(mu.dtype) + mu, jnp.maximum(var, 0.0)

    def _batch(self, X: ArrayLike, y: ArrayLike) -> tuple[jax.Array, jax.Array]:
        X = self._inputs(X, "X")
        y = jnp.asarray(y)
        if y.ndim != 1 or y.shape[0] != X.shape[0]:
            raise ValueError(
                f"y must have shape ({X.shape[0]},), one value per row of X; got shape "
                f"{tuple(y.shape)}."
            )
        if X.shape[0] > self.num_data:  # the data term would be scaled by less than 1
            raise ValueError(
                f"the minibatch has {X.shape[0]} rows but num_data = {self.num_data}: "
                "num_data is the number of observations the minibatches are drawn from "
                "(at least any batch); pass num_data=len(X_train)."
            )
        self.likelihood.check_y(y)
        return X, y

    # ------------------------------------------------------------------- the bound
    def elbo_with_status(self, X: ArrayLike, y: ArrayLike) -> tuple[jax.Array, jax.Array]:
        """The evidence lower bound on a minibatch, with the status of ``K_uu``'s factor
        (usable inside ``jit``).

        Arguments: as :meth:`elbo` (which adds ``check``).

        Returns:
            ``(elbo, status)``: the scalar bound (NaN when ``K_uu`` is not positive
            definite) and the int32 status (0 on success).
        """
        X, y = self._batch(X, y)
        return _elbo_jit(self, X, y)

    def _elbo(self, X: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
        Lz, status, _ = self.factor()
        dtype = Lz.dtype
        mean, var = self.marginals(Lz, X)
        data = jnp.sum(self.likelihood.variational_expectation(y.astype(dtype), mean, var))
        scale = jnp.asarray(self.num_data / max(X.shape[0], 1), dtype)
        return scale * data - self.prior_kl(Lz), status

    def elbo(self, X: ArrayLike, y: ArrayLike, *, check: bool = False) -> jax.Array:
        r"""The evidence lower bound, estimated on a minibatch (unbiased: the data term
        is scaled by ``num_data / b``); differentiable in every leaf of the model.

        Args:
            X: ``(b, d)`` minibatch inputs (the whole data when ``b = num_data``).
            y: ``(b,)`` minibatch observations.
            check: raise :class:`gpchol.NotPositiveDefiniteError` when ``K_uu`` is not
                positive definite (needs concrete values, outside ``jit``); without it a
                failure gives NaN.

        Returns:
            A scalar.
        """
        value, status = self.elbo_with_status(X, y)
        self._check(status, check, "elbo")
        return value

    def _check(self, status: jax.Array, check: bool, what: str) -> None:
        if not check:
            return
        if not is_concrete(status):
            raise ValueError(
                f"SVGP.{what}(..., check=True) needs concrete values and cannot run inside "
                "jax.jit/vmap/grad tracing; inside jit use the status "
                "(SVGP.elbo_with_status, SVGPPosterior.status) and test status == 0."
            )
        try:
            raise_if_failed(self.kernel(self.inducing, self.inducing), status, self.jitter)
        except NotPositiveDefiniteError as err:
            raise NotPositiveDefiniteError(
                f"SVGP: the inducing covariance k(Z, Z) {err} SVGP hints: inducing inputs "
                "closer than the lengthscale make k(Z, Z) singular to rounding; remove "
                "near-duplicates from inducing, or pass jitter=(1e-6, 1e-4) to SVGP.",
                pivot=err.pivot,
                batch_index=err.batch_index,
                min_diagonal=err.min_diagonal,
                jitter=err.jitter,
            ) from None

    # ------------------------------------------------------------------- prediction
    def condition(self, *, check: bool = False, block_size: int | None = None) -> SVGPPosterior:
        """The variational posterior ``q(f)``, ready to predict (factors ``K_uu`` once).

        Args:
            check: raise :class:`gpchol.NotPositiveDefiniteError` when ``K_uu`` is not
                positive definite (outside ``jit``); without it predictions are NaN.
            block_size: the default number of test points per block of the posterior's
                predictions (``None``: chosen from ``M``).

        Returns:
            An :class:`SVGPPosterior`.
        """
        Lz, status, used = _factor_jit(self)
        self._check(status, check, "condition")
        return SVGPPosterior(self, Lz, status, used, block_size)

    def predict(self, Xs: ArrayLike) -> tuple[jax.Array, jax.Array]:
        """Mean and variance of the latent ``f`` at ``Xs`` ``(m, d)`` under ``q``:
        ``(m,)`` each (``self.condition().mean_and_variance(Xs)``)."""
        return self.condition().mean_and_variance(Xs)

    def predict_y(self, Xs: ArrayLike) -> tuple[jax.Array, jax.Array]:
        """Mean and variance of a new observation ``y*`` at ``Xs`` (the likelihood's
        predictive; for :class:`~gpchol._gp.likelihoods.Bernoulli`, ``p(y* = 1)`` and
        ``p (1 - p)``): ``(m,)`` each."""
        return self.condition().predict_y(Xs)


jax.tree_util.register_pytree_node_class(SVGP)

# One program per model structure and shapes, also when called eagerly (inlined in the
# caller's own jit).
_elbo_jit = jax.jit(SVGP._elbo)
_factor_jit = jax.jit(SVGP.factor)


@register_fields
@dataclasses.dataclass(frozen=True)
class SVGPSolver:
    r"""``q(f)`` of an :class:`SVGP` for the posterior core
    (:mod:`gpchol._linalg.posterior_core`).

    With ``A = L_z^-1 k(Z, xb)`` and the whitened ``(q_mu, S)``, ``q(f)`` at ``xb`` has mean
    ``m(xb) + A^T q_mu`` and covariance ``k(xb, xb) - A^T A + (S^T A)^T (S^T A)``. The core
    subtracts ``V^T V`` from the solver's prior term: ``V = A``, and the prior term carries
    ``q``'s own ``(S^T A)^T (S^T A)`` (``A`` is built once per block: the projection and
    the prior term compute it from the same operands in one program).
    """

    kernel: Any
    inducing: jax.Array
    mean: Any
    L: jax.Array
    q_mu: jax.Array
    q_sqrt: jax.Array
    outputs: ClassVar[tuple[int, ...]] = ()
    block_multiple: ClassVar[int] = 1

    @property
    def inputs(self) -> jax.Array:
        return self.inducing

    def default_block(self, m: int) -> int:
        return core.default_block_size(self.L.shape[-1], m)

    def _whitened_cross(self, xb: jax.Array) -> jax.Array:
        """``A = L_z^-1 k(Z, xb)``, ``(M, b)``."""
        Kub = self.kernel(self.inducing.astype(xb.dtype), xb).astype(xb.dtype)
        return trsm(self.L.astype(xb.dtype), Kub, left=True)

    def project(self, xb: jax.Array, part: Any, whiten: bool) -> tuple[jax.Array, jax.Array | None]:
        A = self._whitened_cross(xb)
        return A.T @ self.q_mu.astype(xb.dtype), (A if whiten else None)

    def prior_mean(self, xb: jax.Array) -> jax.Array:
        return self.mean(xb)

    def prior_variance(self, xb: jax.Array, part: Any) -> jax.Array:
        SA = self.q_sqrt.T.astype(xb.dtype) @ self._whitened_cross(xb)
        return self.kernel.diag(xb).astype(xb.dtype) + jnp.sum(SA * SA, axis=0)

    def prior_covariance(self, xs: jax.Array, part: Any) -> jax.Array:
        SA = self.q_sqrt.T.astype(xs.dtype) @ self._whitened_cross(xs)
        return self.kernel(xs, xs).astype(xs.dtype) + SA.T @ SA


class SVGPPosterior(AttrPytree):
    r"""The variational posterior ``q(f)`` of an :class:`SVGP` (from ``model.condition()``).

    At test inputs ``Xs``, with ``A = L_z^-1 k(Z, Xs)`` and the whitened ``(q_mu, S)``:
    ``mean = m(Xs) + A^T q_mu``, ``cov = k(Xs, Xs) - A^T A + (S^T A)^T (S^T A)``. Predictions
    run through gpchol's posterior core (:mod:`gpchol._linalg.posterior_core`): one jitted
    program per shape, over blocks of test points (memory ``O(M^2 + M b)``).

    Attributes:
        model: the :class:`SVGP`.
        L: ``(M, M)`` factor of ``K_uu`` (+ jitter; NaN when it failed).
        status: int32 status of that factorization (0 on success).
        jitter_used: the jitter added to ``K_uu``'s diagonal.
        block_size: the default number of test points per block (``None``: chosen from
            ``M``).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gpchol import SVGP, kernels, likelihoods
        >>> model = SVGP(kernels.ExpSquared(), inducing=jnp.arange(3.0),
        ...              likelihood=likelihoods.Bernoulli(), num_data=100)
        >>> post = model.condition()
        >>> p, _ = post.predict_y(jnp.array([0.5, 1.5]))  # q is the prior: p = 1/2
        >>> print(p)
        [0.5 0.5]
        >>> post.sample(jax.random.PRNGKey(0), jnp.array([0.5, 1.5]), 4).shape
        (4, 2)
    """

    def __init__(
        self,
        model: SVGP,
        L: jax.Array,
        status: jax.Array,
        jitter_used: Any,
        block_size: int | None = None,
    ) -> None:
        self.model = model
        self.L = L
        self.status = status
        self.jitter_used = jitter_used
        self.block_size = core.check_block_size(block_size)

    _CHILDREN = ("model", "L", "status", "jitter_used")
    _AUX = ("block_size",)

    def _args(self, Xs: ArrayLike, block_size: object) -> dict[str, Any]:
        self.model._inputs(Xs, "Xs")  # the column check names the inducing inputs
        return {"dtype": self.L.dtype, "block_size": block_size, "own_block": self.block_size}

    def mean_and_variance(
        self, Xs: ArrayLike, *, block_size: int | None = None
    ) -> tuple[jax.Array, jax.Array]:
        """Mean and variance of ``f`` at ``Xs`` ``(m, d)``: ``(m,)`` each.

        Args:
            Xs: test inputs.
            block_size: test points per block (``None``: the posterior's).
        """
        args = self._args(Xs, block_size)
        return core.predict(self.model.solver(self.L), Xs, **args)

    def mean(self, Xs: ArrayLike, *, block_size: int | None = None) -> jax.Array:
        """Mean of ``f`` at ``Xs``: ``(m,)``."""
        args = self._args(Xs, block_size)
        return core.predict(self.model.solver(self.L), Xs, want_var=False, **args)[0]

    def variance(self, Xs: ArrayLike, *, block_size: int | None = None) -> jax.Array:
        """Variance of ``f`` at ``Xs``: ``(m,)``."""
        return self.mean_and_variance(Xs, block_size=block_size)[1]

    def covariance(self, Xs: ArrayLike, *, block_size: int | None = None) -> jax.Array:
        """Covariance of ``f`` at ``Xs``: ``(m, m)``."""
        args = self._args(Xs, block_size)
        return core.covariance(self.model.solver(self.L), Xs, **args)

    def sample(
        self,
        key: jax.Array,
        Xs: ArrayLike,
        num: int = 1,
        *,
        jitter: Any = core.SAMPLE_JITTER,
        block_size: int | None = None,
    ) -> jax.Array:
        """``num`` joint samples of ``f`` at ``Xs``: ``(num, m)``.

        Args:
            key: a ``jax.random`` key.
            Xs: ``(m, d)`` test inputs.
            num: number of samples.
            jitter: relative diagonal jitters tried in order on the covariance (relative
                to its largest variance; ``"auto"``: as :meth:`gpchol.Posterior.sample`).
            block_size: test points per block (``None``: the posterior's).
        """
        args = self._args(Xs, block_size)
        return core.sample(self.model.solver(self.L), key, Xs, num, jitter=jitter, **args)

    def predict_y(
        self, Xs: ArrayLike, *, block_size: int | None = None
    ) -> tuple[jax.Array, jax.Array]:
        """Mean and variance of a new observation at ``Xs`` under the likelihood (for
        :class:`~gpchol._gp.likelihoods.Bernoulli`, ``p(y* = 1)`` and ``p (1 - p)``)."""
        mean, var = self.mean_and_variance(Xs, block_size=block_size)
        return self.model.likelihood.predict(mean, var)


jax.tree_util.register_pytree_node_class(SVGPPosterior)
