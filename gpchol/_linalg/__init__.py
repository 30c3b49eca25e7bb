"""One-device linear algebra: the factor and its derivative rules, status, backends,
triangular solves, the Gaussian whole-likelihood rule, compiled host LAPACK.

Imports only :mod:`gpchol._base` and :mod:`gpchol._cuda`.
"""
