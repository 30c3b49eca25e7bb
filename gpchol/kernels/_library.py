r"""Covariance kernels: small pytrees that build covariance blocks.

A kernel is a frozen dataclass registered as a JAX pytree: its numeric parameters are
the leaves (so ``jax.grad`` with respect to a kernel gives a kernel of gradients, and
optax can update one), while structural settings (``active_dims``, a polynomial's
``degree``) are static auxiliary data. Calling a kernel on inputs ``X1`` of shape
``(n1, d)`` and ``X2`` of shape ``(n2, d)`` returns the ``(n1, n2)`` covariance block;
one-dimensional inputs of shape ``(n,)`` are read as ``(n, 1)``. ``k.diag(X)`` returns the
``(n,)`` diagonal of ``k(X, X)`` without building the matrix.

Every entry ``k(X1, X2)[i, j]`` depends only on the rows ``X1[i]`` and ``X2[j]`` and is
computed elementwise, summing over the input columns in a fixed order (no matrix products,
no reductions whose order depends on the shape), so evaluating a kernel on row and column
subsets gives the corresponding tile of the full matrix, ``k(X[I], X[J]) ==
k(X)[I][:, J]``, and ``k(X, X)`` is exactly symmetric. Op by op (eager) the tiles are equal
bit for bit; so are the tiles of each single kernel under ``jit`` on the CPU backend (the
tests check both). Under ``jit``, a sum of scaled kernels may differ in the last bit
between a tile and the full matrix, because XLA may fuse a multiply and an add into one
FMA differently for different shapes.

Dtypes: the computation runs in the floating dtype of the inputs (integer inputs become
the default float dtype); parameters are cast to that dtype, so float32 inputs give a
float32 matrix even when the parameters are float64.

Kernels combine with ``+`` and ``*``; a number times a kernel scales it by a learnable
amplitude, a number added to a kernel adds a :class:`Constant` kernel:

>>> import jax.numpy as jnp
>>> import numpy as np
>>> from gpchol import kernels
>>> k = 2.0 * kernels.ExpSquared(lengthscale=0.5) + kernels.White(variance=0.1)
>>> X = jnp.linspace(0.0, 1.0, 4)
>>> K = k(X, X)
>>> print(K.shape, K.dtype)
(4, 4) float32
>>> print(np.asarray(K[0], float).round(4))
[2.1    1.6015 0.8222 0.2707]

The stationary kernels are functions of the scaled distance
``r^2 = sum_k (x_k - x'_k)^2 / l_k^2`` where the lengthscale ``l`` is a scalar or one value
per input dimension (ARD, shape ``(d,)``); stationary kernels have unit variance and take
an amplitude by scaling (``a * k``). Their gradients are finite at zero distance (the
Matérn kernels use ``r = sqrt(r^2)`` through a ``where`` that avoids ``sqrt``'s infinite
slope at 0), with respect to the parameters and to the inputs.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
from functools import partial
from typing import Any, ClassVar, TypeVar, dataclass_transform

import jax
import jax.numpy as jnp
import numpy as np

from gpchol._base.pytrees import (
    as_param,
    is_scalar,
    pytree_dataclass,
    scalar_param,
    static_field,
)
from gpchol._base.transforms import Positive, Transform
from gpchol._base.validate import as_inputs, check_int, check_scalar_or_vector

_T = TypeVar("_T")
_POSITIVE = Positive()

# --------------------------------------------------------------------------- helpers


def normalize_active_dims(active_dims: Any) -> tuple[int, ...] | None:
    if active_dims is None:
        return None
    if isinstance(active_dims, numbers.Integral) and not isinstance(active_dims, bool):
        active_dims = (active_dims,)
    message = f"active_dims must be None or a sequence of column indices; got {active_dims!r}"
    if isinstance(active_dims, (str, bytes)):
        raise TypeError(message)
    try:
        items = list(active_dims)
    except TypeError:
        raise TypeError(message) from None
    if any(isinstance(i, bool) or not isinstance(i, numbers.Integral) for i in items):
        raise TypeError(message)
    if not items:
        raise ValueError("active_dims must name at least one column (or be None for all)")
    return tuple(int(i) for i in items)


def _as_inputs(X1: Any, X2: Any) -> tuple[jax.Array, jax.Array]:
    x1 = as_inputs(X1, "X1")
    x2 = x1 if X2 is None else as_inputs(X2, "X2")
    if x1.shape[1] != x2.shape[1]:
        raise ValueError(
            f"X1 and X2 must have the same number of columns; got shapes {x1.shape} and {x2.shape}"
        )
    if x1.dtype != x2.dtype:
        dtype = jnp.promote_types(x1.dtype, x2.dtype)
        x1, x2 = x1.astype(dtype), x2.astype(dtype)
    return x1, x2


def select_columns(x: jax.Array, active_dims: tuple[int, ...] | None) -> jax.Array:
    if active_dims is None:
        return x
    d = x.shape[1]
    bad = [i for i in active_dims if not -d <= i < d]
    if bad:
        raise ValueError(
            f"active_dims {active_dims} name column(s) {bad} that the input, with {d} "
            "column(s), does not have"
        )
    return x[:, np.asarray(active_dims)]


def per_dim(value: Any, x: jax.Array, name: str) -> jax.Array:
    """A parameter that is a scalar or one value per (active) input dimension."""
    p = as_param(value, x.dtype)
    d = x.shape[1]
    check_scalar_or_vector(p.shape, d, name, "value per input dimension (after active_dims)")
    return p


# Up to this many input columns, sums over the columns are unrolled in a fixed order
# (column 0 first). XLA's fused reductions over a short axis may add in an order that
# depends on the other dimensions, which would make a tile differ from the block of the
# full matrix in the last bit; the unrolled sum is elementwise, hence exact and exactly
# symmetric. Past this many columns the fused reduction is used (tiles then agree to
# rounding) to keep the traced program small.
_UNROLL_MAX_DIM = 64


def _column_params(per_dim: tuple[jax.Array, ...], k: int, d: int) -> list[jax.Array]:
    """Column ``k``'s value of each parameter of shape ``()``, ``(1,)`` or ``(d,)``."""
    return [p[k] if p.ndim == 1 and p.shape[0] == d else p.reshape(()) for p in per_dim]


def _dimsum_impl(fn: Any, a: jax.Array, b: jax.Array, *per_dim: jax.Array) -> jax.Array:
    """``sum_k fn(a[:, None, k], b[None, :, k], *(p[k] for p in per_dim))``, ``(n1, n2)``.

    Args:
        fn: elementwise function of one column of ``a`` (shape ``(n1, 1)``), one of ``b``
            (shape ``(1, n2)``) and that column's parameters.
        a: shape ``(n1, d)``.
        b: shape ``(n2, d)``.
        *per_dim: parameters of shape ``()``, ``(1,)`` or ``(d,)``.
    """
    d = a.shape[1]
    if d > _UNROLL_MAX_DIM:
        return jnp.sum(fn(a[:, None, :], b[None, :, :], *per_dim), axis=-1)

    def column(k: int) -> jax.Array:
        return fn(a[:, None, k], b[None, :, k], *_column_params(per_dim, k, d))

    out = column(0)
    for k in range(1, d):
        out = out + column(k)
    return out


