"""Likelihoods ``p(y | f)`` of the variational GP (:class:`gpchol.SVGP`); public names.

:class:`Gaussian` (closed-form expected log likelihood), :class:`Bernoulli` (probit link)
and :class:`Poisson` (log link), the last two by Gauss-Hermite quadrature; subclass
:class:`Likelihood` and implement ``log_prob(f, y)`` for another observation model. See
:mod:`gpchol._gp.likelihoods` for the formulas.

>>> import jax.numpy as jnp
>>> from gpchol import likelihoods
>>> lik = likelihoods.Gaussian(noise=0.1)
>>> print(lik.variational_expectation(jnp.zeros(1), jnp.zeros(1), jnp.zeros(1)).shape)
(1,)
"""

from gpchol._gp.likelihoods import (
    Bernoulli,
    Gaussian,
    Likelihood,
    Poisson,
    gauss_hermite_expectation,
)

__all__ = ["Bernoulli", "Gaussian", "Likelihood", "Poisson", "gauss_hermite_expectation"]
