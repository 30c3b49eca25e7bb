r"""Observation models ``p(y | f)`` for the variational GP (:class:`gpchol.SVGP`).

A likelihood is a small frozen dataclass registered as a pytree: numeric parameters (the
Gaussian noise variance) are leaves, learnable; the rest (the number of quadrature points)
is static. Each gives, for one latent value ``f_i`` per observation ``y_i``:

* :meth:`Likelihood.log_prob`: ``log p(y_i | f_i)``, shape ``(n,)``;
* :meth:`Likelihood.variational_expectation`: ``E_{f_i ~ N(mu_i, v_i)}[log p(y_i | f_i)]``,
  the data term of the evidence lower bound: in closed form for :class:`Gaussian`, by
  Gauss-Hermite quadrature otherwise (:func:`gauss_hermite_expectation`);
* :meth:`Likelihood.predict`: the mean and variance of a new observation ``y*`` under
  ``f* ~ N(mu, v)``, in closed form for the three likelihoods here.

Gauss-Hermite quadrature with ``k`` points (``numpy.polynomial.hermite.hermgauss`` nodes
``t_j`` and weights ``w_j``, exact for polynomials of degree ``2k - 1`` against
``exp(-t^2)``): with ``f = mu + sqrt(2 v) t``,

.. math::
    E_{N(f; \mu, v)}[g(f)] = \frac{1}{\sqrt\pi} \int e^{-t^2} g(\mu + \sqrt{2v}\, t)\, dt
    \approx \frac{1}{\sqrt\pi} \sum_j w_j\, g(\mu + \sqrt{2v}\, t_j).

Example:
    >>> import jax.numpy as jnp
    >>> from gpchol import likelihoods
    >>> lik = likelihoods.Poisson()
    >>> y, mu, v = jnp.array([0.0, 3.0]), jnp.array([0.0, 1.0]), jnp.array([0.5, 0.1])
    >>> lik.variational_expectation(y, mu, v).shape
    (2,)
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln, log_ndtr, ndtr

from gpchol._base.transforms import Positive
from gpchol._base.validate import check_int, is_concrete

__all__ = [
    "Bernoulli",
    "Gaussian",
    "Likelihood",
    "Poisson",
    "check_num_points",
    "gauss_hermite_expectation",
]

_LOG_2PI = float(np.log(2.0 * np.pi))


def check_num_points(num_points: object) -> int:
    """``num_points`` (Gauss-Hermite points) as a positive ``int``, or a clear error."""
    return check_int(num_points, "num_points", "Gauss-Hermite quadrature points")


def gauss_hermite_expectation(
    fn: Any, mean: jax.Array, var: jax.Array, num_points: int
) -> jax.Array:
    r"""``E[fn(f)]`` for ``f ~ N(mean, var)`` elementwise, by Gauss-Hermite quadrature.

    Args:
        fn: ``f -> values``, elementwise; called once on an array of shape
            ``(num_points,) + shape``.
        mean: means, any shape (``shape``).
        var: variances (>= 0), broadcastable to ``mean``.
        num_points: number of quadrature points (static).

    Returns:
        An array of shape ``shape``: ``sum_j w_j fn(mean + sqrt(2 var) t_j) / sqrt(pi)``.

    Differentiable in ``mean``, ``var`` and the arrays ``fn`` closes over: the derivative
    of the quadrature's value, except for ``var`` below ``sqrt(eps)``, where it is the
    quadrature of ``fn''(f) / 2`` (Price's identity), finite and right down to ``var = 0``.

    Example:
        >>> import jax.numpy as jnp
        >>> e = gauss_hermite_expectation(lambda f: f**2, jnp.array(1.0), jnp.array(0.5), 5)
        >>> round(float(e), 5)  # E[f^2] = mean^2 + var
        1.5
    """
    nodes, weights = np.polynomial.hermite.hermgauss(num_points)
    mean, var = jnp.asarray(mean), jnp.asarray(var)
    dtype = jnp.result_type(mean, var)
    shape = jnp.broadcast_shapes(mean.shape, var.shape)
    t = jnp.asarray(nodes, dtype).reshape((num_points,) + (1,) * len(shape))
    w = jnp.asarray(weights / np.sqrt(np.pi), dtype).reshape(t.shape)
    # every array fn closes over (a likelihood's parameters, y, a boolean or integer y too)
    # becomes an explicit argument: the derivative rule below differentiates through the
    # floating ones, and the rule's closure holds none (jax.closure_convert hoists floating
    # values only: a boolean y traced inside jit stayed in the closure and leaked when the
    # jitted expectation was differentiated, "No constant handler for ... Tracer")
    traced = jax.make_jaxpr(fn)(jax.ShapeDtypeStruct((num_points, *shape), dtype))
    closed = partial(_evaluate, traced.jaxpr)
    return _expectation(closed, t, w, mean.astype(dtype), var.astype(dtype), *traced.consts)


def _evaluate(jaxpr: Any, x: jax.Array, *consts: Any) -> jax.Array:
    """``fn(x)`` from its jaxpr and the values it closed over."""
    return jax.core.eval_jaxpr(jaxpr, consts, x)[0]


def _nodes(mean: jax.Array, var: jax.Array, t: jax.Array) -> jax.Array:
    """The quadrature points ``mean + sqrt(2 var) t`` (a negative ``var`` counts as 0)."""
    return mean + jnp.sqrt(2.0 * jnp.maximum(var, 0.0)) * t


@partial(jax.custom_jvp, nondiff_argnums=(0,))
def _expectation(
    fn: Any, t: jax.Array, w: jax.Array, mean: jax.Array, var: jax.Array, *consts: Any
) -> jax.Array:
    return jnp.sum(w * fn(_nodes(mean, var, t), *consts), axis=0)


@_expectation.defjvp
def _expectation_jvp(
    fn: Any, primals: tuple[Any, ...], tangents: tuple[Any, ...]
) -> tuple[jax.Array, jax.Array]:
    # The derivative of the quadrature itself, through f = m + sqrt(2 v) t, is
    #     dQ/dm = sum_j w_j g'(f_j),   dQ/dv = sum_j w_j g'(f_j) t_j / sqrt(2 v),
    # exact for the value computed, but at v -> 0 the second is 0 * infinity: the sum
    # cancels to rounding divided by sqrt(2 v) (0 at v = 0, 1e133 at v = 1e-300). There
    # Price's (heat-equation) identity dE[g(f)]/dv = E[g''(f)] / 2 (Price 1958, IRE Trans.
    # Inf. Theory 4(2); Opper & Archambeau 2009, Neural Comput. 21(3), eq. 9) is taken
    # by the same quadrature instead: for v below sqrt(eps) of the dtype, where the nodes
    # are so close that the quadrature of a smooth g is exact to rounding and the two
    # agree. g is elementwise: its derivatives along f are JVPs with a tangent of ones.
    t, w, mean, var, *consts = primals
    _, _, dmean, dvar, *dconsts = tangents
    f = _nodes(mean, var, t)
    ones = jnp.ones_like(f)

    def g1(x: jax.Array) -> jax.Array:
        return jax.jvp(lambda y: fn(y, *consts), (x,), (ones,))[1]

    values, dfirst = jax.jvp(
        lambda x, *c: fn(x, *c), (f, *consts), (jnp.broadcast_to(dmean, f.shape), *dconsts)
    )
    slope, second = jax.jvp(g1, (f,), (ones,))
    small = var <= jnp.sqrt(jnp.finfo(f.dtype).eps)
    root = jnp.sqrt(2.0 * jnp.where(small, 1.0, var))
    d_var = jnp.where(
        small, 0.5 * jnp.sum(w * second, axis=0), jnp.sum(w * slope * t, axis=0) / root
    )
    out = jnp.sum(w * values, axis=0)
    tangent = jnp.sum(w * dfirst, axis=0) + dvar * d_var
    return out, jnp.broadcast_to(tangent, out.shape).astype(out.dtype)


class Likelihood:
    """Base class of the observation models ``p(y | f)``, one latent value per observation.

    A subclass implements :meth:`log_prob` (and :meth:`predict`); the expected log
    likelihood is then computed by Gauss-Hermite quadrature with ``num_points`` points
    (static), unless the subclass overrides :meth:`variational_expectation` with a closed
    form. Every subclass is registered as a pytree when it is defined: by default with no
    leaves and ``num_points`` static; a subclass with learnable parameters overrides
    ``tree_flatten`` and ``tree_unflatten`` (as :class:`Gaussian` does).

    Args:
        num_points: Gauss-Hermite quadrature points (static; default 20).
    """

    def __init__(self, num_points: int = 20) -> None:
        self.num_points = check_num_points(num_points)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        jax.tree_util.register_pytree_node_class(cls)

    def tree_flatten(self) -> tuple[tuple[Any, ...], Any]:
        return (), self.num_points

    @classmethod
    def tree_unflatten(cls, aux: Any, children: tuple[Any, ...]) -> Any:
        obj = object.__new__(cls)
        obj.num_points = aux
        return obj

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_points={self.num_points})"

    def log_prob(self, f: jax.Array, y: jax.Array) -> jax.Array:  # pragma: no cover
        """``log p(y_i | f_i)`` elementwise (``f`` and ``y`` broadcast together)."""
        raise NotImplementedError

    def variational_expectation(self, y: jax.Array, mean: jax.Array, var: jax.Array) -> jax.Array:
        """``E_{f ~ N(mean, var)}[log p(y | f)]`` elementwise, by Gauss-Hermite quadrature.

        Args:
            y: ``(n,)`` observations.
            mean: ``(n,)`` means of the latent values.
            var: ``(n,)`` variances of the latent values.

        Returns:
            ``(n,)`` expected log likelihoods.
        """
        return gauss_hermite_expectation(
            lambda f: self.log_prob(f, y), mean, var, check_num_points(self.num_points)
        )

    def predict(self, mean: jax.Array, var: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Mean and variance of a new observation ``y*`` with ``f* ~ N(mean, var)``."""
        raise NotImplementedError  # pragma: no cover

    def check_y(self, y: jax.Array) -> None:
        """Raise on observations outside the likelihood's support (concrete ``y`` only)."""

    def default_transforms(self) -> Any:
        """Transforms for optimisation: ``None`` (no constrained parameter)."""
        return None


class Gaussian(Likelihood):
    r"""Gaussian observations, ``y = f + eps``, ``eps ~ N(0, noise)``.

    The expected log likelihood is in closed form:
    ``E[log N(y | f, s)] = -log(2 pi s) / 2 - ((y - mu)^2 + v) / (2 s)``.

    Args:
        noise: the noise *variance* ``s`` (a positive scalar, learnable; default 1).

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol.likelihoods import Gaussian
        >>> mean, var = Gaussian(0.1).predict(jnp.array([1.0]), jnp.array([0.5]))
        >>> print(mean, var)
        [1.] [0.6]
    """

    def __init__(self, noise: Any = 1.0) -> None:
        self.noise = noise
        self.num_points = 20  # unused: the expectation is in closed form

    def tree_flatten(self) -> tuple[tuple[Any, ...], Any]:
        return (self.noise,), None

    @classmethod
    def tree_unflatten(cls, aux: Any, children: tuple[Any, ...]) -> Gaussian:
        return cls(*children)

    def __repr__(self) -> str:
        return f"Gaussian(noise={self.noise!r})"

    def check_y(self, y: jax.Array) -> None:
        """Also checks a concrete ``noise``: finite and ``> 0`` (0 or less gave NaN)."""
        s = self.noise
        if isinstance(s, (int, float, np.ndarray, np.generic, jax.Array)) and is_concrete(s):
            a = np.asarray(s, np.float64)
            if not (np.all(np.isfinite(a)) and np.all(a > 0)):
                raise ValueError(
                    f"Gaussian likelihood: noise (the noise variance) must be finite and "
                    f"> 0; got {s!r}"
                )

    def log_prob(self, f: jax.Array, y: jax.Array) -> jax.Array:
        s = jnp.asarray(self.noise, jnp.result_type(f, float))
        return -0.5 * (_LOG_2PI + jnp.log(s) + (y - f) ** 2 / s)

    def variational_expectation(self, y: jax.Array, mean: jax.Array, var: jax.Array) -> jax.Array:
        s = jnp.asarray(self.noise, jnp.result_type(mean, float))
        return -0.5 * (_LOG_2PI + jnp.log(s) + ((y - mean) ** 2 + var) / s)

    def predict(self, mean: jax.Array, var: jax.Array) -> tuple[jax.Array, jax.Array]:
        return mean, var + jnp.asarray(self.noise, jnp.result_type(var, float))

    def default_transforms(self) -> Any:
        """``Gaussian(noise=Positive())``: the noise variance is optimised on a log scale."""
        return Gaussian(Positive())


class Bernoulli(Likelihood):
    r"""Binary observations ``y in {0, 1}`` with the probit link, ``p(y = 1 | f) = Phi(f)``.

    Probit rather than logit: the predictive probability is then in closed form,
    ``p(y* = 1) = Phi(mu / sqrt(1 + v))`` (a logit link needs quadrature or an
    approximation there), and ``log Phi`` is evaluated stably for any ``f``
    (``jax.scipy.special.log_ndtr``). The expected log likelihood
    ``E[log Phi((2y - 1) f)]`` has no closed form: Gauss-Hermite quadrature with
    ``num_points`` points, whose error falls geometrically with their number: at latent
    variances up to 2, with the default 20 about 3e-7 relative for ``|mean| <= 2``, 1e-6
    at 4 and 5e-6 at 5 (``log Phi``'s tail), and about 1e-12 with 60 (the
    cost, ``num_points`` evaluations per observation, is small next to the ``O(M^2)``
    per observation of the model).

    Args:
        num_points: quadrature points (static; default 20).

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol.likelihoods import Bernoulli
        >>> p, _ = Bernoulli().predict(jnp.array([0.0]), jnp.array([1.0]))
        >>> print(p)
        [0.5]
    """

    def log_prob(self, f: jax.Array, y: jax.Array) -> jax.Array:
        sign = 2.0 * jnp.asarray(y, jnp.result_type(f, float)) - 1.0
        return log_ndtr(sign * f)

    def predict(self, mean: jax.Array, var: jax.Array) -> tuple[jax.Array, jax.Array]:
        p = ndtr(mean / jnp.sqrt(1.0 + var))
        return p, p * (1.0 - p)

    def check_y(self, y: jax.Array) -> None:
        if is_concrete(y) and not np.all(np.isin(np.asarray(y), (0, 1))):
            raise ValueError("y must hold 0 or 1 for a Bernoulli likelihood (binary labels).")


class Poisson(Likelihood):
    r"""Count observations ``y in {0, 1, 2, ...}`` with the log link, rate ``exp(f)``.

    ``log p(y | f) = y f - exp(f) - log(y!)``. Its expected value under
    ``f ~ N(mu, v)`` has a closed form, ``y mu - exp(mu + v / 2) - log(y!)``, used instead
    of quadrature (which loses accuracy as ``v`` grows: 5e-5 relative at ``v = 25`` with
    20 points). The predictive: mean ``exp(mu + v / 2)``, variance
    ``mean + (exp(v) - 1) mean^2``.

    Args:
        num_points: quadrature points (static; default 20), for the base class's
            quadrature of other expectations.

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol.likelihoods import Poisson
        >>> m, v = Poisson().predict(jnp.array([0.0]), jnp.array([0.0]))
        >>> print(m, v)
        [1.] [1.]
    """

    def log_prob(self, f: jax.Array, y: jax.Array) -> jax.Array:
        y = jnp.asarray(y, jnp.result_type(f, float))
        return y * f - jnp.exp(f) - gammaln(y + 1.0)

    def variational_expectation(self, y: jax.Array, mean: jax.Array, var: jax.Array) -> jax.Array:
        """``E_{f ~ N(mean, var)}[log p(y | f)]`` in closed form (shapes as the base
        class's)."""
        y = jnp.asarray(y, jnp.result_type(mean, var, float))
        return y * mean - jnp.exp(mean + 0.5 * var) - gammaln(y + 1.0)

    def predict(self, mean: jax.Array, var: jax.Array) -> tuple[jax.Array, jax.Array]:
        m = jnp.exp(mean + 0.5 * var)
        return m, m + jnp.expm1(var) * m**2

    def check_y(self, y: jax.Array) -> None:
        if is_concrete(y):
            a = np.asarray(y)
            if not (np.all(np.isfinite(a)) and np.all(a >= 0) and np.all(a == np.round(a))):
                raise ValueError(
                    "y must hold non-negative integer counts for a Poisson likelihood."
                )