# Rematerialised under differentiation: the reverse pass recomputes the per-column terms
# inside its (fused) reductions instead of keeping d arrays of shape (n1, n2) alive from
# the forward pass (faster, fewer (n, n) buffers: benchmarks/results/design-measurements.md).
# Forward values are unchanged.
dimsum = jax.checkpoint(_dimsum_impl, static_argnums=(0,))


def rowsum(fn: Any, a: jax.Array, *per_dim: jax.Array) -> jax.Array:
    """``sum_k fn(a[:, k], a[:, k], *(p[k] ...))``, shape ``(n,)``: the diagonal of
    :func:`dimsum` for ``b = a``, added in the same order (so it matches exactly)."""
    d = a.shape[1]
    if d > _UNROLL_MAX_DIM:
        return jnp.sum(fn(a, a, *per_dim), axis=-1)
    out: jax.Array | None = None
    for k in range(d):
        term = fn(a[:, k], a[:, k], *_column_params(per_dim, k, d))
        out = term if out is None else out + term
    assert out is not None  # d >= 1
    return out


def _scaled_sq_diff(u: jax.Array, v: jax.Array, ls: jax.Array) -> jax.Array:
    # the difference first, then scaled: exact zeros for equal inputs, and accurate for
    # nearby large inputs (years); one op order for every tile shape
    return jnp.square((u - v) / ls)


def _prod(u: jax.Array, v: jax.Array) -> jax.Array:
    return u * v


def _periodic_term(u: jax.Array, v: jax.Array, freq: jax.Array, ls: jax.Array) -> jax.Array:
    # the difference first: exact for nearby large inputs (e.g. years), then scaled
    return jnp.square(jnp.sin(freq * (u - v)) / ls)


def _scaled_sqdist(
    kernel: Any, x1: jax.Array, x2: jax.Array, *, expanded_tangent: bool = True
) -> jax.Array:
    """``r^2 = sum_k (x1_k - x2_k)^2 / l_k^2`` over the kernel's active columns,
    ``(n1, n2)``; computed from differences (exact zeros on identical rows).

    ``expanded_tangent``: differentiate by :func:`_sqdist`'s matrix-product rule (for
    kernels whose derivative in ``r^2`` stays bounded at ``r = 0``); ``False`` keeps the
    columnwise difference form in the tangent too.
    """
    x1 = select_columns(x1, kernel.active_dims)
    x2 = select_columns(x2, kernel.active_dims)
    ls = per_dim(kernel.lengthscale, x1, "lengthscale")
    # the expanded rule's rounding (eps u^2, see _sqdist_jvp) is negligible in float64
    # only: in float32 it is of the order of a whole gradient entry
    if expanded_tangent and jnp.finfo(jnp.result_type(x1, x2, ls)).bits >= 64:
        return _sqdist(x1, x2, ls)
    return dimsum(_scaled_sq_diff, x1, x2, ls)


@jax.custom_jvp
def _sqdist(x1: jax.Array, x2: jax.Array, ls: jax.Array) -> jax.Array:
    """``sum_k ((x1_ik - x2_jk) / l_k)^2``, ``(n1, n2)``: the difference form forward."""
    return dimsum(_scaled_sq_diff, x1, x2, ls)


@partial(_sqdist.defjvp, symbolic_zeros=True)
def _sqdist_jvp(
    primals: tuple[jax.Array, jax.Array, jax.Array],
    tangents: tuple[Any, Any, Any],
) -> tuple[jax.Array, jax.Array]:
    # With u = (x - c) / l (any shift c: r^2 does not depend on it) and D_ijk = u1_ik - u2_jk,
    #   d r^2_ij = sum_k 2 D_ijk (dx1_ik - dx2_jk) / l_k - 2 D_ijk^2 dl_k / l_k.
    # Expanding D_ijk^2 = u1_ik^2 + u2_jk^2 - 2 u1_ik u2_jk (and D_ijk likewise) writes every
    # term as a row vector, a column vector or an (n1, d) x (d, n2) matrix product, so the
    # reverse pass (JAX transposes this linear map) gives all d lengthscale cotangents from
    # one product G u2 (or G^T u1) instead of d passes over the (n1, n2) cotangent G:
    #   lbar_k = -(2 / l_k) [ sum_i u1_ik^2 (G 1)_i + sum_j u2_jk^2 (G^T 1)_j
    #                         - 2 sum_i u1_ik (G u2)_ik ].
    # Centring at the mean of x1's rows keeps u of the size of the inputs' spread, so
    # the expansion cancels no more than the differences do for inputs far from 0 (years).
    # The rounding of the expanded terms is of order eps u^2, even where D = 0 (the
    # diagonal, whose cotangent in a likelihood is about 1 / noise): harmless in float64
    # times a derivative of the kernel in r^2 that stays bounded at r = 0 (ExpSquared, the
    # Materns above 1/2, RationalQuadratic), which is why Matern12 does not use this rule
    # and float32 never does (_scaled_sqdist). One lengthscale needs no expansion at all.
    x1, x2, ls = primals
    dx1, dx2, dls = tangents
    out = _sqdist(x1, x2, ls)
    d = x1.shape[1]
    lsv = jnp.broadcast_to(ls.reshape(-1) if ls.ndim else ls, (d,))
    c = jax.lax.stop_gradient(jnp.mean(x1, axis=0))
    u1 = (x1 - c) / lsv
    u2 = (x2 - c) / lsv
    terms = []
    if not _is_zero(dls) and ls.size == 1:
        # one lengthscale: r^2 = |x1 - x2|^2 / l^2, so d r^2 = -2 r^2 dl / l exactly
        terms.append(-2.0 * out * (dls.reshape(()) / ls.reshape(())))
    elif not _is_zero(dls):
        s = jnp.broadcast_to(dls.reshape(-1) if dls.ndim else dls, (d,)) / lsv
        rows = (u1 * u1) @ s
        cols = (u2 * u2) @ s
        cross = (u1 * s) @ u2.T
        terms.append(-2.0 * (rows[:, None] + cols[None, :] - 2.0 * cross))
    if not _is_zero(dx1):
        v1 = dx1 / lsv
        terms.append(2.0 * (jnp.sum(u1 * v1, axis=1)[:, None] - v1 @ u2.T))
    if not _is_zero(dx2):
        v2 = dx2 / lsv
        terms.append(2.0 * (jnp.sum(u2 * v2, axis=1)[None, :] - u1 @ v2.T))
    if not terms:
        return out, jnp.zeros_like(out)
    tangent = terms[0]
    for t in terms[1:]:
        tangent = tangent + t
    return out, tangent.astype(out.dtype)


