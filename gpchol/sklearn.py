r"""A scikit-learn estimator on gpchol's exact GP: :class:`GaussianProcessRegressor`.

A drop-in for :class:`sklearn.gaussian_process.GaussianProcessRegressor` in pipelines,
``GridSearchCV`` and ``cross_val_score``, with the same constructor arguments and methods,
but a gpchol kernel (:mod:`gpchol.kernels`), gpchol's Cholesky factorization and its
adjoint for the likelihood's gradient, and :func:`gpchol.fit` (L-BFGS) for the
hyperparameters. It needs scikit-learn (``pip install gpchol[sklearn]``); importing
``gpchol`` does not import this module or scikit-learn.

Fitting compiles one program per kernel structure and size bucket (:func:`gpchol.fit`): a
second ``fit`` of the same kernel structure in the process, a cross-validation fold or a
grid-search candidate of about the same size, reuses it. ``gpchol.enable_compile_cache()``
once at the start of a script keeps the compiled programs on disk for the next process.

Every computation runs in float64 (inside :func:`jax.enable_x64`, which is restored on
return; nothing global is changed), as scikit-learn's does, whatever the inputs' dtype.

Differences from scikit-learn's estimator:

* ``kernel`` is a gpchol kernel (default ``1.0 * ExpSquared(lengthscale=1.0)``, as
  scikit-learn's ``ConstantKernel() * RBF()``), and the hyperparameters
  are optimised without bounds: the positive ones (:meth:`Kernel.default_transforms
  <gpchol.kernels.Kernel.default_transforms>` gives them ``Positive()``) on the log scale,
  as scikit-learn does, the others as they are (a ``Bounded`` one through its sigmoid).
  Hyperparameters are fixed by name with ``fixed`` (the paths
  :meth:`GaussianProcessRegressor.hyperparameter_names` lists) instead of a kernel's
  ``*_bounds="fixed"``.
* ``optimizer`` is ``"lbfgs"`` (the default: :func:`gpchol.fit`'s optax L-BFGS, one
  compiled step), ``"fmin_l_bfgs_b"`` (SciPy's L-BFGS-B, scikit-learn's optimiser, on
  gpchol's compiled value and gradient), ``"adam"`` (:func:`gpchol.fit`), or ``None``
  (keep the kernel as given).
* :meth:`GaussianProcessRegressor.log_marginal_likelihood` takes a gpchol kernel (not a
  ``theta`` vector); its gradient is a kernel of gradients.
* One target (``y`` of shape ``(n,)``); ``y`` of shape ``(n, 1)`` is accepted with
  scikit-learn's ``DataConversionWarning``. Before :meth:`~GaussianProcessRegressor.fit`
  the methods raise ``NotFittedError`` (no prediction from the prior).
* :class:`gpchol.kernels.White` adds its variance where a test point equals a training
  point exactly, where scikit-learn's ``WhiteKernel`` adds nothing off the training set.

Example:
    >>> import numpy as np
    >>> from gpchol import kernels
    >>> from gpchol.sklearn import GaussianProcessRegressor
    >>> X = np.linspace(0.0, 5.0, 20)[:, None]
    >>> y = np.sin(X[:, 0])
    >>> est = GaussianProcessRegressor(1.0 * kernels.ExpSquared(1.0), alpha=1e-4).fit(X, y)
    >>> mean, std = est.predict(X[:3], return_std=True)
    >>> print(np.abs(mean - y[:3]).max() < 1e-2, std.shape, est.score(X, y) > 0.99)
    True (3,) True
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from gpchol import (
    GaussianProcess,
    Positive,
    Transform,
    fit,
    kernels,
    to_constrained,
    to_unconstrained,
)
from gpchol._base.buckets import bucket_size
from gpchol.cli.spec import LogPositive

__all__ = ["GaussianProcessRegressor"]

_OPTIMIZERS = {"lbfgs": "lbfgs", "fmin_l_bfgs_b": "fmin_l_bfgs_b", "adam": "adam"}


def _is_transform(x: Any) -> bool:
    return x is None or isinstance(x, Transform)


def _as_float64_leaves(kernel: Any) -> Any:
    """The kernel with every leaf a NumPy float64 array (bit-exact for float32 input)."""
    return jax.tree_util.tree_map(lambda v: np.asarray(v, np.float64), kernel)


def _y_scale(y: np.ndarray) -> tuple[float, float]:
    """``(mean, std)`` for ``normalize_y``; a (numerically) constant ``y`` gets std 1."""
    mean = float(np.mean(y))
    std = float(np.std(y))
    if std < 10 * np.finfo(np.float64).eps * max(1.0, abs(mean)):
        std = 1.0
    return mean, std


def _log_scale(t: Any) -> Any:
    """A positive parameter (``Positive()``) is optimised on the log scale, as scikit-learn
    does: amplitudes in the thousands next to lengthscales of 0.1 are far better
    conditioned for L-BFGS in ``log`` than through softplus (linear for large values)."""
    return LogPositive() if t == Positive() else t


class _Hyperparameters:
    """The kernel's leaves by path (``jax.tree_util.keystr``), free or fixed, with transforms."""

    def __init__(self, kernel: Any, fixed: Sequence[str]) -> None:
        flat, self.treedef = jax.tree_util.tree_flatten_with_path(kernel)
        self.paths = [jax.tree_util.keystr(p) for p, _ in flat]
        self.leaves = [leaf for _, leaf in flat]
        wanted = {f if f.startswith((".", "[")) else "." + f for f in fixed}
        unknown = sorted(wanted - set(self.paths))
        if unknown:
            raise ValueError(
                f"fixed names {unknown}, which the kernel does not have; its hyperparameters "
                f"are {self.paths}"
            )
        self.free = [i for i, p in enumerate(self.paths) if p not in wanted]
        tflat, _ = jax.tree_util.tree_flatten_with_path(
            kernel.default_transforms(), is_leaf=_is_transform
        )
        by_path = [(jax.tree_util.keystr(p), t) for p, t in tflat]

        def transform(path: str) -> Any:
            # the transform at the longest path that is a prefix of the leaf's path
            best = None
            for tp, t in by_path:
                if path.startswith(tp) and (best is None or len(tp) > len(best[0])):
                    best = (tp, t)
            return None if best is None else best[1]

        self.transforms = {self.paths[i]: _log_scale(transform(self.paths[i])) for i in self.free}

    def initial(self) -> dict[str, jax.Array]:
        return {self.paths[i]: jnp.asarray(self.leaves[i], jnp.float64) for i in self.free}

    def kernel(self, params: dict[str, Any]) -> Any:
        leaves = list(self.leaves)
        for i in self.free:
            leaves[i] = params[self.paths[i]]
        return jax.tree_util.tree_unflatten(self.treedef, leaves)


