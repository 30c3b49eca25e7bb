"""Covariance kernels (public names); see :mod:`gpchol.kernels._library` for the conventions.

Write your own kernel by subclassing :class:`Kernel` and implementing
``evaluate(self, x1, x2)`` for one pair of points; wrap a plain function with
:func:`as_kernel`.

>>> from gpchol import kernels
>>> k = 2.0 * kernels.ExpSquared(lengthscale=0.5) + kernels.White()
>>> print(k([0.0, 1.0]).shape)
(2, 2)
"""

from gpchol.kernels._custom import FunctionKernel, as_kernel
from gpchol.kernels._families import ChangePoints, Cosine, SpectralMixture
from gpchol.kernels._inputs import InputScale, KumaraswamyWarp, LinearMap, Subspace, Warp
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
    Power,
    Product,
    RationalQuadratic,
    Scale,
    Sum,
    White,
    parameter,
    static,
)

__all__ = [
    "RBF",
    "ChangePoints",
    "Constant",
    "Cosine",
    "ExpSineSquared",
    "ExpSquared",
    "FunctionKernel",
    "InputScale",
    "Kernel",
    "KumaraswamyWarp",
    "Linear",
    "LinearMap",
    "Matern12",
    "Matern32",
    "Matern52",
    "Periodic",
    "Polynomial",
    "Power",
    "Product",
    "RationalQuadratic",
    "Scale",
    "SpectralMixture",
    "Subspace",
    "Sum",
    "Warp",
    "White",
    "as_kernel",
    "parameter",
    "static",
]