def _is_zero(t: Any) -> bool:
    return isinstance(t, jax.custom_derivatives.SymbolicZero)


def _safe_sqrt(r2: jax.Array) -> jax.Array:
    """``sqrt(r2)`` for ``r2 >= 0`` with a zero (not infinite) derivative at ``r2 == 0``.

    The inner ``where`` keeps ``sqrt`` away from 0 on the branch that is discarded, so
    its derivative there (``inf``) never multiplies a zero cotangent into a NaN.
    """
    positive = r2 > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, r2, 1.0)), 0.0)


def _with_origin(r2: jax.Array, c: float, closed: Any) -> jax.Array:
    """``closed(r2)`` for ``r2 > 0`` and ``1 - c r2`` at ``r2 == 0``: a Matérn kernel whose
    expansion at the origin is ``1 - c r^2 + O(r^3)``. Through ``sqrt`` (whose derivative
    :func:`_safe_sqrt` sets to 0 there) the second derivatives in the inputs at equal
    points would be lost (0 for Matérn 3/2, of the wrong sign for 5/2); the expansion
    gives the value and first and second derivatives exactly at 0.
    """
    zero = r2 <= 0
    return jnp.where(zero, 1.0 - c * r2, closed(jnp.where(zero, 1.0, r2)))


def check_kernel(owner: str, kernel: Any) -> None:
    """Refuses a function where a kernel belongs (a ``TypeError`` naming ``owner``).

    Other objects pass: they may be the leaves of a pytree of transforms, or of an
    unflattened tree.
    """
    if callable(kernel) and not isinstance(kernel, Kernel):
        raise TypeError(
            f"{owner}: kernel must be a gpchol kernel (gpchol.kernels.*; use "
            f"gpchol.kernels.as_kernel for a function); got {type(kernel).__name__}"
        )


def _reject_array(value: Any) -> None:
    if isinstance(value, (np.ndarray, jax.Array)) and np.ndim(value) > 0:
        raise TypeError(
            "a kernel can be scaled only by a scalar amplitude; got an array of shape "
            f"{np.shape(value)}"
        )


# ------------------------------------------------------------------------ user fields


def parameter(
    default: Any = dataclasses.MISSING, *, transform: Transform | None = _POSITIVE
) -> Any:
    """Declares a hyperparameter field of a kernel subclass with its transform.

    A field of a :class:`Kernel` subclass declared without this helper is a hyperparameter
    with the :class:`gpchol.Positive` transform; use ``parameter`` for another one (``None``
    or :class:`gpchol.Identity` for a parameter that may take any real value).

    Args:
        default: the default value (a number, or an array: a NumPy array or list is copied
            for each instance). Omitted: the argument is required.
        transform: the parameter's transform for optimisation
            (:meth:`Kernel.default_transforms`); default :class:`gpchol.Positive`.

    Returns:
        A :func:`dataclasses.field` specifier.

    Example:
        >>> import jax.numpy as jnp
        >>> from gpchol import kernels
        >>> class Shifted(kernels.Kernel):
        ...     shift: float = kernels.parameter(default=0.0, transform=None)
        ...     def evaluate(self, x1, x2):
        ...         return jnp.sum((x1 - self.shift) * (x2 - self.shift))
        >>> print(Shifted(1.0).default_transforms().shift)
        None
    """
    if transform is not None and not isinstance(transform, Transform):
        raise TypeError(
            f"parameter: transform must be a gpchol Transform (Positive(), Bounded(...), "
            f"Identity()) or None; got {transform!r}"
        )
    metadata = {"transform": transform}
    if isinstance(default, (list, tuple, np.ndarray)):
        value = np.array(default)
        return dataclasses.field(default_factory=value.copy, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def static(default: Any = dataclasses.MISSING) -> Any:
    """Declares a static (structural, not learnable) field of a kernel subclass.

    A static field is pytree auxiliary data, not a leaf: an integer degree, a tuple of
    columns, a callable. Changing it retraces a jitted function; it must be hashable.

    Args:
        default: the default value; omitted: the argument is required.

    Returns:
        A :func:`dataclasses.field` specifier.

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> from gpchol import kernels
        >>> class Power(kernels.Kernel):
        ...     lengthscale: float = 1.0
        ...     degree: int = kernels.static(default=2)
        ...     def evaluate(self, x1, x2):
        ...         return jnp.exp(-jnp.sum((x1 - x2) ** 2) / self.lengthscale) ** self.degree
        >>> print(jax.tree_util.tree_leaves(Power(0.5, 3)))
        [0.5]
    """
    return dataclasses.field(default=default, metadata={"static": True})


def _overrides(cls: type, name: str) -> bool:
    return getattr(cls, name) is not getattr(Kernel, name)


def _describe_kernel(kernel: Any) -> str:
    text = repr(kernel)
    return text if len(text) <= 300 else text[:297] + "..."


def _checked(
    kernel: Kernel, out: Any, shape: tuple[int, ...], what: str, *rows: jax.Array
) -> jax.Array:
    """Validates a user kernel's output block: its shape always (trace time), its values
    when concrete (eager evaluation)."""
    out = jnp.asarray(out)
    name = type(kernel).__name__
    if out.shape != shape:
        if what == "evaluate":
            extra = out.shape[len(shape) :]
            raise ValueError(
                f"{name}.evaluate(x1, x2) must return a scalar for one pair of points "
                f"(x1 and x2 of shape (d,), here d = {rows[0].shape[-1]}); it returned "
                f"shape {extra}. Reduce over the input dimension (e.g. jnp.sum(...)) or "
                "index it (x1[0] for one-dimensional inputs)."
            )
        raise ValueError(
            f"{name}.matrix(X1, X2) must return the block of shape {shape} (n1, n2) for "
            f"X1 of shape {tuple(rows[0].shape)} and X2 of shape {tuple(rows[1].shape)}; "
            f"it returned shape {tuple(out.shape)}."
        )
    dtype = rows[0].dtype
    if out.dtype != dtype:
        out = out.astype(dtype)
    if not isinstance(out, jax.core.Tracer) and not bool(jnp.all(jnp.isfinite(out))):
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(np.asarray(out)))[0])
        value = np.asarray(out)[bad]
        if len(bad) == 2:
            where = f"k(X1[{bad[0]}], X2[{bad[1]}])"
            pair = f"x1 = {np.asarray(rows[0][bad[0]])}, x2 = {np.asarray(rows[1][bad[1]])}"
        else:
            where = f"the diagonal entry k(X[{bad[0]}], X[{bad[0]}])"
            pair = f"x = {np.asarray(rows[0][bad[0]])}"
        raise ValueError(
            f"kernel {name} returned a non-finite value ({value}) at {where}, {pair}; kernel "
            f"{_describe_kernel(kernel)}. Check the inputs for NaN/inf and the kernel's "
            f"hyperparameters, and make {name}.{what} finite there (e.g. guard a division "
            "by a zero distance or sqrt(0) with jnp.where)."
        )
    return out


