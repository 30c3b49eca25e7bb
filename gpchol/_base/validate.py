"""Input checks shared by the public functions (clear errors, never ``assert``)."""

from __future__ import annotations

import math
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def as_float_array(x: Any, name: str) -> jax.Array:
    """Return ``x`` as a JAX array of a supported float dtype, or raise ``TypeError``.

    Python scalars and integer NumPy inputs are refused rather than silently cast, so
    that the dtype a user gets back is the dtype they passed.
    """
    if not hasattr(x, "dtype"):
        x = np.asarray(x)
    dtype = np.dtype(x.dtype)
    if dtype.kind in "iub":
        raise TypeError(
            f"{name} has integer or boolean dtype {dtype}; pass a floating-point array "
            "(float32 or float64), e.g. `jnp.asarray(x, jnp.float64)`."
        )
    if dtype.kind == "c":
        raise TypeError(
            f"{name} is complex ({dtype}); gpchol supports real float32/float64 matrices only."
        )
    if dtype not in _FLOATS:
        raise TypeError(
            f"{name} has dtype {dtype}; gpchol supports float32 and float64. "
            f"Convert it first, e.g. `{name}.astype(jnp.float32)`."
        )
    return x if isinstance(x, jnp.ndarray) else jnp.asarray(x)


def replicated_if_explicit(x: jax.Array) -> jax.Array:
    """``x`` replicated over its mesh when it is sharded over *Explicit* mesh axes
    (``jax.make_mesh``'s default); anything else as it is.

    The one-device algorithms mix ``x`` with its transpose and take diagonals, which JAX
    refuses for arrays whose type carries a sharding (``P('r', 'c') + P('c', 'r')``); on
    Auto axes JAX gathers by itself. Used where a sharded input is not routed to
    :mod:`gpchol.distributed` (a jitter schedule, another backend, the solves).
    """
    s = getattr(x, "sharding", None)
    if not isinstance(s, NamedSharding):
        s = getattr(getattr(x, "aval", None), "sharding", None)
    if not isinstance(s, NamedSharding) or all(p is None for p in s.spec):
        return x
    types = getattr(s.mesh, "axis_types", ())
    if not any(t == jax.sharding.AxisType.Explicit for t in types):
        return x
    return jax.sharding.reshard(x, NamedSharding(s.mesh, P()))


def residual_dtype(x_dtype: Any, y_dtype: Any) -> Any:
    """The dtype a model computes ``y - m(X)`` and what follows in: the promotion of the
    inputs' and the observations' dtypes, the inputs' when that is not floating.

    Example:
        >>> import numpy as np
        >>> residual_dtype(np.float16, np.float32), residual_dtype(np.float32, np.int32)
        (dtype('float32'), dtype('float32'))
    """
    dtype = jnp.result_type(x_dtype, y_dtype)
    return dtype if jnp.issubdtype(dtype, jnp.floating) else np.dtype(x_dtype)


def check_square(a: jax.Array, name: str = "a") -> None:
    """Raise ``ValueError`` unless ``a`` has shape ``(..., n, n)``."""
    if a.ndim < 2:
        raise ValueError(
            f"{name} must have shape (..., n, n) with at least 2 dimensions; got shape "
            f"{tuple(a.shape)}. For a 1x1 matrix pass `x.reshape(1, 1)`."
        )
    if a.shape[-1] != a.shape[-2]:
        raise ValueError(
            f"{name} must be square in its last two dimensions; got shape {tuple(a.shape)}."
        )


def check_tile_size(tile_size: object, name: str = "tile_size") -> int | None:
    """Validate an optional tile size; returns it as ``int`` or ``None``."""
    return None if tile_size is None else check_int(tile_size, name)


