r"""A scikit-learn estimator on gpchol's exact GP: :class:`GaussianProcessRegressor`.

A drop-in for :class:`sklearn.gaussian_process.GaussianProcessRegressor`: the same
constructor arguments, methods and attributes, scikit-learn's kernel objects (``RBF``,
``Matern``, ``RationalQuadratic``, ``ExpSineSquared``, ``DotProduct``, ``WhiteKernel``,
``ConstantKernel``, their sums, products and powers, with their ``*_bounds``) or gpchol
kernels (:mod:`gpchol.kernels`), on gpchol's Cholesky factorization and its adjoint. It
needs scikit-learn (``pip install gpchol[sklearn]``); importing ``gpchol`` does not import
this module or scikit-learn.

Switching from scikit-learn is a change of import::

    from gpchol.sklearn import GaussianProcessRegressor  # was: from sklearn.gaussian_process

A scikit-learn kernel is translated to the gpchol kernel with the same covariance
(:mod:`gpchol._sklearn_kernels`); ``kernel_`` is then the fitted scikit-learn kernel
(``kernel_.theta``, ``get_params()``, its ``repr``), and
:meth:`~GaussianProcessRegressor.log_marginal_likelihood` takes scikit-learn's log-space
``theta``. ``y`` may have several columns (one kernel, its hyperparameters shared by
every target, as scikit-learn does).

Fitting compiles one program per kernel structure and size bucket (:func:`gpchol.fit`): a
second ``fit`` of the same kernel structure in the process, a cross-validation fold or a
grid-search candidate of about the same size, reuses it. ``gpchol.enable_compile_cache()``
once at the start of a script keeps the compiled programs on disk for the next process.

Every computation runs in float64 (inside :func:`jax.enable_x64`, which is restored on
return; nothing global is changed), as scikit-learn's does, whatever the inputs' dtype.

Differences from scikit-learn's estimator:

* ``optimizer`` defaults to ``"lbfgs"``: :func:`gpchol.fit`'s optax L-BFGS, one compiled
  step, the ``*_bounds`` of a scikit-learn kernel as bounded transforms of ``theta`` (a
  logistic sigmoid between two finite bounds), which reach a bound only in the limit.
  ``"fmin_l_bfgs_b"`` is scikit-learn's optimiser (SciPy's L-BFGS-B with the bounds as a
  box, on gpchol's compiled value and gradient); a callable with scikit-learn's
  ``optimizer(obj_func, initial_theta, bounds)`` contract works as there; ``"adam"``
  (:func:`gpchol.fit`); ``None`` keeps the kernel as given.
* A gpchol kernel's hyperparameters are optimised without bounds: the positive ones on
  the log scale, as scikit-learn does, the others as they are (a ``Bounded`` one through
  its sigmoid); they are fixed by name with ``fixed`` (the paths
  :meth:`GaussianProcessRegressor.hyperparameter_names` lists). For a callable
  optimizer, ``theta`` is then those values in unconstrained space.
* ``WhiteKernel`` becomes :class:`gpchol.kernels.White`: it adds its variance also where a
  test point equals a training point exactly (scikit-learn's adds nothing off the
  training set), and does not separate duplicated training rows (``alpha`` does).
* Kernels are translated by exact type: a subclass of a scikit-learn kernel (which may
  change its covariance), ``PairwiseKernel``, ``CompoundKernel``, a ``Matern`` with
  another ``nu`` or a kernel on non-numeric inputs raise ``TypeError``/``ValueError``
  naming it. Error messages are gpchol's own wording.

Example:
    >>> import numpy as np
    >>> from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel
    >>> from gpchol.sklearn import GaussianProcessRegressor
    >>> X = np.linspace(0.0, 5.0, 20)[:, None]
    >>> y = np.sin(X[:, 0])
    >>> kernel = ConstantKernel(1.0) * RBF(1.0) + WhiteKernel(1e-3, (1e-6, 1.0))
    >>> est = GaussianProcessRegressor(kernel, alpha=1e-6).fit(X, y)
    >>> mean, std = est.predict(X[:3], return_std=True)
    >>> print(np.abs(mean - y[:3]).max() < 1e-2, std.shape, est.score(X, y) > 0.99)
    True (3,) True
    >>> print(type(est.kernel_).__name__, est.kernel_.theta.shape)
    Sum (3,)
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin, clone
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.gaussian_process import kernels as sk_kernels
from sklearn.utils import check_random_state
from sklearn.utils.validation import validate_data

from gpchol import GaussianProcess, Posterior, kernels
from gpchol._base.buckets import bucket_size, pad_rows
from gpchol._base.validate import check_int, check_scalar_or_vector
from gpchol._sklearn_kernels import is_sklearn_kernel, translate
from gpchol._sklearn_models import (
    GpcholSpace,
    SklearnSpace,
    Space,
    log_marginal_likelihood,
    optimize,
)

__all__ = ["GaussianProcessRegressor"]

_OPTIMIZERS = ("lbfgs", "fmin_l_bfgs_b", "adam")


def _as_float64_leaves(kernel: Any) -> Any:
    """The kernel with every leaf a NumPy float64 array (bit-exact for float32 input)."""
    return jax.tree_util.tree_map(lambda v: np.asarray(v, np.float64), kernel)


def _y_scale(Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, std)`` per column of ``Y`` (``(n, t)``) for ``normalize_y``; a (numerically)
    constant column gets std 1."""
    mean = np.mean(Y, axis=0)
    std = np.std(Y, axis=0)
    tiny = 10 * np.finfo(np.float64).eps * np.maximum(1.0, np.abs(mean))
    return mean, np.where(std < tiny, 1.0, std)


