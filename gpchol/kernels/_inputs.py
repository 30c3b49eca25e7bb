r"""Input transforms: a kernel evaluated on transformed inputs, ``k(t(x), t(x'))``.

Each wraps any kernel (built-in, user-written or composite) and maps every input row on
its own before the kernel sees it, so a block's entry ``[i, j]`` still depends only on
rows ``i`` and ``j`` and the result is a valid kernel whenever the wrapped one is:

* :class:`Subspace`: a subset of the input columns (``active_dims`` for any kernel);
* :class:`InputScale`: ``x / l`` per column (ARD scaling for any kernel);
* :class:`LinearMap`: ``A x`` with a learnable ``(p, d)`` matrix (a projection);
* :class:`Warp`: a function of each point, with optional learnable parameters;
* :class:`KumaraswamyWarp`: the learnable Kumaraswamy CDF on inputs in ``[0, 1]``.

>>> import jax.numpy as jnp
>>> from gpchol import kernels
>>> k = kernels.InputScale(kernels.Subspace(kernels.Matern32(), dims=(0,)), lengthscale=2.0)
>>> print(k(jnp.array([[0.0, 5.0], [2.0, -1.0]])).shape)
(2, 2)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from gpchol.kernels._library import (
    Kernel,
    as_param,
    check_kernel,
    normalize_active_dims,
    parameter,
    per_dim,
    select_columns,
    static,
)

__all__ = ["InputScale", "KumaraswamyWarp", "LinearMap", "Subspace", "Warp"]


class _InputTransform(Kernel):
    """Base of the input transforms: ``k(t(x1), t(x2))`` with ``t`` applied row by row."""

    kernel: Any

    def _map(self, x: jax.Array) -> jax.Array:  # pragma: no cover - abstract
        raise NotImplementedError

    def __post_init__(self) -> None:
        check_kernel(type(self).__name__, self.kernel)

    def _eval(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        return self.kernel._eval(self._map(x1), self._map(x2))

    def _diag(self, x: jax.Array) -> jax.Array:
        return self.kernel._diag(self._map(x))


class Subspace(_InputTransform):
    r"""A kernel on a subset of the input columns: ``k(x[dims], x'[dims])``.

    The ``active_dims`` of the built-in kernels, for any kernel (user-written,
    composite, :class:`SpectralMixture`, ...).

    Args:
        kernel: the kernel ``k`` on the selected columns.
        dims: static tuple of column indices (an int for one column).

    Shapes: ``(n1, d), (n2, d) -> (n1, n2)``; ``k`` sees ``(n, len(dims))``.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import ExpSquared, Subspace
        >>> k = Subspace(ExpSquared(), dims=1)
        >>> print(np.asarray(k(jnp.array([[0.0, 0.0], [9.0, 1.0]])), float).round(4))
        [[1.     0.6065]
         [0.6065 1.    ]]
    """

    dims: Any = static(default=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dims is None:
            raise TypeError("Subspace: dims must name the input columns to keep; got None")
        object.__setattr__(self, "dims", normalize_active_dims(self.dims))

    def _map(self, x: jax.Array) -> jax.Array:
        return select_columns(x, self.dims)


class InputScale(_InputTransform):
    r"""A kernel on inputs divided by learnable lengthscales: ``k(x / l, x' / l)``.

    ARD for any kernel: one positive scale per input column (or one for all). Give the
    wrapped stationary kernel a unit lengthscale, or the two multiply.

    Args:
        kernel: the kernel ``k``.
        lengthscale: ``l``, positive, a scalar or shape ``(d,)``. Default 1.

    Shapes: ``(n1, d), (n2, d) -> (n1, n2)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import Cosine, InputScale
        >>> k = InputScale(Cosine(period=1.0), lengthscale=4.0)  # a period of 4
        >>> print(np.asarray(k(jnp.array([0.0]), jnp.array([1.0, 2.0])), float).round(4) + 0.0)
        [[ 0. -1.]]
    """

    lengthscale: Any = 1.0

    def _map(self, x: jax.Array) -> jax.Array:
        return x / per_dim(self.lengthscale, x, "lengthscale")


class LinearMap(_InputTransform):
    r"""A kernel on linearly mapped inputs: ``k(A x, A x')`` with a learnable ``A``.

    With ``A`` of shape ``(p, d)``, ``p < d`` projects the inputs onto a learnt
    ``p``-dimensional subspace (a "projection" or "manifold" kernel); ``p = d`` is a full
    metric (``|A (x - x')|^2`` inside a stationary kernel). ``A`` may take any real value
    (identity transform).

    Args:
        kernel: the kernel ``k`` on ``p`` columns.
        matrix: ``A``, shape ``(p, d)``.

    Shapes: ``(n1, d), (n2, d) -> (n1, n2)``; ``k`` sees ``(n, p)``.

    Raises:
        ValueError: when ``matrix`` is not 2-D or its columns do not match the inputs.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import ExpSquared, LinearMap
        >>> k = LinearMap(ExpSquared(), matrix=jnp.array([[1.0, 1.0]]))  # x0 + x1 only
        >>> print(np.asarray(k(jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])), float).round(4))
        [[1.     1.     0.6065]
         [1.     1.     0.6065]
         [0.6065 0.6065 1.    ]]
    """

    matrix: Any = parameter(transform=None)

    def _map(self, x: jax.Array) -> jax.Array:
        A = as_param(self.matrix, x.dtype)
        if A.ndim != 2 or A.shape[1] != x.shape[1]:
            raise ValueError(
                f"LinearMap: matrix must have shape (p, {x.shape[1]}), mapping the "
                f"{x.shape[1]} input column(s) to p; got shape {A.shape}"
            )
        # one row at a time (a sum over the columns in a fixed order per entry)
        out = x[:, 0:1] * A[None, :, 0]
        for k in range(1, x.shape[1]):
            out = out + x[:, k : k + 1] * A[None, :, k]
        return out


class Warp(_InputTransform):
    r"""A kernel on warped inputs: ``k(w(x), w(x'))`` for a function ``w`` of one point.

    Args:
        kernel: the kernel ``k`` on the warped points.
        fn: ``w(x) -> (p,)`` or, with ``params``, ``w(x, params) -> (p,)``, for one point
            ``x`` of shape ``(d,)`` (a scalar result is one column); static, written with
            ``jax.numpy``, vectorised with :func:`jax.vmap`.
        params: ``None`` or a pytree of learnable parameters passed to ``fn`` (identity
            default transform; pass ``transforms`` to :func:`gpchol.fit` to constrain them).

    Shapes: ``(n1, d), (n2, d) -> (n1, n2)``; ``k`` sees ``(n, p)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import ExpSquared, Warp
        >>> k = Warp(ExpSquared(), fn=jnp.log)  # stationary in log(x)
        >>> print(np.asarray(k(jnp.array([1.0, jnp.e])), float).round(4))
        [[1.     0.6065]
         [0.6065 1.    ]]
    """

    fn: Callable[..., Any] = static(default=None)
    params: Any = parameter(default=None, transform=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not callable(self.fn):
            raise TypeError(
                f"Warp: fn must be callable as fn(x) (or fn(x, params)) for one point of "
                f"shape (d,); got {self.fn!r}"
            )

    def _map(self, x: jax.Array) -> jax.Array:
        if self.params is None:
            out = jax.vmap(lambda r: jnp.asarray(self.fn(r)))(x)
        else:
            out = jax.vmap(lambda r: jnp.asarray(self.fn(r, self.params)))(x)
        if out.ndim == 1:
            out = out[:, None]
        if out.ndim != 2:
            raise ValueError(
                f"Warp: fn must map one point of shape ({x.shape[1]},) to a vector (p,) or a "
                f"scalar; it returned shape {out.shape[1:]}"
            )
        return out.astype(x.dtype)


class KumaraswamyWarp(_InputTransform):
    r"""A kernel on inputs warped by the Kumaraswamy CDF, column by column.

    .. math:: w(x)_k = 1 - \left(1 - x_k^{a_k}\right)^{b_k}, \qquad x_k \in [0, 1]

    A learnable monotone bijection of ``[0, 1]`` (``a = b = 1``: the identity) that
    stretches or compresses parts of the input range, for non-stationary functions
    (input warping of Snoek et al. 2014, with the Kumaraswamy CDF in place of the Beta
    CDF, as BoTorch's ``Warp``). Scale the inputs to ``[0, 1]`` first; ``w(0) = 0`` and
    ``w(1) = 1`` exactly (inputs outside are clipped to the ends), and inside, inputs are
    kept in ``[tiny, 1 - eps]`` (the dtype's smallest normal number and machine epsilon)
    so the gradients stay finite near the ends.

    Args:
        kernel: the kernel ``k`` on the warped inputs.
        a: positive concentration, a scalar or shape ``(d,)``. Default 1.
        b: positive concentration, a scalar or shape ``(d,)``. Default 1.

    Shapes: ``(n1, d), (n2, d) -> (n1, n2)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import ExpSquared, KumaraswamyWarp
        >>> k = KumaraswamyWarp(ExpSquared(), a=2.0, b=1.0)  # w(x) = x^2
        >>> print(np.asarray(k(jnp.array([0.5]), jnp.array([1.0])), float).round(4))
        [[0.7548]]
    """

    a: Any = 1.0
    b: Any = 1.0

    def _map(self, x: jax.Array) -> jax.Array:
        a = per_dim(self.a, x, "a")
        b = per_dim(self.b, x, "b")
        info = jnp.finfo(x.dtype)
        u = jnp.clip(x, info.tiny, 1.0 - info.eps)
        # 1 - (1 - u^a)^b = -expm1(b log(1 - e^t)) with t = a log u < 0; log(1 - e^t) as
        # log1p(-e^t) where e^t is small and log(-expm1(t)) near 1, so that 1 - u^a is
        # never rounded to 0 at u = 1 - eps (whose gradient in a and b was NaN) and w is
        # ~0 at u ~ 0 for any a (clipping at eps gave w(0) = 0.05..0.37 for a = 0.1)
        t = a * jnp.log(u)
        near_one = t > -0.6931471805599453  # log(1/2)
        log_rest = jnp.where(
            near_one,
            jnp.log(-jnp.expm1(jnp.where(near_one, t, -1.0))),
            jnp.log1p(-jnp.exp(jnp.where(near_one, -1.0, t))),
        )
        w = -jnp.expm1(b * log_rest)
        # the ends are fixed points for every a and b: exact, with zero derivatives there
        return jnp.where(x <= 0.0, 0.0, jnp.where(x >= 1.0, 1.0, w)).astype(w.dtype)
