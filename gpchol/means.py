"""Mean functions: small pytrees mapping inputs ``X`` of shape ``(n, d)`` to ``(n,)``.

Like the kernels, a mean is a frozen dataclass registered as a pytree; its numeric
parameters are leaves (learnable), everything else is static. A mean called on ``X`` of
shape ``(n, d)`` (or ``(n,)``, read as ``(n, 1)``) returns shape ``(n,)`` in the floating
dtype of ``X``. :func:`as_mean` turns the usual shorthands into a mean:

>>> import jax.numpy as jnp
>>> from gpchol.means import as_mean
>>> X = jnp.array([[0.0], [1.0], [2.0]])
>>> print(as_mean(None)(X), as_mean(2.5)(X))
[0. 0. 0.] [2.5 2.5 2.5]
>>> print(as_mean(lambda X: 2.0 * X[:, 0])(X))
[0. 2. 4.]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from gpchol._base.pytrees import as_param, is_scalar, pytree_dataclass, scalar_param
from gpchol._base.validate import as_inputs, check_scalar_or_vector

_T = TypeVar("_T")

__all__ = ["Constant", "Function", "Linear", "Mean", "Zero", "as_mean"]


class Mean:
    """Base class of the mean functions: ``m(X)`` gives shape ``(n,)``.

    Subclasses implement ``_eval(x)`` on a validated floating ``(n, d)`` array.
    """

    def __call__(self, X: Any) -> jax.Array:
        """Evaluates the mean.

        Args:
            X: inputs, shape ``(n, d)`` or ``(n,)``.

        Returns:
            The mean at each input, shape ``(n,)``, in the floating dtype of ``X``.
        """
        return self._eval(as_inputs(X))

    def _eval(self, x: jax.Array) -> jax.Array:  # pragma: no cover - abstract
        raise NotImplementedError

    def default_transforms(self) -> None:
        """Transforms for optimisation: ``None`` (every mean parameter is unconstrained)."""
        return None


@pytree_dataclass
class Zero(Mean):
    """The zero mean, ``m(x) = 0``; no parameters.

    Example:
        >>> from gpchol.means import Zero
        >>> print(Zero()([1.0, 2.0]))
        [0. 0.]
    """

    def _eval(self, x: jax.Array) -> jax.Array:
        return jnp.zeros(x.shape[:1], dtype=x.dtype)


@pytree_dataclass
class Constant(Mean):
    """A constant mean, ``m(x) = c``.

    Args:
        value: ``c``, a real scalar (learnable). Default 0.

    Example:
        >>> from gpchol.means import Constant
        >>> print(Constant(3.0)([1.0, 2.0]))
        [3. 3.]
    """

    value: Any = 0.0

    def _eval(self, x: jax.Array) -> jax.Array:
        return jnp.broadcast_to(
            scalar_param(self.value, x.dtype, "Constant mean value"), x.shape[:1]
        )


@pytree_dataclass
class Linear(Mean):
    """A linear (affine) mean, ``m(x) = sum_k w_k x_k + b``.

    Args:
        weights: ``w``, a scalar (the same weight for every column) or shape ``(d,)``.
            Default 0.
        bias: ``b``, a real scalar. Default 0.

    Shapes: ``(n, d) -> (n,)``.

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol.means import Linear
        >>> m = Linear(weights=jnp.array([1.0, -1.0]), bias=0.5)
        >>> print(m(jnp.array([[2.0, 1.0], [0.0, 3.0]])))
        [ 1.5 -2.5]
    """

    weights: Any = 0.0
    bias: Any = 0.0

    def _eval(self, x: jax.Array) -> jax.Array:
        w = as_param(self.weights, x.dtype)
        d = x.shape[1]
        check_scalar_or_vector(w.shape, d, "Linear mean: weights", "per input column")
        w = jnp.broadcast_to(w, (d,))
        # column by column, in a fixed order: the value of a row does not depend on the
        # other rows (a subset of rows gives exactly the same numbers)
        out = x[:, 0] * w[0]
        for k in range(1, d):
            out = out + x[:, k] * w[k]
        return out + scalar_param(self.bias, x.dtype, "Linear mean bias")


@pytree_dataclass
class Function(Mean):
    """Any callable as a mean, with optional learnable parameters.

    ``Function(fn)`` calls ``fn(X)``; ``Function(fn, params)`` calls ``fn(X, params)``,
    where ``params`` is a pytree of learnable leaves (``fn`` itself is static: numbers
    captured inside ``fn`` are constants, not parameters). ``X`` is passed as a floating
    array of shape ``(n, d)`` (one-dimensional inputs become ``(n, 1)``). The result must
    have shape ``(n,)`` or be a scalar (broadcast to ``(n,)``).

    Args:
        fn: a callable ``X -> (n,)`` or ``(X, params) -> (n,)``; it should be hashable
            (functions and lambdas are), as it is static data under ``jit``.
        params: a pytree of parameters passed to ``fn``, or ``None`` (then ``fn(X)``).

    Raises:
        ValueError: when ``fn`` returns an array whose shape is neither ``()`` nor ``(n,)``.

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol.means import Function
        >>> m = Function(lambda X, p: p["a"] * jnp.sin(X[:, 0]), params={"a": 2.0})
        >>> print(m(jnp.zeros((3, 1))))
        [0. 0. 0.]
    """

    fn: Callable[..., Any] = dataclasses.field(metadata={"static": True})
    params: Any = None

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"Function mean needs a callable; got {self.fn!r}")

    def _eval(self, x: jax.Array) -> jax.Array:
        out = self.fn(x) if self.params is None else self.fn(x, self.params)
        out = jnp.asarray(out)
        n = x.shape[0]
        if out.shape not in ((), (n,)):
            raise ValueError(
                f"the mean function {self.fn!r} returned shape {out.shape}; a mean must "
                f"return shape ({n},) (one value per input row) or a scalar"
            )
        if out.dtype != x.dtype:
            out = out.astype(x.dtype)
        return jnp.broadcast_to(out, (n,))


def as_mean(obj: Any) -> Mean:
    """Turns a shorthand into a mean function.

    Args:
        obj: ``None`` (zero mean), a real number or 0-d array, possibly traced (a
            :class:`Constant` mean, learnable), a :class:`Mean` (returned as is), or a
            callable ``X -> (n,)`` (wrapped in :class:`Function`).

    Returns:
        A :class:`Mean`.

    Raises:
        TypeError: for anything else (an array with ``ndim > 0``, a string, a bool). A
            fixed vector of means per point is not a mean *function*: it cannot be
            evaluated at new inputs; subtract it from ``y`` instead.

    Example:
        >>> from gpchol.means import Mean, as_mean
        >>> print(type(as_mean(0.0)).__name__, type(as_mean(None)).__name__)
        Constant Zero
    """
    if obj is None:
        return Zero()
    if isinstance(obj, Mean):
        return obj
    if is_scalar(obj):
        return Constant(obj)
    if isinstance(obj, (np.ndarray, jax.Array)) and obj.dtype != np.bool_:
        raise TypeError(
            f"a mean must be None, a scalar, a Mean or a callable X -> (n,); got an array "
            f"of shape {np.shape(obj)}. To use fixed per-point values, subtract them from y."
        )
    if callable(obj):
        return Function(obj)
    raise TypeError(
        f"a mean must be None, a real scalar, a gpchol Mean or a callable X -> (n,); "
        f"got {obj!r} of type {type(obj).__name__}"
    )