def _default_kernel() -> Any:
    """scikit-learn's default: ``ConstantKernel(1.0) * RBF(1.0)``."""
    return sk_kernels.ConstantKernel(1.0) * sk_kernels.RBF(1.0)


def _padded_posterior(kernel: Any, X: np.ndarray, y: np.ndarray, noise: np.ndarray) -> Any:
    """The posterior on ``(X, y)`` with the training points padded to their size bucket
    (masked rows: the same posterior), so that folds of about the same size share the
    conditioning and prediction programs. Call inside ``jax.enable_x64(True)``."""
    n = X.shape[0]
    size = bucket_size(n)
    Xp = pad_rows(X, size, X[0]) if n else X
    yp = pad_rows(y, size, 0.0)
    noise_p = pad_rows(noise, size, 1.0) if noise.shape == (n,) else noise
    # jax.device_put, not jnp.asarray: eager jnp.asarray of a NumPy array compiles a small
    # program per shape
    gp = GaussianProcess(kernel, jax.device_put(Xp), noise=jax.device_put(noise_p))
    if size > n:
        gp = gp.with_mask(jax.device_put(np.arange(size) < n))
    return gp.condition(jax.device_put(yp))


def _with_alpha(post: Any, alpha: Any) -> Any:
    """The posterior ``post`` for other targets: the same factor, ``alpha`` replaced."""
    return Posterior(
        post.gp,
        post.L,
        jnp.asarray(alpha),
        post.log_marginal_likelihood,
        post.status,
        post.jitter_used,
        post.block_size,
    )


def _at_bounds(space: SklearnSpace, theta: np.ndarray) -> None:
    """A ``ConvergenceWarning`` for each fitted value that ended on one of its bounds."""
    lo, hi = space.bounds[:, 0], space.bounds[:, 1]
    names = space.translation.names
    for i, name in enumerate(names):
        element = sum(1 for n in names[:i] if n == name)
        for end, side in ((lo[i], "lower"), (hi[i], "upper")):
            if np.isfinite(end) and abs(theta[i] - end) <= 1e-5 * max(1.0, abs(end)):
                warnings.warn(
                    f"kernel_: {name} (element {element}) ended at its {side} bound "
                    f"{np.exp(end):.6g}; a wider {name}_bounds may give a higher likelihood",
                    ConvergenceWarning,
                    stacklevel=3,
                )