def check_int(
    value: object,
    name: str,
    what: str | None = None,
    *,
    minimum: int = 1,
    strict: bool = True,
    kind: str | None = None,
) -> int:
    """``value`` as an ``int`` of at least ``minimum`` (not a bool, not a float), or raise.

    ``name`` (and ``what`` it counts, optional) make the message, ``kind`` its phrase for
    the type (default: "a positive int" or "an int >= minimum"). A wrong type raises
    ``TypeError``, or ``ValueError`` with ``strict=False`` (for functions that always
    raised ``ValueError``); a value below ``minimum`` raises ``ValueError``.

    Example:
        >>> check_int(3, "steps", minimum=0)
        3
    """
    label = f"{name} ({what})" if what else name
    kind = kind or ("a positive int" if minimum == 1 else f"an int >= {minimum}")
    error = TypeError if strict else ValueError
    if isinstance(value, (bool, np.bool_)):
        raise error(f"{label} must be {kind}, not a bool; got {value!r}.")
    try:
        k = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        hint = (
            "; it is static, so pass a Python int (not a traced value inside jit)"
            if not is_concrete(value)
            else f"; pass an int, e.g. {name}={round(value)}"  # type: ignore[call-overload]
            if isinstance(value, (float, np.floating))
            and np.isfinite(value)
            and name.isidentifier()
            else ""
        )
        raise error(
            f"{label} must be {kind}; got {value!r} of type {type(value).__name__}{hint}."
        ) from None
    if k < minimum:
        raise ValueError(f"{label} must be >= {minimum}; got {k}.")
    return int(k)


def real_variance(noise: Any, dtype: Any) -> jax.Array:
    """``noise`` (a variance, any shape) as a floating JAX array: an integer one cast to
    ``dtype``, a complex or boolean one refused (a complex noise was cast to its real part
    with a hidden DeprecationWarning).

    Example:
        >>> real_variance(1, "float32").dtype
        dtype('float32')
    """
    noise = jnp.asarray(noise)
    if jnp.issubdtype(noise.dtype, jnp.complexfloating) or noise.dtype == jnp.bool_:
        raise TypeError(
            f"noise must be a real variance (a float or an array of floats); got dtype "
            f"{noise.dtype}."
        )
    return noise if jnp.issubdtype(noise.dtype, jnp.floating) else noise.astype(dtype)


def check_scalar_or_vector(shape: tuple[int, ...], n: int, name: str, per: str) -> None:
    """Raise ``ValueError`` unless ``shape`` is ``()``, ``(1,)`` or ``(n,)`` (one ``per``).

    Example:
        >>> check_scalar_or_vector((3,), 3, "noise", "variance per point")
    """
    if len(shape) > 1 or (len(shape) == 1 and shape[0] not in (1, n)):
        raise ValueError(
            f"{name} must be a scalar or have shape ({n},), one {per}; got shape {tuple(shape)}."
        )


def check_finite_rows(x: ArrayLike, name: str, advice: str) -> None:
    """Raise ``ValueError`` naming the rows of a concrete ``(n, d)`` ``x`` with NaN or inf.

    ``advice`` ends the message (what to do); traced values are not checked.

    Example:
        >>> check_finite_rows(np.ones((2, 1)), "X", "drop or impute those rows first")
    """
    if not is_concrete(x):
        return
    bad = np.flatnonzero(~np.all(np.isfinite(np.asarray(x)), axis=1))
    if bad.size:
        more = f" and {bad.size - 5} more" if bad.size > 5 else ""
        raise ValueError(f"{name} has NaN or inf in row(s) {bad[:5].tolist()}{more}; {advice}.")


def check_tolerance(value: object, name: str = "tol") -> float:
    """``value`` as a ``float`` >= 0 (a real number, not a bool, not NaN), or raise ``ValueError``.

    Example:
        >>> check_tolerance(1e-9)
        1e-09
    """
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not value >= 0
    ):
        raise ValueError(f"{name} must be a number >= 0; got {value!r}.")
    return float(value)


def check_number(value: object, name: str, *, positive: bool = False) -> float:
    """``value`` as a finite ``float``, ``> 0`` with ``positive`` else ``>= 0`` (a real
    number, not a bool), or raise ``ValueError`` naming ``name``.

    Example:
        >>> check_number(0.05, "learning_rate", positive=True)
        0.05
    """
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not math.isfinite(value)
        or not (value > 0 if positive else value >= 0)
    ):
        kind = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number {kind}; got {value!r}.")
    return float(value)


