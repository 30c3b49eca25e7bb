"""Covariance kernels (public names); see :mod:`gpchol.kernels._library` for the conventions.

>>> from gpchol import kernels
>>> k = 2.0 * kernels.ExpSquared(lengthscale=0.5) + kernels.White()
>>> print(k([0.0, 1.0]).shape)
(2, 2)
"""

from gpchol.kernels._library import (
    RBF,
    Constant,
    ExpSineSquared,
    ExpSquared,
    Kernel,
    Linear,
    Matern12,
    Matern32,
    Matern52,
    Periodic,
    Polynomial,
    Product,
    RationalQuadratic,
    Scale,
    Sum,
    White,
)

__all__ = [
    "RBF",
    "Constant",
    "ExpSineSquared",
    "ExpSquared",
    "Kernel",
    "Linear",
    "Matern12",
    "Matern32",
    "Matern52",
    "Periodic",
    "Polynomial",
    "Product",
    "RationalQuadratic",
    "Scale",
    "Sum",
    "White",
]