class GaussianProcessRegressor(RegressorMixin, BaseEstimator):
    r"""Exact Gaussian-process regression with scikit-learn's estimator interface.

    Args:
        kernel: a scikit-learn kernel object, or a gpchol kernel (:mod:`gpchol.kernels`);
            ``None``: ``ConstantKernel(1.0) * RBF(1.0)`` (scikit-learn's default).
        alpha: added to the diagonal of the training covariance: the observation-noise
            variance, a number or one per training point, shape ``(n,)``. Default 1e-10.
        optimizer: ``"lbfgs"`` (:func:`gpchol.fit`'s L-BFGS), ``"fmin_l_bfgs_b"`` (SciPy's
            L-BFGS-B on gpchol's value and gradient), ``"adam"`` (:func:`gpchol.fit`), a
            callable ``optimizer(obj_func, initial_theta, bounds) -> (theta, value)``
            (scikit-learn's contract: ``obj_func(theta, eval_gradient=True)`` returns the
            negative log marginal likelihood and its gradient), or ``None`` to keep the
            kernel's hyperparameters as given.
        n_restarts_optimizer: extra starts; the best likelihood wins. For a scikit-learn
            kernel drawn uniformly between the (then necessarily finite) log-bounds, for a
            gpchol kernel as random perturbations (``+ N(0, 1)`` in unconstrained space).
        normalize_y: subtract the mean of each target and divide by its std before
            fitting (the predictions are mapped back).
        copy_X_train: keep a copy of ``X`` (else a reference) in ``X_train_``.
        n_targets: the number of target columns, for predictions and samples before
            ``fit`` (from the prior); ``None``: one. ``fit`` checks ``y`` against it.
        random_state: seed (int), ``numpy.random.RandomState`` or ``None``: the restarts'
            starts.
        fixed: for a gpchol kernel, hyperparameters kept at their given values while the
            others are optimised, by name (:meth:`hyperparameter_names`, e.g.
            ``"kernel2.kernel2.period"``); a scikit-learn kernel's are fixed with its
            ``*_bounds="fixed"``.
        max_steps: most optimiser steps per start.

    Attributes:
        X_train_: ``(n, d)`` training inputs (float64).
        y_train_: ``(n,)`` or ``(n, t)`` training targets, normalized when ``normalize_y``.
        kernel_: the fitted kernel: a scikit-learn kernel object for a scikit-learn
            kernel, else a gpchol kernel (NumPy float64 leaves).
        L_: ``(n, n)`` lower Cholesky factor of ``k(X, X) + alpha I``.
        alpha_: ``(n,)`` or ``(n, t)``, ``K^-1 y``.
        log_marginal_likelihood_value_: the log marginal likelihood of ``kernel_`` (summed
            over the targets).
        posterior_: the gpchol :class:`~gpchol.Posterior` of the first target (NumPy
            float64 leaves; compute with it under ``jax.enable_x64(True)``); its
            ``gp.kernel`` is the gpchol kernel behind ``kernel_``.
        fit_result_: with ``"lbfgs"``/``"adam"``, :func:`gpchol.fit`'s
            :class:`~gpchol.FitResult` of the best start; with ``"fmin_l_bfgs_b"``
            SciPy's ``OptimizeResult``; ``None`` when nothing was optimised or the
            optimizer is a callable.
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
        optimizer: Any = "lbfgs",
        n_restarts_optimizer: int = 0,
        normalize_y: bool = False,
        copy_X_train: bool = True,
        n_targets: int | None = None,
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
        self.n_targets = n_targets
        self.random_state = random_state
        self.fixed = fixed
        self.max_steps = max_steps

    # ---------------------------------------------------------------------- checks
    def _kernel0(self) -> Any:
        if self.kernel is None:
            return _default_kernel()
        if not isinstance(self.kernel, kernels.Kernel) and not is_sklearn_kernel(self.kernel):
            raise TypeError(
                "kernel must be a scikit-learn kernel (sklearn.gaussian_process.kernels) or "
                "a gpchol kernel (gpchol.kernels); got "
                f"{type(self.kernel).__module__}.{type(self.kernel).__name__}"
            )
        return self.kernel

    def _space(self, kernel: Any, d: int) -> Space:
        if is_sklearn_kernel(kernel):
            if len(self.fixed):
                raise ValueError(
                    f"fixed={tuple(self.fixed)!r} names hyperparameters of a gpchol kernel; "
                    'fix those of a scikit-learn kernel with its *_bounds="fixed"'
                )
            return SklearnSpace(translate(kernel, d))
        if isinstance(self.fixed, str):
            raise TypeError(
                f"fixed must be a list of hyperparameter names, e.g. [{self.fixed!r}]; got "
                "the string itself"
            )
        return GpcholSpace(_as_float64_leaves(kernel), self.fixed)

    def _optimizer(self) -> Any:
        if self.optimizer is None or callable(self.optimizer):
            return self.optimizer
        if not isinstance(self.optimizer, str) or self.optimizer not in _OPTIMIZERS:
            raise ValueError(
                "optimizer must be 'lbfgs', 'fmin_l_bfgs_b', 'adam', a callable "
                f"optimizer(obj_func, initial_theta, bounds) or None; got {self.optimizer!r}"
            )
        return self.optimizer

    def _noise(self, n: int) -> np.ndarray:
        a = np.asarray(self.alpha, np.float64)
        check_scalar_or_vector(a.shape, n, "alpha", "noise variance per training point")
        if not np.all(np.isfinite(a)) or np.any(a < 0):
            raise ValueError("alpha (the noise variance) must be finite and >= 0")
        return a

    def _counts(self) -> None:
        for name in ("n_restarts_optimizer", "max_steps"):
            check_int(getattr(self, name), name, minimum=0, strict=False)
        if self.n_targets is not None:
            check_int(self.n_targets, "n_targets", "or None", strict=False)

    # ------------------------------------------------------------------------- fit
    def fit(self, X: Any, y: Any) -> GaussianProcessRegressor:
        """Fits the hyperparameters (unless ``optimizer=None``) and conditions on ``y``.

        Args:
            X: ``(n, d)`` training inputs (finite numbers).
            y: ``(n,)`` training targets, or ``(n, t)`` for ``t`` targets sharing the
                kernel.

        Returns:
            ``self``.

        Raises:
            ValueError: ``X`` or ``y`` has NaN or inf, or a bad argument (the message
                names it).
            TypeError: a kernel that is neither a gpchol kernel nor a scikit-learn kernel
                gpchol translates (the message names it).
            numpy.linalg.LinAlgError: the covariance of the kernel is not positive
                definite (raise ``alpha``).
        """
        kernel0 = self._kernel0()
        method = self._optimizer()
        self._counts()
        X, y = validate_data(self, X, y, multi_output=True, y_numeric=True, dtype=np.float64)
        n = X.shape[0]
        Y = y.reshape(n, -1)
        if self.n_targets is not None and Y.shape[1] != self.n_targets:
            raise ValueError(
                f"y has {Y.shape[1]} target column(s) but n_targets={self.n_targets}; give "
                "n_targets=None or the number of columns of y"
            )
        noise = self._noise(n)
        if self.normalize_y:
            mean, std = _y_scale(Y)
        else:
            mean, std = np.zeros(Y.shape[1]), np.ones(Y.shape[1])
        Yn = (Y - mean) / std
        with jax.enable_x64(True):
            space = self._space(kernel0, X.shape[1])
            kernel_g = space.start_kernel()
            theta = space.x0
            result = None
            optimized = method is not None and space.x0.size > 0
            if optimized:
                try:
                    best = optimize(
                        space,
                        X,
                        Yn,
                        noise,
                        method=method,
                        restarts=int(self.n_restarts_optimizer),
                        rng=check_random_state(self.random_state),
                        max_steps=int(self.max_steps),
                    )
                except ValueError:  # gpchol.fit's non-finite start: say why, if it is that
                    self._check_factor(kernel0, _padded_posterior(kernel_g, X, Yn[:, 0], noise))
                    raise
                kernel_g, theta, result = best.kernel, best.x, best.result
                if isinstance(space, SklearnSpace):
                    _at_bounds(space, theta)
            kernel_g = _as_float64_leaves(kernel_g)
            if isinstance(space, SklearnSpace):
                kernel_ = kernel0.clone_with_theta(theta) if optimized else clone(kernel0)
            else:
                kernel_ = kernel_g
            post = _padded_posterior(kernel_g, X, Yn[:, 0], noise)
            self._check_factor(kernel_, post)
        L = np.asarray(post.L)[:n, :n]
        A = np.empty_like(Yn)
        A[:, 0] = np.asarray(post.alpha)[:n]
        if Yn.shape[1] > 1:
            from scipy.linalg import cho_solve

            A[:, 1:] = cho_solve((L, True), Yn[:, 1:])
        lml0 = float(post.log_marginal_likelihood)
        quad = np.einsum("it,it->t", Yn, A)
        self.X_train_ = np.copy(X) if self.copy_X_train else X
        self.y_train_ = Yn if y.ndim == 2 else Yn[:, 0]
        self.kernel_ = kernel_
        # NumPy leaves: the estimator pickles, and unpickles, in float64 whatever JAX's mode
        self.posterior_ = jax.tree_util.tree_map(np.asarray, post)
        self.L_ = L
        self.alpha_ = A if y.ndim == 2 else A[:, 0]
        self.log_marginal_likelihood_value_ = np.float64(np.sum(lml0 + 0.5 * (quad[0] - quad)))
        self.fit_result_ = result if isinstance(method, str) else None
        single = y.ndim == 1
        self._y_train_mean = float(mean[0]) if single else mean
        self._y_train_std = float(std[0]) if single else std
        pad = np.asarray(post.alpha).shape[0] - n
        self._alphas = np.concatenate([A, np.zeros((pad, A.shape[1]))])  # padded, per target
        return self

    @staticmethod
    def _check_factor(kernel: Any, post: Any) -> None:
        if int(post.status) != 0:
            raise np.linalg.LinAlgError(
                f"the training covariance of the kernel {kernel!r} plus alpha is not "
                f"positive definite (it failed at pivot {int(post.status)}); raise alpha "
                "(e.g. alpha=1e-6), or add a White kernel"
            )

    # --------------------------------------------------------------------- predict
    def _fitted(self) -> bool:
        return hasattr(self, "X_train_")

    def _test_inputs(self, X: Any) -> np.ndarray:
        return validate_data(self, X, reset=False, dtype=np.float64)

    def _targets(self) -> tuple[list[Any], np.ndarray, np.ndarray, bool]:
        """``(posteriors, mean, std, squeeze)``: a posterior per target (JAX leaves; call
        inside ``jax.enable_x64``), the targets' scaling, and whether the outputs drop
        their target axis (one target)."""
        post = jax.tree_util.tree_map(jax.device_put, self.posterior_)
        posts = [post] + [_with_alpha(post, a) for a in self._alphas.T[1:]]
        mean = np.atleast_1d(np.asarray(self._y_train_mean, np.float64))
        std = np.atleast_1d(np.asarray(self._y_train_std, np.float64))
        return posts, mean, std, len(posts) == 1

    def _prior(self, d: int) -> tuple[list[Any], np.ndarray, np.ndarray, bool]:
        """As :meth:`_targets`, for the prior (before ``fit``): ``n_targets`` targets."""
        kernel = self._kernel0()
        if is_sklearn_kernel(kernel):
            kernel = translate(kernel, d).gpchol_kernel()
        kernel = _as_float64_leaves(kernel)
        post = GaussianProcess(kernel, jnp.zeros((0, d)), noise=0.0).condition(jnp.zeros(0))
        self._counts()
        t = 1 if self.n_targets is None else int(self.n_targets)
        return [post] * t, np.zeros(t), np.ones(t), t == 1

    def predict(
        self, X: Any, return_std: bool = False, return_cov: bool = False
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Posterior mean, and its std or covariance, at ``X`` (the prior before ``fit``).

        Args:
            X: ``(m, d)`` test inputs.
            return_std: also return the posterior std of the latent function.
            return_cov: also return the posterior covariance.

        Returns:
            ``mean`` of shape ``(m,)`` (one target) or ``(m, t)``, or ``(mean, std)`` with
            ``std`` of the same shape, or ``(mean, cov)`` with ``cov`` ``(m, m)`` or
            ``(m, m, t)``.

        Raises:
            RuntimeError: both ``return_std`` and ``return_cov``.
        """
        if return_std and return_cov:
            raise RuntimeError("At most one of return_std or return_cov can be requested.")
        Xs = self._test_inputs(X)
        with jax.enable_x64(True):
            xs = jax.device_put(Xs)
            posts, mu, sd, squeeze = self._targets() if self._fitted() else self._prior(Xs.shape[1])
            extra = None
            if return_std and not return_cov:  # mean and variance in one program
                m0, v0 = posts[0].mean_and_variance(xs)
                means = [m0] + [p.mean(xs) for p in posts[1:]]
                extra = np.sqrt(np.asarray(v0))[:, None] * sd
            else:
                means = [p.mean(xs) for p in posts]
            mean = np.stack([np.asarray(m) for m in means], axis=1) * sd + mu
            if return_cov:
                extra = np.asarray(posts[0].covariance(xs))[..., None] * sd**2
        if squeeze:
            mean = mean[:, 0]
            extra = None if extra is None else extra[..., 0]
        return mean if extra is None else (mean, extra)

    def sample_y(self, X: Any, n_samples: int = 1, random_state: Any = 0) -> np.ndarray:
        """Joint samples of the latent function from the posterior (the prior before
        ``fit``) at ``X``.

        Args:
            X: ``(m, d)`` test inputs.
            n_samples: number of samples.
            random_state: seed (int), ``numpy.random.RandomState`` or ``None``.

        Returns:
            ``(m, n_samples)`` samples (one target), or ``(m, t, n_samples)``.
        """
        Xs = self._test_inputs(X)
        seed = check_random_state(random_state).randint(np.iinfo(np.int32).max)
        with jax.enable_x64(True):
            posts, mu, sd, squeeze = self._targets() if self._fitted() else self._prior(Xs.shape[1])
            key = jax.random.PRNGKey(seed)
            xs = jax.device_put(Xs)
            draws = [
                np.asarray(p.sample(key if j == 0 else jax.random.fold_in(key, j), xs, n_samples))
                for j, p in enumerate(posts)
            ]
        out = np.stack(draws, axis=1).T * sd[:, None] + mu[:, None]  # (m, t, n_samples)
        return out[:, 0, :] if squeeze else out

    def log_marginal_likelihood(
        self, theta: Any = None, eval_gradient: bool = False, clone_kernel: bool = True
    ) -> float | tuple[float, Any]:
        """The log marginal likelihood of the training data (summed over the targets).

        Args:
            theta: ``None`` (the fitted kernel's value,
                ``log_marginal_likelihood_value_``); scikit-learn's ``theta``, the
                ``(k,)`` log-values of ``kernel_``'s hyperparameters that are not fixed
                (for a scikit-learn kernel); or a gpchol kernel of the same structure as
                ``kernel_`` (for a gpchol kernel).
            eval_gradient: also return the gradient: ``(k,)`` with respect to ``theta``,
                or a kernel of the same structure whose leaves are the partial
                derivatives.
            clone_kernel: ``False`` sets ``kernel_.theta`` to ``theta`` (scikit-learn's
                behaviour); ``True`` leaves ``kernel_`` as it is.

        Returns:
            The value, or ``(value, gradient)``; ``-inf`` (and a zero gradient) where the
            covariance cannot be factored, as scikit-learn's.

        Raises:
            ValueError: ``eval_gradient`` without ``theta``, or ``theta`` of the wrong
                shape (the message gives the expected one).
            TypeError: a ``theta`` vector with a gpchol kernel, or a gpchol kernel with a
                scikit-learn one.
        """
        if not self._fitted():
            raise NotFittedError(
                "log_marginal_likelihood needs training data: call fit(X, y) first"
            )
        if theta is None:
            if eval_gradient:
                raise ValueError(
                    "eval_gradient=True needs theta (or a gpchol kernel): the gradient is "
                    "taken at given hyperparameters"
                )
            return self.log_marginal_likelihood_value_
        X = self.X_train_
        Y = self.y_train_.reshape(X.shape[0], -1)
        noise = self._noise(X.shape[0])
        if isinstance(theta, kernels.Kernel):
            if is_sklearn_kernel(self.kernel_):
                raise TypeError(
                    "theta: this estimator's kernel is a scikit-learn kernel; give its log "
                    "hyperparameters (a vector like kernel_.theta), not a gpchol kernel"
                )
            with jax.enable_x64(True):
                Xj, Yj, nj = jnp.asarray(X), jnp.asarray(Y), jnp.asarray(noise)

                def lml(k: Any) -> jax.Array:
                    return log_marginal_likelihood(k, Xj, Yj, nj)

                k = _as_float64_leaves(theta)
                if eval_gradient:
                    value, grad = jax.value_and_grad(lml)(k)
                    if not np.isfinite(value):  # not factorable: scikit-learn's -inf, 0
                        return np.float64(-np.inf), jax.tree_util.tree_map(np.zeros_like, grad)
                    return np.float64(value), _as_float64_leaves(grad)
                value = np.float64(lml(k))
                return value if np.isfinite(value) else np.float64(-np.inf)
        if not is_sklearn_kernel(self.kernel_):
            raise TypeError(
                "theta: this estimator's kernel is a gpchol kernel; give a gpchol kernel of "
                f"the same structure as kernel_ (not a {type(theta).__name__})"
            )
        expected = self.kernel_.theta.shape
        th = np.asarray(theta, np.float64)
        if th.shape != expected:
            raise ValueError(
                f"theta must have shape {expected}, one log-value per hyperparameter of "
                f"kernel_ that is not fixed ({self.kernel_.theta.size}: see "
                f"kernel_.hyperparameters); got shape {th.shape}"
            )
        kernel = self.kernel_ if not clone_kernel else clone(self.kernel_)
        kernel.theta = th
        with jax.enable_x64(True):
            space = SklearnSpace(translate(kernel, X.shape[1]))
            objective = space.objective(jnp.asarray(X), jnp.asarray(Y), jnp.asarray(noise))
            if eval_gradient:
                value, grad = objective(th, True)
                return np.float64(-value), -grad
            return np.float64(-objective(th, False))

    def hyperparameter_names(self) -> list[str]:
        """The names of the kernel's hyperparameters: a gpchol kernel's leaf paths (for
        ``fixed``), e.g. ``kernel1.amplitude``, or a scikit-learn kernel's names.

        Example:
            >>> from gpchol import kernels
            >>> from gpchol.sklearn import GaussianProcessRegressor
            >>> est = GaussianProcessRegressor(2.0 * kernels.Periodic() + kernels.White())
            >>> est.hyperparameter_names()  # doctest: +NORMALIZE_WHITESPACE
            ['kernel1.amplitude', 'kernel1.kernel.lengthscale', 'kernel1.kernel.period',
             'kernel2.variance']
            >>> GaussianProcessRegressor().hyperparameter_names()  # scikit-learn's default
            ['k1__constant_value', 'k2__length_scale']
        """
        kernel = self._kernel0()
        if is_sklearn_kernel(kernel):
            return [hp.name for hp in kernel.hyperparameters]
        with jax.enable_x64(True):  # as every other computation here (no float32 warning)
            return [p.lstrip(".") for p in GpcholSpace(_as_float64_leaves(kernel), ()).paths]

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.target_tags.single_output = True
        tags.target_tags.multi_output = True
        tags.input_tags.allow_nan = False
        tags.requires_fit = False  # predictions from the prior before fit, as scikit-learn
        return tags

    def _more_tags(self) -> dict[str, Any]:  # scikit-learn < 1.6
        return {"multioutput": True, "allow_nan": False, "requires_fit": False}
