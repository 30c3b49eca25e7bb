"""One adapter per library: the exact GP log marginal likelihood and its gradient.

Every adapter takes the common problem ``(X, y)`` and the hyperparameters in the suite's
natural parametrisation ``theta = (amplitude a, lengthscale l, noise variance s)``
(``K = a exp(-r^2 / 2 l^2) + s I``, no jitter anywhere) and returns
``(value, d value / d theta)`` as host numbers, mapping its library's own parametrisation
back by the chain rule:

=============  ==============================================================  ===========
library        model                                                           gradient in
=============  ==============================================================  ===========
gpchol         ``mvn_logpdf(y, 0, (a * ExpSquared(l))(X, X) + s I)``           theta
gpchol-gp      ``GaussianProcess(a * ExpSquared(l), X, noise=s)`` (GP API)      theta
jax-default    same K, ``jnp.linalg.cholesky`` + ``cho_solve``, JAX autodiff     theta
tinygp         ``GaussianProcess(a * ExpSquared(scale=l), X, diag=s)``          theta
gpjax          ``Prior(RBF(l, variance=a), Zero, jitter=0) * Gaussian(sqrt s)`` theta
scikit-learn   ``ConstantKernel(a) * RBF(l) + WhiteKernel(s)``, ``alpha=0``     log theta
=============  ==============================================================  ===========

GPJax adds ``jitter = 1e-6`` to the prior covariance by default: it is set to 0 here so
every library factors the same matrix. scikit-learn adds ``alpha = 1e-10`` to the diagonal
by default: set to 0 too; its gradient is with respect to ``log theta``, so
``d/d theta = (d/d log theta) / theta``. GPJax's likelihood takes the noise *standard
deviation*: ``obs_stddev = sqrt(s)`` (the chain rule goes through JAX's autodiff).

GPyTorch is not an adapter: ``pip install gpytorch`` pulls a CUDA build of torch
(2.14.1 with nvidia-cudnn-cu13 etc., several GB) on this CPU machine, which the issue rules
out for the ``bench`` extra.
"""

from __future__ import annotations

import importlib
import math

import numpy as np

_LOG_2PI = math.log(2.0 * math.pi)


def enable_x64():
    import jax

    jax.config.update("jax_enable_x64", True)


class Adapter:
    """A library's value-and-gradient step. Subclasses set ``name``, ``requires``."""

    name = "?"
    label = "?"
    requires: tuple[str, ...] = ()
    is_jax = True

    def unavailable(self) -> str | None:
        """``None`` if the library can run here, else why not (shown as a skip message)."""
        for mod in self.requires:
            try:
                importlib.import_module(mod)
            except Exception as e:  # ImportError, or a peer broken by the installed jax
                return f"{mod} not importable ({type(e).__name__}: {str(e)[:120]})"
        return None

    def build(self, X: np.ndarray, y: np.ndarray):
        """Return ``step(theta) -> (value, grad)`` for this problem (compiles lazily)."""
        raise NotImplementedError


class _JaxAdapter(Adapter):
    """``jit(value_and_grad(f))(theta, X, y)``; ``X``, ``y`` are arguments, not constants."""

    def logp(self, theta, X, y):  # pragma: no cover - abstract
        raise NotImplementedError

    def build(self, X, y):
        import jax
        import jax.numpy as jnp

        enable_x64()
        Xd, yd = jnp.asarray(X, jnp.float64), jnp.asarray(y, jnp.float64)
        fn = jax.jit(jax.value_and_grad(self.logp))

        def step(theta):
            v, g = fn(jnp.asarray(theta, jnp.float64), Xd, yd)
            return float(v), np.asarray(g)

        step.lower = lambda theta: fn.lower(jnp.asarray(theta, jnp.float64), Xd, yd)
        return step


class GpcholAdapter(_JaxAdapter):
    name = "gpchol"
    label = "gpchol (mvn_logpdf)"
    requires = ("gpchol",)

    def logp(self, theta, X, y):
        import jax.numpy as jnp

        import gpchol
        from gpchol import kernels

        a, ell, s = theta[0], theta[1], theta[2]
        K = (a * kernels.ExpSquared(lengthscale=ell))(X, X)
        K = K + s * jnp.eye(X.shape[0], dtype=K.dtype)
        return gpchol.mvn_logpdf(y, 0.0, K)