def _scipy_lbfgsb(
    hp: _Hyperparameters, lml: Any, *, restarts: int, rng: np.random.RandomState, max_steps: int
) -> Any:
    """SciPy's L-BFGS-B (scikit-learn's optimiser) on gpchol's jitted value and gradient.

    Minimises ``-lml(kernel)`` over the free hyperparameters in unconstrained space (the
    positive ones on the log scale, as scikit-learn), from the given values and
    ``restarts`` random perturbations of them (``+ N(0, 1)`` in unconstrained space).
    Only the value-and-gradient is compiled (once); SciPy drives the iterations.

    Returns:
        SciPy's ``OptimizeResult`` of the best start, with ``params`` (the unconstrained
        hyperparameters, a dict) and ``restart_losses`` added.
    """
    from jax.flatten_util import ravel_pytree
    from scipy.optimize import minimize

    u_start = to_unconstrained(hp.initial(), hp.transforms)
    u0, unravel = ravel_pytree(u_start)

    @jax.jit
    def value_and_grad(u: jax.Array) -> tuple[jax.Array, jax.Array]:
        def loss(v: jax.Array) -> jax.Array:
            return -lml(hp.kernel(to_constrained(unravel(v), hp.transforms)))

        return jax.value_and_grad(loss)(u)

    def f(x: np.ndarray) -> tuple[float, np.ndarray]:
        v, g = value_and_grad(jnp.asarray(x))
        v, g = float(v), np.asarray(g, np.float64)
        if not (np.isfinite(v) and np.all(np.isfinite(g))):
            return np.inf, np.zeros_like(g)  # the line search steps back
        return v, g

    x0 = np.asarray(u0, np.float64)
    best, losses = None, []
    for r in range(restarts + 1):
        start = x0 if r == 0 else x0 + rng.standard_normal(x0.shape)
        res = minimize(f, start, jac=True, method="L-BFGS-B", options={"maxiter": max_steps})
        losses.append(float(res.fun))
        if best is None or (np.isfinite(res.fun) and not res.fun >= best.fun):
            best = res
    assert best is not None
    # unravelled by NumPy: ravel_pytree's own unravel would compile a jnp.split eagerly
    leaves, treedef = jax.tree_util.tree_flatten(u_start)
    parts = np.split(np.asarray(best.x), np.cumsum([np.size(x) for x in leaves])[:-1])
    best.params = jax.tree_util.tree_unflatten(
        treedef,
        [jnp.asarray(p.reshape(np.shape(x)), x.dtype) for p, x in zip(parts, leaves, strict=True)],
    )
    best.restart_losses = losses
    return best