# ------------------------------------------------------------------------------ base


@dataclass_transform(
    eq_default=False, frozen_default=True, field_specifiers=(dataclasses.field, parameter, static)
)
class Kernel:
    r"""Base class of the kernels: write your own by implementing :meth:`evaluate`.

    A subclass declares its hyperparameters as annotated class attributes with defaults
    and implements ``evaluate(self, x1, x2)`` for ONE pair of points (``x1`` and ``x2`` of
    shape ``(d,)``) returning a scalar; gpchol vectorises it with :func:`jax.vmap`. The
    subclass is made, for you, a frozen dataclass registered as a JAX pytree (do not
    decorate it): its fields are the hyperparameters (the leaves; differentiate, ``jit``
    and optimise with respect to them), except those declared with :func:`static`.
    Each hyperparameter has a default transform for optimisation,
    :class:`gpchol.Positive`, unless declared with :func:`parameter`; a field holding a
    kernel uses that kernel's transforms. Optionally override :meth:`matrix` for a faster
    whole-block computation.

    User kernels combine with the built-in ones (``+``, ``*``, ``**``, input transforms),
    work in :class:`gpchol.GaussianProcess`, :func:`gpchol.fit` and
    :mod:`gpchol.numpyro`. Evaluated eagerly (outside ``jit``), a block with a
    non-finite entry raises :class:`ValueError` naming the entry; an
    ``evaluate`` that returns an array instead of a scalar raises :class:`ValueError`
    (always). A plain function ``f(x1, x2) -> scalar`` becomes a kernel with
    :func:`as_kernel`.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol import kernels
        >>> class Laplace(kernels.Kernel):
        ...     scale: float = 1.0
        ...     def evaluate(self, x1, x2):
        ...         return jnp.exp(-jnp.sum(jnp.abs(x1 - x2)) / self.scale)
        >>> k = 2.0 * Laplace(scale=0.5) + kernels.White(0.1)
        >>> print(np.asarray(k(jnp.array([0.0, 1.0])), float).round(4))
        [[2.1    0.2707]
         [0.2707 2.1   ]]
        >>> print(Laplace().default_transforms().scale)
        Positive(lower=0.0)
    """

    _positive: ClassVar[tuple[str, ...]] = ()
    # set on each concrete kernel by the dataclass decorator (lets mypy see a dataclass)
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]
    # Make NumPy scalars and arrays defer to our __rmul__/__radd__.
    __array_ufunc__ = None

    def __init_subclass__(cls, *, auto_dataclass: bool = True, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not auto_dataclass:
            return  # made a pytree dataclass by hand (this module's kernels: @pytree_dataclass)
        own = inspect.get_annotations(cls)
        try:
            pytree_dataclass(cls)
        except ValueError as err:
            raise TypeError(
                f"kernel class {cls.__name__}: {err}. Declare an array default with "
                "gpchol.kernels.parameter(default=...)."
            ) from None
        if "_positive" not in cls.__dict__:
            new = [
                f.name
                for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                if f.name in own
                and not f.metadata.get("static", False)
                and "transform" not in f.metadata
            ]
            cls._positive = tuple(dict.fromkeys((*cls._positive, *new)))

    def __call__(self, X1: Any, X2: Any = None) -> jax.Array:
        """Evaluates the covariance block.

        Args:
            X1: inputs, shape ``(n1, d)`` or ``(n1,)``.
            X2: inputs, shape ``(n2, d)`` or ``(n2,)``; ``None`` means ``X1``.

        Returns:
            The covariance block ``K[i, j] = k(X1[i], X2[j])``, shape ``(n1, n2)``, in the
            floating dtype of the inputs.

        Raises:
            ValueError: on inputs that are not 1-D or 2-D, on ``X1`` and ``X2`` with
                different numbers of columns, on a per-dimension parameter whose length
                is not the number of (active) columns, and on out-of-range
                ``active_dims``.
        """
        x1, x2 = _as_inputs(X1, X2)
        return self._eval(x1, x2)

    def diag(self, X: Any) -> jax.Array:
        """The diagonal of ``k(X, X)`` without forming the matrix.

        Args:
            X: inputs, shape ``(n, d)`` or ``(n,)``.

        Returns:
            ``k(X[i], X[i])`` for each row, shape ``(n,)``.
        """
        return self._diag(as_inputs(X, "X"))

    def evaluate(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        """The covariance of one pair of points: the method a kernel subclass implements.

        Write it for single points with ``jax.numpy`` (it is traced, vectorised with
        :func:`jax.vmap` and differentiated); call the kernel itself (``k(X1, X2)``) to
        evaluate blocks. Built-in kernels implement it too.

        Args:
            x1: one point, shape ``(d,)``.
            x2: one point, shape ``(d,)``.

        Returns:
            ``k(x1, x2)``, a scalar (shape ``()``).

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import kernels
            >>> print(round(float(kernels.ExpSquared().evaluate(jnp.zeros(1), jnp.ones(1))), 4))
            0.6065
        """
        cls = type(self)
        if not (_overrides(cls, "matrix") or _overrides(cls, "_eval")):
            raise NotImplementedError(
                f"kernel class {cls.__name__} must implement evaluate(self, x1, x2): the "
                "covariance of one pair of points of shape (d,), a scalar"
            )
        a = jnp.atleast_1d(jnp.asarray(x1))
        b = jnp.atleast_1d(jnp.asarray(x2))
        return self._eval(a[None, :], b[None, :])[0, 0]

    def matrix(self, X1: jax.Array, X2: jax.Array) -> jax.Array:
        """The covariance block of validated inputs (an optional fast path to override).

        The default vectorises :meth:`evaluate` over all pairs. A subclass may override it
        to compute the whole block at once (with broadcasting, matrix products); each
        entry ``[i, j]`` must depend only on ``X1[i]`` and ``X2[j]``.

        Args:
            X1: inputs, shape ``(n1, d)``, floating.
            X2: inputs, shape ``(n2, d)``, same dtype as ``X1``.

        Returns:
            The block, shape ``(n1, n2)``.

        Example:
            >>> import jax.numpy as jnp
            >>> from gpchol import kernels
            >>> class Dot(kernels.Kernel):
            ...     def matrix(self, X1, X2):
            ...         return X1 @ X2.T
            >>> print(Dot()(jnp.array([1.0, 2.0])))
            [[1. 2.]
             [2. 4.]]
        """
        cls = type(self)
        if _overrides(cls, "evaluate"):
            rows = jax.vmap(lambda a: jax.vmap(lambda b: jnp.asarray(self.evaluate(a, b)))(X2))
            return rows(X1)
        if _overrides(cls, "_eval"):
            return self._eval(X1, X2)
        raise NotImplementedError(
            f"kernel class {cls.__name__} must implement evaluate(self, x1, x2): the "
            "covariance of one pair of points of shape (d,), a scalar"
        )

    def _eval(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        # user kernels: the block from matrix() (default: vmapped evaluate()), checked
        out = self.matrix(x1, x2)
        what = "matrix" if _overrides(type(self), "matrix") else "evaluate"
        return _checked(self, out, (x1.shape[0], x2.shape[0]), what, x1, x2)

    def _diag(self, x: jax.Array) -> jax.Array:
        # user kernels: evaluate() on each row paired with itself, checked
        out = jax.vmap(lambda a: jnp.asarray(self.evaluate(a, a)))(x)
        what = "evaluate" if _overrides(type(self), "evaluate") else "matrix"
        return _checked(self, out, (x.shape[0],), what, x)

    def default_transforms(self) -> Kernel:
        """The natural transforms of this kernel's parameters, for optimisation.

        Returns:
            A kernel of the same structure whose leaves are :class:`gpchol.Positive` for
            the parameters that must be positive (lengthscales, periods, variances,
            amplitudes), ``None`` (identity) for the others (a linear kernel's offset), and
            the transform declared with :func:`parameter` where there is one; fields that
            hold kernels get those kernels' transforms. Use it as the ``transforms`` prefix
            of :func:`to_unconstrained`.

        Example:
            >>> from gpchol import kernels
            >>> t = (2.0 * kernels.ExpSquared()).default_transforms()
            >>> print(t.amplitude, t.kernel.lengthscale)
            Positive(lower=0.0) Positive(lower=0.0)
        """
        updates: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            if field.metadata.get("static", False):
                continue
            value = getattr(self, field.name)
            if "transform" in field.metadata:
                updates[field.name] = field.metadata["transform"]
                continue
            rule = Positive() if field.name in self._positive else None
            updates[field.name] = jax.tree_util.tree_map(
                lambda v, rule=rule: v.default_transforms() if isinstance(v, Kernel) else rule,
                value,
                is_leaf=lambda v: isinstance(v, Kernel),
            )
        return dataclasses.replace(self, **updates)

    # ------------------------------------------------------------------- algebra
    def __add__(self, other: Any) -> Kernel:
        if isinstance(other, Kernel):
            return Sum(self, other)
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self
        if is_scalar(other):
            return Sum(self, Constant(other))
        return NotImplemented

    def __radd__(self, other: Any) -> Kernel:
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self  # so that sum([k1, k2, ...]) works
        if is_scalar(other):
            return Sum(Constant(other), self)
        return NotImplemented

    def __mul__(self, other: Any) -> Kernel:
        if isinstance(other, Kernel):
            return Product(self, other)
        if is_scalar(other):
            return Scale(other, self)
        _reject_array(other)
        return NotImplemented

    def __rmul__(self, other: Any) -> Kernel:
        if is_scalar(other):
            return Scale(other, self)
        _reject_array(other)
        return NotImplemented

    def __pow__(self, exponent: Any) -> Kernel:
        return Power(self, exponent)


class ActiveDimsKernel(Kernel, auto_dataclass=False):
    """Base of the kernels that read only the input columns named by ``active_dims``.

    It normalises ``active_dims`` on construction (an int becomes a 1-tuple, a sequence
    a tuple; other values raise). Each subclass declares the field itself, as its last
    one: a dataclass puts inherited fields first, and ``active_dims`` must come after the
    parameters so that positional construction (``ExpSquared(2.0)``) is unchanged.
    """

    active_dims: tuple[int, ...] | None  # a static dataclass field of each subclass

    def __post_init__(self) -> None:
        object.__setattr__(self, "active_dims", normalize_active_dims(self.active_dims))


# ---------------------------------------------------------------------- stationary


class UnitVariance(ActiveDimsKernel, auto_dataclass=False):
    """Base of the kernels with ``k(x, x) = 1``: the diagonal is ones."""

    def _diag(self, x: jax.Array) -> jax.Array:
        select_columns(x, self.active_dims)  # validates active_dims against x
        return jnp.ones(x.shape[:1], dtype=x.dtype)


class _Stationary(UnitVariance, auto_dataclass=False):
    """Base of the stationary kernels: a positive ``lengthscale``, unit variance."""

    lengthscale: Any  # a dataclass field of each subclass: scalar or shape (d,)

    _positive: ClassVar[tuple[str, ...]] = ("lengthscale",)


@dataclasses.dataclass(frozen=True, eq=False)
class _LengthscaleKernel(_Stationary, auto_dataclass=False):
    """The fields of a stationary kernel whose only parameter is its lengthscale."""

    lengthscale: Any = 1.0
    active_dims: tuple[int, ...] | None = static_field()


@pytree_dataclass
class ExpSquared(_LengthscaleKernel, auto_dataclass=False):
    r"""Squared-exponential (RBF, Gaussian) kernel.

    .. math:: k(x, x') = \exp\left(-\frac{r^2}{2}\right), \qquad
              r^2 = \sum_{k=1}^{d} \frac{(x_k - x'_k)^2}{l_k^2}

    Args:
        lengthscale: ``l``, a positive scalar or an array of shape ``(d,)`` (ARD: one
            lengthscale per active input dimension). Default 1.
        active_dims: static tuple of the input columns the kernel reads (``None``: all).

    Shapes: ``k(X1, X2)`` with ``X1 (n1, d)``, ``X2 (n2, d)`` gives ``(n1, n2)``;
    ``k.diag(X)`` is ``ones((n,))``.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import ExpSquared
        >>> k = ExpSquared(lengthscale=jnp.array([1.0, 2.0]))
        >>> X = jnp.array([[0.0, 0.0], [1.0, 2.0]])
        >>> print(np.asarray(k(X, X), float).round(4))
        [[1.     0.3679]
         [0.3679 1.    ]]
    """

    def _eval(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        return jnp.exp(-0.5 * _scaled_sqdist(self, x1, x2))


@pytree_dataclass
class Matern12(_LengthscaleKernel, auto_dataclass=False):
    r"""Matérn kernel with smoothness 1/2 (exponential, Ornstein-Uhlenbeck kernel).

    .. math:: k(x, x') = \exp(-r), \qquad r = \sqrt{\textstyle\sum_k (x_k - x'_k)^2 / l_k^2}

    The sample paths are continuous but not differentiable. At ``r = 0`` the kernel has a
    cusp; the gradient there is taken as 0 (finite, never NaN).

    Args and shapes: as :class:`ExpSquared`.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import Matern12
        >>> K = Matern12(lengthscale=2.0)(jnp.array([0.0]), jnp.array([0.0, 2.0]))
        >>> print(np.asarray(K, float).round(4))
        [[1.     0.3679]]
    """

    def _eval(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        r = _safe_sqrt(_scaled_sqdist(self, x1, x2, expanded_tangent=False))
        return jnp.exp(-r)


@pytree_dataclass
class Matern32(_LengthscaleKernel, auto_dataclass=False):
    r"""Matérn kernel with smoothness 3/2.

    .. math:: k(x, x') = (1 + \sqrt{3}\,r)\,\exp(-\sqrt{3}\,r), \qquad
              r = \sqrt{\textstyle\sum_k (x_k - x'_k)^2 / l_k^2}

    Once mean-square differentiable sample paths. At ``r = 0`` the first derivatives are
    the exact 0 and the second derivatives in the inputs exact (``3 / l^2``).

    Args and shapes: as :class:`ExpSquared`.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import Matern32
        >>> K = Matern32()(jnp.array([0.0]), jnp.array([0.0, 1.0]))
        >>> print(np.asarray(K, float).round(4))
        [[1.     0.4834]]
    """

    def _eval(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        def closed(r2: jax.Array) -> jax.Array:
            s = math.sqrt(3.0) * jnp.sqrt(r2)
            return (1.0 + s) * jnp.exp(-s)

        return _with_origin(_scaled_sqdist(self, x1, x2), 1.5, closed)


@pytree_dataclass
class Matern52(_LengthscaleKernel, auto_dataclass=False):
    r"""Matérn kernel with smoothness 5/2.

    .. math:: k(x, x') = \left(1 + \sqrt{5}\,r + \tfrac{5}{3} r^2\right)\exp(-\sqrt{5}\,r),
              \qquad r = \sqrt{\textstyle\sum_k (x_k - x'_k)^2 / l_k^2}

    Twice mean-square differentiable sample paths. At ``r = 0`` the first derivatives are
    the exact 0 and the second derivatives in the inputs exact (``5 / (3 l^2)``).

    Args and shapes: as :class:`ExpSquared`.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import Matern52
        >>> K = Matern52()(jnp.array([0.0]), jnp.array([0.0, 1.0]))
        >>> print(np.asarray(K, float).round(4))
        [[1.    0.524]]
    """

    def _eval(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        def closed(r2: jax.Array) -> jax.Array:
            s = math.sqrt(5.0) * jnp.sqrt(r2)
            return (1.0 + s + (5.0 / 3.0) * r2) * jnp.exp(-s)

        return _with_origin(_scaled_sqdist(self, x1, x2), 5.0 / 6.0, closed)


@pytree_dataclass
class RationalQuadratic(_Stationary, auto_dataclass=False):
    r"""Rational-quadratic kernel: a scale mixture of squared exponentials.

    .. math:: k(x, x') = \left(1 + \frac{r^2}{2\alpha}\right)^{-\alpha}, \qquad
              r^2 = \sum_k \frac{(x_k - x'_k)^2}{l_k^2}

    i.e. ``(1 + |x - x'|^2 / (2 alpha l^2))^(-alpha)`` for a scalar lengthscale. As
    ``alpha -> inf`` it tends to :class:`ExpSquared`.

    Args:
        lengthscale: ``l``, a positive scalar or shape ``(d,)`` (ARD). Default 1.
        alpha: the shape parameter ``alpha > 0``, a scalar. Default 1.
        active_dims: static tuple of the input columns the kernel reads (``None``: all).

    Shapes: ``(n1, d), (n2, d) -> (n1, n2)``; ``diag``: ``(n,)`` of ones.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import RationalQuadratic
        >>> k = RationalQuadratic(lengthscale=1.0, alpha=0.5)  # (1 + r^2)^(-1/2)
        >>> print(np.asarray(k(jnp.array([0.0]), jnp.array([0.0, 1.0])), float).round(4))
        [[1.     0.7071]]
    """

    lengthscale: Any = 1.0
    alpha: Any = 1.0
    active_dims: tuple[int, ...] | None = static_field()

    _positive: ClassVar[tuple[str, ...]] = ("lengthscale", "alpha")

    def _eval(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        r2 = _scaled_sqdist(self, x1, x2)
        alpha = scalar_param(self.alpha, r2.dtype, "RationalQuadratic alpha")
        return jnp.exp(-alpha * jnp.log1p(r2 / (2.0 * alpha)))


@pytree_dataclass
class Periodic(_Stationary, auto_dataclass=False):
    r"""Periodic (exp-sine-squared) kernel of MacKay.

    .. math:: k(x, x') = \exp\left(-2 \sum_{k=1}^{d}
              \frac{\sin^2(\pi (x_k - x'_k) / p_k)}{l_k^2}\right)

    For one input dimension this is ``exp(-2 sin^2(pi |x - x'| / p) / l^2)``. In several
    dimensions the sum runs over the dimensions (a product of one-dimensional periodic
    kernels), not over the Euclidean distance.

    Args:
        lengthscale: ``l``, a positive scalar or shape ``(d,)``. Default 1.
        period: ``p``, a positive scalar or shape ``(d,)``. Default 1.
        active_dims: static tuple of the input columns the kernel reads (``None``: all).

    Shapes: ``(n1, d), (n2, d) -> (n1, n2)``; ``diag``: ``(n,)`` of ones.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import Periodic
        >>> k = Periodic(lengthscale=1.0, period=2.0)
        >>> print(np.asarray(k(jnp.array([0.0]), jnp.array([0.0, 1.0, 2.0])), float).round(4))
        [[1.     0.1353 1.    ]]
    """

    lengthscale: Any = 1.0
    period: Any = 1.0
    active_dims: tuple[int, ...] | None = static_field()

    _positive: ClassVar[tuple[str, ...]] = ("lengthscale", "period")

    def _eval(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        x1 = select_columns(x1, self.active_dims)
        x2 = select_columns(x2, self.active_dims)
        ls = per_dim(self.lengthscale, x1, "lengthscale")
        period = per_dim(self.period, x1, "period")
        return jnp.exp(-2.0 * dimsum(_periodic_term, x1, x2, math.pi / period, ls))


RBF = ExpSquared
ExpSineSquared = Periodic

# -------------------------------------------------------------------- dot products


@pytree_dataclass
class Linear(ActiveDimsKernel, auto_dataclass=False):
    r"""Linear (dot-product) kernel: Bayesian linear regression through ``offset``.

    .. math:: k(x, x') = \sigma^2 \sum_{k=1}^{d} (x_k - c_k)(x'_k - c_k)

    The functions it describes are linear and vanish at ``x = c``. For an intercept,
    add a :class:`Constant` kernel (``Linear() + 1.0``).

    Args:
        variance: ``sigma^2 > 0``, a scalar. Default 1.
        offset: ``c``, a real scalar or shape ``(d,)``. Default 0.
        active_dims: static tuple of the input columns the kernel reads (``None``: all).

    Shapes: ``(n1, d), (n2, d) -> (n1, n2)``; ``diag``: ``sigma^2 |x - c|^2``, ``(n,)``.
    The matrix has rank at most ``d``: positive semi-definite, not definite.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import Linear
        >>> k = Linear(variance=2.0, offset=1.0)
        >>> print(np.asarray(k(jnp.array([0.0, 3.0])), float).round(4))
        [[ 2. -4.]
         [-4.  8.]]
    """

    variance: Any = 1.0
    offset: Any = 0.0
    active_dims: tuple[int, ...] | None = static_field()

    _positive: ClassVar[tuple[str, ...]] = ("variance",)

    def _centered(self, x: jax.Array) -> jax.Array:
        x = select_columns(x, self.active_dims)
        return x - per_dim(self.offset, x, "offset")

    def _eval(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        dot = dimsum(_prod, self._centered(x1), self._centered(x2))
        return scalar_param(self.variance, dot.dtype, "Linear variance") * dot

    def _diag(self, x: jax.Array) -> jax.Array:
        dot = rowsum(_prod, self._centered(x))
        return scalar_param(self.variance, dot.dtype, "Linear variance") * dot


@pytree_dataclass
class Polynomial(ActiveDimsKernel, auto_dataclass=False):
    r"""Polynomial kernel of integer degree.

    .. math:: k(x, x') = \left(\sigma^2\, x^\top x' + c\right)^{q}

    Positive semi-definite for ``c >= 0``: it is a sum of products of the linear and the
    constant kernel.

    Args:
        degree: ``q``, a static positive integer. Default 2.
        variance: ``sigma^2 > 0``, a scalar. Default 1.
        offset: ``c > 0``, a scalar. Default 1.
        active_dims: static tuple of the input columns the kernel reads (``None``: all).

    Shapes: ``(n1, d), (n2, d) -> (n1, n2)``; ``diag``: ``(sigma^2 |x|^2 + c)^q``, ``(n,)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import Polynomial
        >>> k = Polynomial(degree=2, variance=1.0, offset=1.0)
        >>> print(np.asarray(k(jnp.array([1.0, 2.0])), float).round(4))
        [[ 4.  9.]
         [ 9. 25.]]
    """

    degree: int = static_field(2)
    variance: Any = 1.0
    offset: Any = 1.0
    active_dims: tuple[int, ...] | None = static_field()

    _positive: ClassVar[tuple[str, ...]] = ("variance", "offset")

    def __post_init__(self) -> None:
        degree = check_int(self.degree, "Polynomial degree", strict=False)
        object.__setattr__(self, "degree", degree)
        super().__post_init__()

    def _of_dot(self, dot: jax.Array) -> jax.Array:
        variance = scalar_param(self.variance, dot.dtype, "Polynomial variance")
        base = variance * dot + scalar_param(self.offset, dot.dtype, "Polynomial offset")
        return base**self.degree

    def _eval(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        a = select_columns(x1, self.active_dims)
        b = select_columns(x2, self.active_dims)
        return self._of_dot(dimsum(_prod, a, b))

    def _diag(self, x: jax.Array) -> jax.Array:
        return self._of_dot(rowsum(_prod, select_columns(x, self.active_dims)))


# --------------------------------------------------------------------- simple ones


@pytree_dataclass
class Constant(Kernel, auto_dataclass=False):
    r"""Constant kernel: ``k(x, x') = c`` for all inputs (a random constant offset).

    Args:
        value: ``c >= 0``, a scalar (the variance of the offset). Default 1.

    Shapes: ``(n1, d), (n2, d) -> (n1, n2)`` filled with ``c``; ``diag``: ``(n,)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import Constant
        >>> print(Constant(2.5)(jnp.zeros(2), jnp.zeros(3)))
        [[2.5 2.5 2.5]
         [2.5 2.5 2.5]]
    """

    value: Any = 1.0

    _positive: ClassVar[tuple[str, ...]] = ("value",)

    def _eval(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        c = scalar_param(self.value, x1.dtype, "Constant value")
        return jnp.broadcast_to(c, (x1.shape[0], x2.shape[0]))

    def _diag(self, x: jax.Array) -> jax.Array:
        return jnp.broadcast_to(scalar_param(self.value, x.dtype, "Constant value"), x.shape[:1])


@pytree_dataclass
class White(ActiveDimsKernel, auto_dataclass=False):
    r"""White-noise kernel: ``k(x, x') = sigma^2`` if ``x == x'`` else 0.

    Points are "identical" when their rows are exactly equal (in every active
    column), tested elementwise in the computation's dtype; it does not matter whether
    ``X1`` and ``X2`` are the same array object. Hence

    * ``k(X, X)`` is ``sigma^2 I`` when the rows of ``X`` are distinct: the kernel
      contributes on the diagonal;
    * ``k(X[I], X[J])`` is exactly the tile ``I, J`` of ``k(X, X)`` (also inside ``jit``,
      where object identity is meaningless);
    * ``k(X, Xs)`` is nonzero where a test point coincides with a training point, and
      duplicated rows in ``X`` get perfectly correlated entries (the duplicate block is
      ``sigma^2`` everywhere), so White does *not* regularise duplicated inputs.

    For independent observation noise (which also separates duplicated inputs and is
    not part of the predicted latent function), use the GP's ``noise`` argument; use
    White for a noise-like component of the covariance function itself.

    Args:
        variance: ``sigma^2 > 0``, a scalar. Default 1.
        active_dims: static tuple of the input columns compared (``None``: all).

    Shapes: ``(n1, d), (n2, d) -> (n1, n2)``; ``diag``: ``(n,)`` filled with ``sigma^2``.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import White
        >>> X = jnp.array([0.0, 1.0, 2.0])
        >>> print(White(0.5)(X, X))
        [[0.5 0.  0. ]
         [0.  0.5 0. ]
         [0.  0.  0.5]]
        >>> print(White(0.5)(X, jnp.array([1.0, 1.5])))
        [[0.  0. ]
         [0.5 0. ]
         [0.  0. ]]
    """

    variance: Any = 1.0
    active_dims: tuple[int, ...] | None = static_field()

    _positive: ClassVar[tuple[str, ...]] = ("variance",)

    def _eval(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        a = select_columns(x1, self.active_dims)
        b = select_columns(x2, self.active_dims)
        d = a.shape[1]
        if d == 0 or d > _UNROLL_MAX_DIM:
            same = jnp.all(a[:, None, :] == b[None, :, :], axis=-1)
        else:  # column by column, as dimsum: no (n1, n2, d) comparison to reduce
            same = a[:, None, 0] == b[None, :, 0]
            for k in range(1, d):
                same = same & (a[:, None, k] == b[None, :, k])
        variance = scalar_param(self.variance, a.dtype, "White variance")
        return jnp.where(same, variance, jnp.zeros((), a.dtype))

    def _diag(self, x: jax.Array) -> jax.Array:
        select_columns(x, self.active_dims)
        return jnp.broadcast_to(scalar_param(self.variance, x.dtype, "White variance"), x.shape[:1])


# -------------------------------------------------------------------- combinations


@dataclasses.dataclass(frozen=True, eq=False)
class _Pair(Kernel, auto_dataclass=False):
    """Two kernels combined entry by entry by ``_op`` (:class:`Sum`, :class:`Product`)."""

    kernel1: Kernel
    kernel2: Kernel

    def __post_init__(self) -> None:
        check_kernel(type(self).__name__, self.kernel1)
        check_kernel(type(self).__name__, self.kernel2)

    @staticmethod
    def _op(a: Any, b: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _eval(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        return self._op(self.kernel1._eval(x1, x2), self.kernel2._eval(x1, x2))

    def _diag(self, x: jax.Array) -> jax.Array:
        return self._op(self.kernel1._diag(x), self.kernel2._diag(x))


class _OfOne(Kernel, auto_dataclass=False):
    """A function ``_apply`` of one kernel's entries (:class:`Scale`, :class:`Power`)."""

    kernel: Kernel  # a dataclass field of each subclass

    def __post_init__(self) -> None:
        check_kernel(type(self).__name__, self.kernel)

    def _apply(self, k: jax.Array) -> jax.Array:  # pragma: no cover - abstract
        raise NotImplementedError

    def _eval(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        return self._apply(self.kernel._eval(x1, x2))

    def _diag(self, x: jax.Array) -> jax.Array:
        return self._apply(self.kernel._diag(x))


@pytree_dataclass
class Sum(_Pair, auto_dataclass=False):
    r"""Sum of two kernels: ``k(x, x') = k1(x, x') + k2(x, x')`` (what ``k1 + k2`` builds).

    Args:
        kernel1: a kernel.
        kernel2: a kernel.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import Constant, ExpSquared
        >>> k = ExpSquared() + Constant(1.0)
        >>> print(type(k).__name__, jnp.round(k(jnp.zeros(1)), 4))
        Sum [[2.]]
    """

    @staticmethod
    def _op(a: Any, b: Any) -> Any:
        return a + b


@pytree_dataclass
class Product(_Pair, auto_dataclass=False):
    r"""Elementwise product of two kernels: ``k(x, x') = k1(x, x') k2(x, x')`` (``k1 * k2``).

    Args:
        kernel1: a kernel.
        kernel2: a kernel.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import ExpSquared, Periodic
        >>> k = ExpSquared(lengthscale=10.0) * Periodic(period=1.0)
        >>> print(np.asarray(k(jnp.array([0.0]), jnp.array([1.0])), float).round(4))
        [[0.995]]
    """

    @staticmethod
    def _op(a: Any, b: Any) -> Any:
        return a * b


@pytree_dataclass
class Scale(_OfOne, auto_dataclass=False):
    r"""A kernel scaled by a learnable amplitude: ``k(x, x') = a k0(x, x')``.

    ``2.0 * k0`` and ``k0 * 2.0`` build ``Scale(2.0, k0)``. The amplitude multiplies the
    covariance, so for a unit-variance kernel it is the marginal variance ``sigma^2``
    (the function's standard deviation is ``sqrt(a)``).

    Args:
        amplitude: ``a > 0``, a scalar.
        kernel: the kernel ``k0`` to scale.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import Matern32
        >>> k = 4.0 * Matern32()
        >>> print(k.amplitude, jnp.round(k.diag(jnp.zeros(2)), 4))
        4.0 [4. 4.]
    """

    amplitude: Any
    kernel: Kernel

    _positive: ClassVar[tuple[str, ...]] = ("amplitude",)

    def _apply(self, k: jax.Array) -> jax.Array:
        return scalar_param(self.amplitude, k.dtype, "Scale amplitude") * k


@pytree_dataclass
class Power(_OfOne, auto_dataclass=False):
    r"""A kernel raised to a fixed power, entry by entry: ``k(x, x') = k0(x, x')^p``
    (what ``k0 ** p`` builds).

    An integer power of a positive semi-definite kernel is positive semi-definite (a
    Schur product). A non-integer ``p`` needs ``k0 >= 0`` everywhere and keeps positive
    semi-definiteness for kernels that are infinitely divisible (``ExpSquared``,
    ``Matern12``, ``RationalQuadratic``, ``Periodic`` with positive values: their powers
    only rescale a lengthscale or ``alpha``); otherwise check your case. The exponent is a
    fixed setting (static), as in scikit-learn's ``Exponentiation``; the base kernel's
    parameters are learnable.

    Args:
        kernel: the base kernel ``k0``.
        exponent: ``p``, a positive real number (static); an integer is applied by
            repeated multiplication (exact for negative covariances too).

    Raises:
        TypeError / ValueError: on an exponent that is not a positive finite real number.

    Example:
        >>> import jax.numpy as jnp
        >>> import numpy as np
        >>> from gpchol.kernels import ExpSquared
        >>> k = ExpSquared(lengthscale=2.0) ** 4  # equals ExpSquared(lengthscale=1.0)
        >>> K = k(jnp.array([0.0]), jnp.array([1.0]))
        >>> print(type(k).__name__, np.asarray(K, float).round(4))
        Power [[0.6065]]
    """

    kernel: Kernel
    exponent: Any = static_field(1)

    def __post_init__(self) -> None:
        super().__post_init__()
        p = self.exponent
        if isinstance(p, bool) or not isinstance(p, numbers.Real):
            if isinstance(p, (np.ndarray, np.generic, jax.Array)) and np.ndim(p) == 0:
                raise TypeError(
                    "the exponent of a kernel power is a fixed setting: pass a Python "
                    f"number (e.g. float(p)), not an array; got {p!r}"
                )
            raise TypeError(f"the exponent of a kernel power must be a real number; got {p!r}")
        value = float(p)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(
                f"the exponent of a kernel power must be positive and finite; got {p!r}"
            )
        p = int(value) if value.is_integer() else value
        object.__setattr__(self, "exponent", p)

    def _apply(self, k: jax.Array) -> jax.Array:
        if isinstance(self.exponent, int):
            return k**self.exponent
        # k^p for a non-integer p: where k underflowed to 0 (far-apart points) the chain
        # rule would give p 0^(p-1) * 0 = inf * 0 = NaN for p < 1; the value there is 0
        # and so is its derivative along the base kernel's (zero) derivative. A negative
        # k stays NaN, as k^p.
        zero = k == 0
        return jnp.where(zero, jnp.zeros((), k.dtype), jnp.where(zero, 1.0, k) ** self.exponent)