class GpcholGPAdapter(_JaxAdapter):
    name = "gpchol-gp"
    label = "gpchol (GaussianProcess)"
    requires = ("gpchol._gp.model",)

    def logp(self, theta, X, y):
        from gpchol import GaussianProcess, kernels

        gp = GaussianProcess(a_kernel(kernels, theta), X, noise=theta[2])
        return gp.log_marginal_likelihood(y)


def a_kernel(kernels, theta):
    return theta[0] * kernels.ExpSquared(lengthscale=theta[1])


class JaxDefaultAdapter(_JaxAdapter):
    """The same covariance (gpchol's kernel), factored and differentiated by JAX's rules."""

    name = "jax-default"
    label = "JAX default (jnp.linalg.cholesky)"
    requires = ("gpchol",)

    def logp(self, theta, X, y):
        import jax
        import jax.numpy as jnp

        from gpchol import kernels

        K = a_kernel(kernels, theta)(X, X) + theta[2] * jnp.eye(X.shape[0], dtype=X.dtype)
        L = jnp.linalg.cholesky(K)
        alpha = jax.scipy.linalg.cho_solve((L, True), y)
        n = y.shape[0]
        return -0.5 * y @ alpha - jnp.sum(jnp.log(jnp.diag(L))) - 0.5 * n * _LOG_2PI


class TinygpAdapter(_JaxAdapter):
    name = "tinygp"
    label = "tinygp"
    requires = ("tinygp",)

    def logp(self, theta, X, y):
        import tinygp

        kernel = theta[0] * tinygp.kernels.ExpSquared(scale=theta[1])
        return tinygp.GaussianProcess(kernel, X, diag=theta[2]).log_probability(y)


class GpjaxAdapter(_JaxAdapter):
    name = "gpjax"
    label = "GPJax"
    requires = ("gpjax",)

    def logp(self, theta, X, y):
        import warnings

        import jax.numpy as jnp

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import gpjax as gpx

            kernel = gpx.kernels.RBF(lengthscale=theta[1], variance=theta[0])
            prior = gpx.gps.Prior(
                mean_function=gpx.mean_functions.Zero(), kernel=kernel, jitter=0.0
            )
            posterior = prior * gpx.likelihoods.Gaussian(obs_stddev=jnp.sqrt(theta[2]))
            data = gpx.Dataset(X=X, y=y[:, None])
            return gpx.objectives.conjugate_mll(posterior, data)


class SklearnAdapter(Adapter):
    name = "sklearn"
    label = "scikit-learn"
    requires = ("sklearn",)
    is_jax = False

    def build(self, X, y):
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

        a, ell, s = (float(t) for t in _theta0())
        kernel = ConstantKernel(a) * RBF(ell) + WhiteKernel(s)
        names = [h.name for h in kernel.hyperparameters]
        order = [
            names.index(k)
            for k in ("k1__k1__constant_value", "k1__k2__length_scale", "k2__noise_level")
        ]
        gpr = GaussianProcessRegressor(
            kernel, alpha=0.0, optimizer=None, normalize_y=False, copy_X_train=False
        ).fit(X, y)

        def step(theta):
            theta = np.asarray(theta, float)
            log_theta = np.empty(3)
            log_theta[order] = np.log(theta)
            v, g_log = gpr.log_marginal_likelihood(
                log_theta, eval_gradient=True, clone_kernel=False
            )
            return float(v), np.asarray(g_log)[order] / theta  # chain rule: d log t = dt / t

        return step


def _theta0():
    from ._common import THETA

    return THETA


ADAPTERS = {
    a.name: a
    for a in (
        GpcholAdapter(),
        GpcholGPAdapter(),
        JaxDefaultAdapter(),
        TinygpAdapter(),
        GpjaxAdapter(),
        SklearnAdapter(),
    )
}

#: The libraries of the comparison, gpchol first (the reference).
DEFAULT_LIBS = ("gpchol", "gpchol-gp", "jax-default", "tinygp", "gpjax", "sklearn")


def available(libs=DEFAULT_LIBS, report=print) -> list[str]:
    """The libraries that can run here; a skip message for each that cannot."""
    ok = []
    for name in libs:
        why = ADAPTERS[name].unavailable()
        if why is None:
            ok.append(name)
        else:
            report(f"SKIP {name}: {why}")
    return ok
