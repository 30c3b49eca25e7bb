"""Parameter transforms for unconstrained optimisation.

A transform maps an unconstrained real number ``u`` to a constrained parameter value
``c = forward(u)`` and back with ``u = inverse(c)``. Optimisers work on ``u``; models
see ``c``. Transforms act elementwise, so a leaf may be a scalar or an array (an ARD
lengthscale of shape ``(d,)``).

Transforms are plain, hashable, immutable objects. They are deliberately *not*
registered as pytrees: inside a pytree of transforms they are leaves. A pytree of
transforms is a *prefix* of the parameter pytree it describes (one transform may govern a
whole subtree), with ``None`` meaning identity:

>>> import jax.numpy as jnp
>>> from gpchol import Positive, to_constrained, to_unconstrained
>>> params = {"lengthscale": jnp.array([0.5, 2.0]), "mean": -3.0}
>>> transforms = {"lengthscale": Positive(), "mean": None}
>>> u = to_unconstrained(params, transforms)
>>> c = to_constrained(u, transforms)
>>> print(jnp.round(c["lengthscale"], 4), c["mean"])
[0.5 2. ] -3.0
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "Below",
    "Bounded",
    "Identity",
    "LogPositive",
    "Positive",
    "Transform",
    "to_constrained",
    "to_unconstrained",
]


def _concrete(value: Any) -> np.ndarray | None:
    """Returns ``value`` as a NumPy array, or None when it is traced (inside ``jit``)."""
    if isinstance(value, jax.core.Tracer):
        return None
    try:
        return np.asarray(value)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def _describe_bad(arr: np.ndarray, ok: np.ndarray) -> str:
    """Formats the offending entries of ``arr`` (where ``ok`` is False) for a message."""
    if arr.ndim == 0:
        return f"value {arr.item()!r}"
    bad = np.argwhere(~ok)
    shown = ", ".join(f"[{', '.join(map(str, idx))}]={arr[tuple(idx)].item()!r}" for idx in bad[:3])
    more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
    return f"value(s) {shown}{more} of an array of shape {arr.shape}"


def _checked_inverse(t: Any, c: Any, inside: Any, must: str, fn: Any) -> jax.Array:
    """``_elementwise(c, fn)`` for the inverse of the transform ``t``, after a
    ``ValueError`` naming the entries of a concrete ``c`` not ``inside`` its domain ("... it
    must {must}"). A value inside that rounds onto the boundary in the computation's dtype
    (float64 ``0.99999999`` is float32 ``1.0``), or whose unconstrained value is not finite
    there, is refused as well: a fit started from an infinite value cannot move."""
    arr = _concrete(c)
    if arr is None:
        return _elementwise(c, fn)
    ok = np.asarray(inside(arr))
    if not np.all(ok):
        raise ValueError(f"{_describe_bad(arr, ok)} is outside the domain of {t!r}: it must {must}")
    ok = np.isfinite(arr)
    if not np.all(ok):  # inf (inside a domain unbounded above): no finite parameter maps there
        raise ValueError(f"{_describe_bad(arr, ok)} of {t!r} is not finite: give a finite value")
    dtype = _eager_dtype(c)
    with np.errstate(over="ignore"):  # float64 1e39 is float32 inf
        cast = np.asarray(arr, dtype)
    ok = np.isfinite(cast)
    if not np.all(ok):
        raise ValueError(
            f"{_describe_bad(arr, ok)} of {t!r} overflows {np.dtype(dtype).name}: compute in "
            "float64 (jax.config.update('jax_enable_x64', True)) or rescale the parameter"
        )
    out = _elementwise(c, fn)
    ok = np.asarray(inside(cast)) & np.isfinite(np.asarray(out))
    if not np.all(ok):
        raise ValueError(
            f"{_describe_bad(arr, ok)} is too close to the boundary of the domain of {t!r} "
            f"for {np.dtype(dtype).name} (its unconstrained value would be infinite): give a "
            "value further inside, or compute in float64"
        )
    return out


def _check_finite_float(value: Any, name: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number; got {value!r}") from None
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite; got {value!r}")
    return out


class Transform:
    """Base class of the transforms: a bijection between R and a parameter's domain.

    Subclasses implement :meth:`forward` (unconstrained to constrained) and
    :meth:`inverse` (constrained to unconstrained). Both act elementwise on arrays of
    any shape ``(...)`` and keep the floating dtype of their input.
    """

    def forward(self, u: Any) -> jax.Array:  # pragma: no cover - abstract
        """Maps an unconstrained value ``u`` (shape ``(...)``) into the domain."""
        raise NotImplementedError

    def inverse(self, c: Any) -> jax.Array:  # pragma: no cover - abstract
        """Maps a value ``c`` (shape ``(...)``) of the domain back to R."""
        raise NotImplementedError

    def __call__(self, u: Any) -> jax.Array:
        """Same as :meth:`forward`."""
        return self.forward(u)


def _as_float(x: Any) -> jax.Array:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    return x


def _eager_dtype(x: Any) -> Any:
    """The floating dtype JAX gives a concrete ``x`` (its own, or JAX's default float)."""
    dtype = jnp.result_type(x)
    return dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.result_type(float)


def _elementwise(x: Any, fn: Any) -> jax.Array:
    """``fn(xp, v)`` on ``x`` as a floating array (JAX's dtype): ``xp = jax.numpy`` when
    ``x`` is traced, else ``numpy`` (eager JAX would compile a program per operation and
    shape at every fit's start and end), the result placed on the device."""
    if isinstance(x, jax.core.Tracer):
        return fn(jnp, _as_float(x))
    dtype = _eager_dtype(x)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        out = fn(np, np.asarray(x, dtype))
    return jax.device_put(np.asarray(out, dtype))


def _softplus(xp: Any, u: Any) -> Any:
    return xp.logaddexp(0.0, u)


def _sigmoid(xp: Any, u: Any) -> Any:
    if xp is jnp:
        return jax.nn.sigmoid(u)
    e = np.exp(-np.abs(u))  # in (0, 1]: no overflow on either side
    return np.where(u >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@dataclasses.dataclass(frozen=True)
class Identity(Transform):
    """The identity: for parameters that may take any real value (a mean, an offset).

    Example:
        >>> from gpchol import Identity
        >>> print(float(Identity().forward(-2.5)))
        -2.5
    """

    def forward(self, u: Any) -> jax.Array:
        """Returns ``u`` as a floating array, shape ``(...)``."""
        return _elementwise(u, lambda xp, v: v)

    def inverse(self, c: Any) -> jax.Array:
        """Returns ``c`` as a floating array, shape ``(...)``."""
        return _elementwise(c, lambda xp, v: v)


@dataclasses.dataclass(frozen=True)
class Positive(Transform):
    """Softplus transform onto ``(lower, inf)``.

    ``forward(u) = lower + softplus(u) = lower + log(1 + exp(u))`` and
    ``inverse(c) = y + log(-expm1(-y))`` with ``y = c - lower``, which is
    ``log(exp(y) - 1)`` without overflow or cancellation. For very negative ``u``,
    ``lower + softplus(u)`` rounds to ``lower`` itself (for ``lower = 0``: once ``exp(u)``
    underflows, near ``u < -745`` in float64 and ``u < -103`` in float32).

    Args:
        lower: the (excluded) lower bound of the domain, a finite float; default 0.

    Raises:
        ValueError: from :meth:`inverse` when a concrete value is not ``> lower`` (or is
            NaN); the message names the value. Traced values (inside ``jit``) are not
            checked.

    Example:
        >>> from gpchol import Positive
        >>> t = Positive()
        >>> u = t.inverse(2.0)
        >>> print(round(float(t.forward(u)), 5))
        2.0
        >>> print(round(float(Positive(lower=1e-3).forward(-30.0)), 6))
        0.001
    """

    lower: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "lower", _check_finite_float(self.lower, "Positive: lower"))

    def forward(self, u: Any) -> jax.Array:
        """Returns ``lower + softplus(u)``, same shape ``(...)`` and dtype as ``u``."""
        return _elementwise(u, lambda xp, v: self.lower + _softplus(xp, v))

    def inverse(self, c: Any) -> jax.Array:
        """Returns the ``u`` with ``forward(u) == c``; ``c`` must be ``> lower``."""
        return _checked_inverse(
            self,
            c,
            lambda a: a > self.lower,
            f"be > {self.lower} (and not NaN). Give an initial value inside the domain, "
            "or use a different transform (Identity(), Positive(lower=...)).",
            lambda xp, v: _softplus_inverse(xp, v - self.lower),
        )


def _softplus_inverse(xp: Any, y: Any) -> Any:
    """``log(exp(y) - 1)`` for ``y > 0``, written ``y + log(-expm1(-y))``: no overflow for
    large ``y``, no cancellation for small ``y``."""
    return y + xp.log(-xp.expm1(-y))


@dataclasses.dataclass(frozen=True)
class Below(Transform):
    """``forward(u) = high - softplus(u)``: onto ``(-inf, high)`` (a bound above only), the
    mirror image of :class:`Positive`.

    Args:
        high: the (excluded) upper bound of the domain, a finite float.

    Raises:
        ValueError: from :meth:`inverse` when a concrete value is not ``< high`` (as for
            :class:`Positive`).

    Example:
        >>> from gpchol._base.transforms import Below
        >>> t = Below(2.0)
        >>> round(float(t.forward(t.inverse(-5.0))), 6)
        -5.0
    """

    high: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "high", _check_finite_float(self.high, "Below: high"))

    def forward(self, u: Any) -> jax.Array:
        """Returns ``high - softplus(u)``, same shape ``(...)`` as ``u``."""
        return _elementwise(u, lambda xp, v: self.high - _softplus(xp, v))

    def inverse(self, c: Any) -> jax.Array:
        """Returns the ``u`` with ``forward(u) == c``; ``c`` must be ``< high``."""
        return _checked_inverse(
            self,
            c,
            lambda a: a < self.high,
            f"be < {self.high} (and not NaN). Give an initial value inside the domain.",
            lambda xp, v: _softplus_inverse(xp, self.high - v),
        )


@dataclasses.dataclass(frozen=True)
class LogPositive(Transform):
    """``c = exp(u)``: a positive parameter optimised on the log scale.

    Scale parameters spanning orders of magnitude are better conditioned for L-BFGS in log
    space than through softplus, which is linear for large values.

    Example:
        >>> from gpchol._base.transforms import LogPositive
        >>> round(float(LogPositive().forward(LogPositive().inverse(3.0))), 6)
        3.0
    """

    def forward(self, u: Any) -> jax.Array:
        """``exp(u)``, shape ``(...)``."""
        return _elementwise(u, lambda xp, v: xp.exp(v))

    def inverse(self, c: Any) -> jax.Array:
        """``log(c)``, shape ``(...)``; ``c > 0`` (a ``ValueError`` for a concrete value
        outside: ``log 0 = -inf`` would start a fit that cannot move)."""
        return _checked_inverse(
            self,
            c,
            lambda a: a > 0,
            "be > 0 (and not NaN). Give a positive initial value.",
            lambda xp, v: xp.log(v),
        )


@dataclasses.dataclass(frozen=True)
class Bounded(Transform):
    """Scaled logistic sigmoid onto the open interval ``(low, high)``.

    ``forward(u) = low + (high - low) * sigmoid(u)`` and
    ``inverse(c) = log(c - low) - log(high - c)``, accurate near both ends.

    Args:
        low: lower end of the interval, a finite float.
        high: upper end of the interval, a finite float ``> low``.

    Raises:
        ValueError: at construction when ``low >= high`` or an end is not finite; from
            :meth:`inverse` when a concrete value is not strictly inside ``(low, high)``
            (the message names the value).

    Example:
        >>> from gpchol import Bounded
        >>> t = Bounded(0.5, 4.0)
        >>> print(round(float(t.forward(0.0)), 4))
        2.25
        >>> print(round(float(t.forward(t.inverse(3.9))), 4))
        3.9
    """

    low: float
    high: float

    def __post_init__(self) -> None:
        low = _check_finite_float(self.low, "Bounded: low")
        high = _check_finite_float(self.high, "Bounded: high")
        if not low < high:
            raise ValueError(f"Bounded needs low < high; got low={low!r}, high={high!r}")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    def forward(self, u: Any) -> jax.Array:
        """Returns ``low + (high - low) * sigmoid(u)``, shape ``(...)``."""
        return _elementwise(u, lambda xp, v: self.low + (self.high - self.low) * _sigmoid(xp, v))

    def inverse(self, c: Any) -> jax.Array:
        """Returns the ``u`` with ``forward(u) == c``; ``low < c < high`` required."""
        return _checked_inverse(
            self,
            c,
            lambda a: (a > self.low) & (a < self.high),
            f"lie strictly between {self.low} and {self.high}. Give an initial value inside "
            "the interval, or widen the bounds.",
            lambda xp, v: xp.log(v - self.low) - xp.log(self.high - v),
        )


def _is_transform_leaf(x: Any) -> bool:
    return x is None or isinstance(x, Transform)


def _apply(method: str, params: Any, transforms: Any) -> Any:
    treedef = jax.tree_util.tree_structure(transforms, is_leaf=_is_transform_leaf)
    try:
        treedef.flatten_up_to(params)  # type: ignore[attr-defined]  # exists; not in jaxlib's stubs
    except (ValueError, TypeError) as err:
        raise ValueError(
            "transforms must be a pytree prefix of params (the same containers, with a "
            "Transform or None where params has a leaf or a whole subtree); "
            f"transforms has structure {treedef}, which does not match params: {err}"
        ) from None
    for t in jax.tree_util.tree_leaves(transforms, is_leaf=_is_transform_leaf):
        if t is not None and not isinstance(t, Transform):
            raise TypeError(f"transforms may hold only Transform objects or None; got {t!r}")

    def per_prefix(path: tuple, transform: Transform | None, subtree: Any) -> Any:
        if transform is None:
            return subtree
        fn = getattr(transform, method)

        def per_leaf(subpath: tuple, value: Any) -> jax.Array:
            try:
                return fn(value)
            except ValueError as err:
                name = jax.tree_util.keystr(tuple(path) + tuple(subpath)) or "<root>"
                raise ValueError(f"parameter {name}: {err}") from None

        return jax.tree_util.tree_map_with_path(per_leaf, subtree)

    return jax.tree_util.tree_map_with_path(
        per_prefix, transforms, params, is_leaf=_is_transform_leaf
    )


def to_unconstrained(params: Any, transforms: Any) -> Any:
    """Maps constrained parameters to unconstrained space, leaf by leaf.

    Args:
        params: a pytree of parameter values (floats or arrays of any shape).
        transforms: a pytree prefix of ``params`` whose leaves are :class:`Transform`
            objects or ``None`` (identity). A single transform applies to every leaf.

    Returns:
        A pytree with the structure of ``params``; leaves governed by a transform become
        ``transform.inverse(leaf)`` (JAX arrays), the others are returned unchanged.

    Raises:
        ValueError: when ``transforms`` is not a prefix of ``params``, or when a value lies
            outside its transform's domain (the message names the parameter's path and
            the value, e.g. ``parameter ['noise']: value -1.0 is outside the domain ...``).

    Example:
        >>> from gpchol import Positive, to_unconstrained
        >>> u = to_unconstrained({"noise": 1.0, "shift": 2.0}, {"noise": Positive(), "shift": None})
        >>> print(round(float(u["noise"]), 4), u["shift"])
        0.5413 2.0
    """
    return _apply("inverse", params, transforms)


def to_constrained(uparams: Any, transforms: Any) -> Any:
    """Maps unconstrained parameters back to their domains (inverse of
    :func:`to_unconstrained`, whose arguments it takes); differentiable, so use it inside
    the loss. Governed leaves become ``transform.forward(leaf)``.

    Example:
        >>> from gpchol import Bounded, to_constrained
        >>> c = to_constrained({"period": 0.0}, {"period": Bounded(0.5, 1.5)})
        >>> print(float(c["period"]))
        1.0
    """
    return _apply("forward", uparams, transforms)