def _padded_posterior(kernel: Any, X: np.ndarray, y: np.ndarray, noise: np.ndarray) -> Any:
    """The posterior on ``(X, y)`` with the training points padded to their size bucket
    (masked rows: the same posterior), so that folds of about the same size share the
    conditioning and prediction programs. Call inside ``jax.enable_x64(True)``."""
    n = X.shape[0]
    size = bucket_size(n)
    pad = size - n
    Xp = np.concatenate([X, np.repeat(X[:1], pad, axis=0)]) if n else X
    yp = np.concatenate([y, np.zeros(pad)])
    noise_p = np.concatenate([noise, np.ones(pad)]) if noise.shape == (n,) else noise
    gp = GaussianProcess(kernel, jnp.asarray(Xp), noise=jnp.asarray(noise_p))
    if pad:
        gp = gp.with_mask(jnp.asarray(np.arange(size) < n))
    return gp.condition(jnp.asarray(yp))


class GaussianProcessRegressor(RegressorMixin, BaseEstimator):
    r"""Exact Gaussian-process regression with scikit-learn's estimator interface.

    Args:
        kernel: a gpchol kernel (:mod:`gpchol.kernels`); ``None``:
            ``1.0 * ExpSquared(lengthscale=1.0)`` (scikit-learn's default kernel).
        alpha: added to the diagonal of the training covariance: the observation-noise
            variance, a number or one per training point, shape ``(n,)``. Default 1e-10.
        optimizer: ``"lbfgs"`` (:func:`gpchol.fit`'s L-BFGS), ``"fmin_l_bfgs_b"`` (SciPy's
            L-BFGS-B on gpchol's value and gradient), ``"adam"`` (:func:`gpchol.fit`), or
            ``None`` to keep the kernel's hyperparameters as given.
        n_restarts_optimizer: extra starts from random perturbations of the initial
            (unconstrained) hyperparameters; the best likelihood wins.
        normalize_y: subtract the mean of ``y`` and divide by its std before fitting (the
            predictions are mapped back).
        copy_X_train: keep a copy of ``X`` (else a reference) in ``X_train_``.
        random_state: seed (int), ``numpy.random.RandomState`` or ``None``: the restarts'
            perturbations.
        fixed: hyperparameters kept at their given values while the others are optimised,
            by name (:meth:`hyperparameter_names`, e.g. ``"kernel2.kernel2.period"``).
        max_steps: most optimiser steps per start.

    Attributes:
        X_train_: ``(n, d)`` training inputs (float64).
        y_train_: ``(n,)`` training targets, normalized when ``normalize_y``.
        kernel_: the fitted kernel (NumPy float64 leaves).
        L_: ``(n, n)`` lower Cholesky factor of ``k(X, X) + alpha I``.
        alpha_: ``(n,)``, ``K^-1 (y - m)``.
        log_marginal_likelihood_value_: the log marginal likelihood of ``kernel_``.
        posterior_: the gpchol :class:`~gpchol.Posterior` behind the predictions (NumPy
            float64 leaves; compute with it under ``jax.enable_x64(True)``).
        fit_result_: :func:`gpchol.fit`'s :class:`~gpchol.FitResult`, or with
            ``"fmin_l_bfgs_b"`` SciPy's ``OptimizeResult`` (``None`` when no
            hyperparameter was optimised).
        n_features_in_: ``d``.

    Example:
        >>> import numpy as np
        >>> from gpchol import kernels
        >>> from gpchol.sklearn import GaussianProcessRegressor
        >>> X = np.linspace(0.0, 1.0, 8)[:, None]
        >>> est = GaussianProcessRegressor(kernels.Matern52(0.3), optimizer=None).fit(X, X[:, 0])
        >>> print(est.predict(X[:2]).round(3), est.sample_y(X[:2], 4).shape)
        [0.    0.143] (2, 4)
    """

    def __init__(
        self,
        kernel: Any = None,
        *,
        alpha: Any = 1e-10,
        optimizer: str | None = "lbfgs",
        n_restarts_optimizer: int = 0,
        normalize_y: bool = False,
        copy_X_train: bool = True,
        random_state: Any = None,
        fixed: Sequence[str] = (),
        max_steps: int = 500,
    ) -> None:
        self.kernel = kernel
        self.alpha = alpha
        self.optimizer = optimizer
        self.n_restarts_optimizer = n_restarts_optimizer
        self.normalize_y = normalize_y
        self.copy_X_train = copy_X_train
        self.random_state = random_state
        self.fixed = fixed
        self.max_steps = max_steps

    # ---------------------------------------------------------------------- checks
    def _kernel0(self) -> Any:
        if self.kernel is None:
            return 1.0 * kernels.ExpSquared(lengthscale=1.0)
        if not isinstance(self.kernel, kernels.Kernel):
            raise TypeError(
                "kernel must be a gpchol kernel (gpchol.kernels.*, e.g. "
                f"`2.0 * kernels.ExpSquared(1.0) + kernels.White(0.1)`); got "
                f"{type(self.kernel).__module__}.{type(self.kernel).__name__}. scikit-learn "
                "kernels are not accepted: write the same kernel with gpchol.kernels."
            )
        return self.kernel

    def _optimizer(self) -> str | None:
        if self.optimizer is None:
            return None
        if not isinstance(self.optimizer, str) or self.optimizer not in _OPTIMIZERS:
            raise ValueError(
                f"optimizer must be 'lbfgs', 'fmin_l_bfgs_b', 'adam' or None; got "
                f"{self.optimizer!r}"
            )
        return _OPTIMIZERS[self.optimizer]

    def _noise(self, n: int) -> np.ndarray:
        a = np.asarray(self.alpha, np.float64)
        if a.ndim > 1 or (a.ndim == 1 and a.shape[0] not in (1, n)):
            raise ValueError(
                f"alpha must be a number or have shape ({n},), one per training point; got "
                f"shape {a.shape}"
            )
        if not np.all(np.isfinite(a)) or np.any(a < 0):
            raise ValueError("alpha (the noise variance) must be finite and >= 0")
        return a

    def _counts(self) -> None:
        for name in ("n_restarts_optimizer", "max_steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0; got {v!r}")

    # ------------------------------------------------------------------------- fit
    def fit(self, X: Any, y: Any) -> GaussianProcessRegressor:
        """Fits the hyperparameters (unless ``optimizer=None``) and conditions on ``y``.

        Args:
            X: ``(n, d)`` training inputs (finite numbers).
            y: ``(n,)`` training targets.

        Returns:
            ``self``.

        Raises:
            ValueError: ``X`` or ``y`` has NaN or inf, or a bad argument (the message
                names it).
            numpy.linalg.LinAlgError: the covariance of the fitted kernel is not positive
                definite (raise ``alpha``).
        """
        X, y = validate_data(self, X, y, y_numeric=True, dtype=np.float64, multi_output=False)
        kernel0 = self._kernel0()
        optimizer = self._optimizer()
        self._counts()
        noise = self._noise(X.shape[0])
        mean, std = _y_scale(y) if self.normalize_y else (0.0, 1.0)
        yn = (y - mean) / std
        with jax.enable_x64(True):
            Xj, yj, nj = jnp.asarray(X), jnp.asarray(yn), jnp.asarray(noise)
            kernel0 = _as_float64_leaves(kernel0)
            hp = _Hyperparameters(kernel0, self.fixed)
            result = None
            if optimizer == "fmin_l_bfgs_b" and hp.free:
                result = _scipy_lbfgsb(
                    hp,
                    lambda k: GaussianProcess(k, Xj, noise=nj).log_marginal_likelihood(yj),
                    restarts=int(self.n_restarts_optimizer),
                    rng=check_random_state(self.random_state),
                    max_steps=int(self.max_steps),
                )
                fitted = to_constrained(result.params, hp.transforms)
                kernel_ = _as_float64_leaves(hp.kernel(fitted))
            elif optimizer is not None and hp.free:
                seed = check_random_state(self.random_state).randint(np.iinfo(np.int32).max)
                result = fit(
                    lambda p: GaussianProcess(hp.kernel(p), Xj, noise=nj),
                    hp.initial(),
                    yj,
                    transforms=hp.transforms,
                    optimizer=optimizer,
                    steps=int(self.max_steps),
                    restarts=int(self.n_restarts_optimizer),
                    key=jax.random.PRNGKey(seed),
                    progress=False,
                )
                kernel_ = _as_float64_leaves(hp.kernel(result.params))
            else:
                kernel_ = kernel0
            post = _padded_posterior(kernel_, X, yn, noise)
            if int(post.status) != 0:
                raise np.linalg.LinAlgError(
                    f"the training covariance of the kernel {kernel_!r} plus alpha is not "
                    f"positive definite (it failed at pivot {int(post.status)}); raise alpha "
                    "(e.g. alpha=1e-6), or add a White kernel"
                )
        self.X_train_ = np.copy(X) if self.copy_X_train else X
        self.y_train_ = yn
        self.kernel_ = kernel_
        # NumPy leaves: the estimator pickles, and unpickles, in float64 whatever JAX's mode
        self.posterior_ = jax.tree_util.tree_map(np.asarray, post)
        n = X.shape[0]
        self.L_ = np.asarray(post.L)[:n, :n]
        self.alpha_ = np.asarray(post.alpha)[:n]
        self.log_marginal_likelihood_value_ = float(post.log_marginal_likelihood)
        self.fit_result_ = result
        self._y_train_mean, self._y_train_std = mean, std
        return self

    # --------------------------------------------------------------------- predict
    def _posterior(self) -> Any:
        """``posterior_`` with JAX leaves (call inside ``jax.enable_x64(True)``)."""
        return jax.tree_util.tree_map(jnp.asarray, self.posterior_)

    def _test_inputs(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        return validate_data(self, X, reset=False, dtype=np.float64)

    def predict(
        self, X: Any, return_std: bool = False, return_cov: bool = False
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Posterior mean, and its std or covariance, at ``X``.

        Args:
            X: ``(m, d)`` test inputs.
            return_std: also return the ``(m,)`` posterior std of the latent function.
            return_cov: also return the ``(m, m)`` posterior covariance.

        Returns:
            ``mean`` of shape ``(m,)``, or ``(mean, std)``, or ``(mean, cov)``.

        Raises:
            RuntimeError: both ``return_std`` and ``return_cov``.
        """
        if return_std and return_cov:
            raise RuntimeError("At most one of return_std or return_cov can be requested.")
        Xs = self._test_inputs(X)
        mu, sd = self._y_train_mean, self._y_train_std
        with jax.enable_x64(True):
            xs, post = jnp.asarray(Xs), self._posterior()
            mean = np.asarray(post.mean(xs)) * sd + mu
            if return_cov:
                return mean, np.asarray(post.covariance(xs)) * sd**2
            if return_std:
                return mean, np.sqrt(np.asarray(post.variance(xs))) * sd
        return mean

    def sample_y(self, X: Any, n_samples: int = 1, random_state: Any = 0) -> np.ndarray:
        """Joint samples of the latent function from the posterior at ``X``.

        Args:
            X: ``(m, d)`` test inputs.
            n_samples: number of samples.
            random_state: seed (int), ``numpy.random.RandomState`` or ``None``.

        Returns:
            ``(m, n_samples)`` samples.
        """
        Xs = self._test_inputs(X)
        seed = check_random_state(random_state).randint(np.iinfo(np.int32).max)
        with jax.enable_x64(True):
            key = jax.random.PRNGKey(seed)
            s = np.asarray(self._posterior().sample(key, jnp.asarray(Xs), n_samples))
        return (s * self._y_train_std + self._y_train_mean).T

    def log_marginal_likelihood(
        self, kernel: Any = None, eval_gradient: bool = False
    ) -> float | tuple[float, Any]:
        """The log marginal likelihood of the training data under a kernel.

        Args:
            kernel: a gpchol kernel of the same structure as ``kernel_``; ``None``: the
                fitted kernel's value, ``log_marginal_likelihood_value_``.
            eval_gradient: also return the gradient, a kernel of the same structure whose
                leaves are the partial derivatives (needs a kernel).

        Returns:
            The value, or ``(value, gradient)``.
        """
        check_is_fitted(self)
        if kernel is None:
            if eval_gradient:
                raise ValueError("eval_gradient=True needs a kernel to differentiate at")
            return self.log_marginal_likelihood_value_
        if not isinstance(kernel, kernels.Kernel):
            raise TypeError(f"kernel must be a gpchol kernel; got {type(kernel).__name__}")
        with jax.enable_x64(True):
            X = jnp.asarray(self.X_train_)
            y = jnp.asarray(self.y_train_)
            noise = jnp.asarray(self._noise(X.shape[0]))

            def lml(k: Any) -> jax.Array:
                return GaussianProcess(k, X, noise=noise).log_marginal_likelihood(y)

            k = _as_float64_leaves(kernel)
            if eval_gradient:
                value, grad = jax.value_and_grad(lml)(k)
                return float(value), _as_float64_leaves(grad)
            return float(lml(k))

    def hyperparameter_names(self) -> list[str]:
        """The names of the kernel's hyperparameters (for ``fixed``), e.g. ``kernel1.amplitude``.

        Example:
            >>> from gpchol import kernels
            >>> from gpchol.sklearn import GaussianProcessRegressor
            >>> est = GaussianProcessRegressor(2.0 * kernels.Periodic() + kernels.White())
            >>> est.hyperparameter_names()  # doctest: +NORMALIZE_WHITESPACE
            ['kernel1.amplitude', 'kernel1.kernel.lengthscale', 'kernel1.kernel.period',
             'kernel2.variance']
        """
        return [p.lstrip(".") for p in _Hyperparameters(self._kernel0(), ()).paths]

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.target_tags.single_output = True
        tags.target_tags.multi_output = False
        tags.input_tags.allow_nan = False
        return tags

    def _more_tags(self) -> dict[str, Any]:  # scikit-learn < 1.6
        return {"multioutput": False, "allow_nan": False}