def check_fit_settings(
    *,
    steps: object,
    tol: object,
    checkpoint_every: object,
    restarts: object = 0,
    patience: object = 1,
) -> None:
    """The settings a fit loop shares (``gpchol.fit``, ``gpchol.fit_batched``), or raise.

    Raises:
        ValueError: ``steps`` or ``restarts`` is not an int >= 0, ``patience`` or
            ``checkpoint_every`` not an int >= 1, or ``tol`` not a number >= 0 (bools
            are refused everywhere).
    """
    for name, value, minimum in (
        ("steps", steps, 0),
        ("restarts", restarts, 0),
        ("patience", patience, 1),
        ("checkpoint_every", checkpoint_every, 1),
    ):
        check_int(value, name, minimum=minimum, strict=False)
    check_tolerance(tol)


def is_concrete(*xs: object) -> bool:
    """True when no argument is a JAX tracer (so values can be read on the host)."""
    from jax.core import Tracer

    return not any(isinstance(x, Tracer) for x in xs)


def as_inputs(X: ArrayLike, name: str = "X") -> jax.Array:
    """``X`` as a floating ``(n, d)`` array (``(n,)`` is read as ``(n, 1)``), or raise.

    Integer inputs are cast to the default float dtype (they are coordinates, not a
    matrix to factor). Shared by kernels, means and the GP constructors.
    """
    X = jnp.asarray(X)
    if X.ndim == 1:
        X = X[:, None]
    elif X.ndim != 2:
        raise ValueError(
            f"{name} must have shape (n, d) or (n,); got an array of shape {tuple(X.shape)}. "
            "For a batch of inputs (or of GPs), use jax.vmap."
        )
    if X.shape[1] == 0:
        raise ValueError(f"{name} must have at least one column; got shape {tuple(X.shape)}.")
    if not jnp.issubdtype(X.dtype, jnp.floating):
        X = X.astype(jnp.result_type(float))
    return X


def check_jitter(jitter: object, *, schedule: bool = True) -> tuple[float, ...] | None:
    """Validate a jitter argument: ``None``, a float, or (``schedule``) a tuple of floats.

    Args:
        jitter: what the user passed.
        schedule: accept a tuple/list tried in order; when False (a density that must
            stay continuous in its parameters) only a single value is accepted.

    Returns:
        ``None``, or the values as a tuple of floats (one value for a single float).

    Raises:
        TypeError: a value is not a real number, or a schedule where one is refused.
        ValueError: an empty schedule, or a negative or non-finite value.

    Example:
        >>> check_jitter(1e-6), check_jitter([1e-8, 1e-6])
        ((1e-06,), (1e-08, 1e-06))
    """
    if jitter is None:
        return None
    if isinstance(jitter, (tuple, list)):
        if not schedule:
            raise TypeError(
                "jitter must be a single float here (a schedule that retries with a larger "
                "jitter would make the density discontinuous in the sampled parameters)."
            )
        values = tuple(jitter)
    else:
        values = (jitter,)
    if not values:
        raise ValueError("jitter must be a float or a non-empty tuple of floats.")
    out = []
    for v in values:
        if isinstance(v, (str, bytes, bool, np.bool_)):  # float("1e-3") and float(True) work
            raise TypeError(f"jitter values must be real numbers; got {v!r}.")
        try:
            f = float(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise TypeError(f"jitter values must be real numbers; got {v!r}.") from None
        if not math.isfinite(f) or f < 0:
            raise ValueError(f"jitter values must be finite and >= 0; got {v!r}.")
        out.append(f)
    return tuple(out)


def input_mesh(X: object) -> Mesh | AbstractMesh | None:
    """The mesh of ``X`` when it is placed on a multi-device mesh (the sharded path).

    Reads ``X.sharding`` (a concrete array) or its abstract value's sharding (a traced
    one); ``None`` for anything on one device.

    Example:
        >>> import jax.numpy as jnp
        >>> input_mesh(jnp.zeros(3)) is None
        True
    """
    s = getattr(X, "sharding", None)
    if not isinstance(s, NamedSharding):
        s = getattr(getattr(X, "aval", None), "sharding", None)
    if isinstance(s, NamedSharding) and s.mesh.size > 1:
        return s.mesh
    return None
