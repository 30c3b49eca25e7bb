r"""Plain functions as kernels: :func:`as_kernel` and the :class:`FunctionKernel` it builds.

A function ``f(x1, x2) -> scalar`` of one pair of points (each of shape ``(d,)``) is a
kernel once wrapped; its keyword hyperparameters, if any, become the kernel's learnable
leaves (``f(x1, x2, **params)``). :class:`gpchol.GaussianProcess` wraps a plain function
given as its kernel the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from gpchol.kernels._library import Kernel, parameter, static

__all__ = ["FunctionKernel", "as_kernel"]


class FunctionKernel(Kernel):
    r"""A kernel from a function of one pair of points (what :func:`as_kernel` builds).

    .. math:: k(x, x') = f(x, x', \theta)

    Args:
        fn: ``f(x1, x2, **params) -> scalar`` for points of shape ``(d,)``; static (a
            new function retraces a jitted caller), written with ``jax.numpy``.
        params: a dict of hyperparameters ``theta`` passed to ``fn`` as keyword
            arguments: the kernel's leaves; their default transform is
            :class:`gpchol.Positive` (one transform for the whole dict).

    Shapes: ``(n1, d), (n2, d) -> (n1, n2)``; ``diag``: ``(n,)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import FunctionKernel
        >>> k = FunctionKernel(lambda a, b, s: jnp.exp(-jnp.sum(jnp.abs(a - b)) / s), {"s": 2.0})
        >>> print(np.asarray(k(jnp.array([0.0, 2.0])), float).round(4))
        [[1.     0.3679]
         [0.3679 1.    ]]
    """

    fn: Callable[..., Any] = static()
    params: dict[str, Any] = parameter(default=None)

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(
                f"FunctionKernel: fn must be callable as fn(x1, x2, **params) -> scalar; "
                f"got {self.fn!r}"
            )
        if self.params is None:
            object.__setattr__(self, "params", {})

    def evaluate(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        """``fn(x1, x2, **params)``; see :meth:`Kernel.evaluate`."""
        return jnp.asarray(self.fn(x1, x2, **self.params))


def as_kernel(kernel: Any, **params: Any) -> Kernel:
    r"""A kernel from a kernel or from a function of one pair of points.

    Args:
        kernel: a :class:`Kernel` (returned unchanged; then no ``params`` may be given),
            or a callable ``f(x1, x2, **params) -> scalar`` for one pair of points of
            shape ``(d,)``, written with ``jax.numpy``; gpchol vectorises it.
        **params: hyperparameters passed to ``f`` as keyword arguments: the learnable
            leaves of the kernel (:class:`gpchol.Positive` by default; pass other
            ``transforms`` to :func:`gpchol.fit` for parameters of any sign).

    Returns:
        ``kernel`` itself, or a :class:`FunctionKernel`.

    Raises:
        TypeError: when ``kernel`` is neither a kernel nor callable, or ``params`` are
            given with a kernel.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol import kernels
        >>> k = kernels.as_kernel(lambda a, b, ls: jnp.exp(-jnp.sum((a - b) ** 2) / ls), ls=2.0)
        >>> X = jnp.array([0.0, 1.0])
        >>> print(np.asarray(k(X), float).round(4))
        [[1.     0.6065]
         [0.6065 1.    ]]
    """
    if isinstance(kernel, Kernel):
        if params:
            raise TypeError(
                f"as_kernel: hyperparameters {sorted(params)} can only be given with a "
                f"function; {type(kernel).__name__} is already a kernel (set its fields)"
            )
        return kernel
    if not callable(kernel):
        raise TypeError(
            "kernel must be a gpchol kernel (gpchol.kernels.*, or a subclass of "
            "gpchol.kernels.Kernel implementing evaluate(self, x1, x2)) or a function "
            f"f(x1, x2) -> scalar of one pair of points; got {type(kernel).__name__}."
        )
    return FunctionKernel(kernel, dict(params))
