"""Mean functions (public names); see :mod:`gpchol._means`.

>>> from gpchol import means
>>> print(means.Constant(1.5)([0.0, 1.0]))
[1.5 1.5]
"""

from gpchol._means import Constant, Function, Linear, Mean, Zero, as_mean

__all__ = ["Constant", "Function", "Linear", "Mean", "Zero", "as_mean"]
