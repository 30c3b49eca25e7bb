"""Pytrees of the package: frozen dataclasses (kernels and means) and classes over named
attributes (the model and posterior classes, :class:`AttrPytree`).

Example:
    >>> import jax
    >>> @pytree_dataclass
    ... class Pair:
    ...     a: float = 1.0
    ...     name: str = static_field("p")
    >>> jax.tree_util.tree_leaves(Pair(2.0))
    [2.0]
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence
from typing import Any, ClassVar, Self, TypeVar, dataclass_transform

import jax
import numpy as np

__all__ = [
    "AttrPytree",
    "as_param",
    "is_scalar",
    "pytree_dataclass",
    "register_fields",
    "static_field",
]

_T = TypeVar("_T")


def static_field(default: Any = None) -> Any:
    """A dataclass field stored as static pytree metadata (not a leaf)."""
    return dataclasses.field(default=default, metadata={"static": True})


def _new(cls: type[_T], *named: tuple[Sequence[str], Sequence[Any]]) -> _T:
    """An instance of ``cls`` with the named attributes set, ``__init__`` not called (the
    unflattening of :func:`register_fields` and :class:`AttrPytree`)."""
    obj = object.__new__(cls)
    for names, values in named:
        for n, v in zip(names, values, strict=True):
            object.__setattr__(obj, n, v)
    return obj


def register_fields(
    cls: type[_T],
    data_fields: Sequence[str] | None = None,
    meta_fields: Sequence[str] | None = None,
) -> type[_T]:
    """Registers ``cls`` as a pytree over its named fields: the children are
    ``data_fields`` (keyed ``.name``), the auxiliary data ``meta_fields`` (none when not
    given); unflattening sets the fields without calling ``__init__``. Without
    ``data_fields``, a dataclass's fields are split by :func:`static_field`.

    What ``jax.tree_util.register_dataclass`` does, with one difference that matters: the
    structure of a registered class compares equal only to the structure of the same class.
    jaxlib 0.10.2's dataclass nodes compare equal across classes with the same field layout
    (``Matern32()`` and ``Matern52()`` have "equal" structures, of different hashes), so a
    cache keyed by structure (a jitted function's, a traced jaxpr's) could hand one
    kernel's program to the other whenever a lookup met the other's entry: wrong values,
    now and then, as the memory layout of the process decided. A custom node's equality
    includes its type.

    Example:
        >>> import dataclasses
        >>> import jax
        >>> @dataclasses.dataclass(frozen=True)
        ... class A:
        ...     x: float
        >>> @dataclasses.dataclass(frozen=True)
        ... class B:
        ...     x: float
        >>> A, B = register_fields(A), register_fields(B)
        >>> jax.tree_util.tree_structure(A(1.0)) == jax.tree_util.tree_structure(B(1.0))
        False
    """
    if data_fields is None:
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        meta = tuple(f.name for f in fields if f.metadata.get("static", False))
        data = tuple(f.name for f in fields if not f.metadata.get("static", False))
    else:
        data, meta = tuple(data_fields), tuple(meta_fields or ())
    keys = tuple(jax.tree_util.GetAttrKey(name) for name in data)

    def flatten_with_keys(obj: Any) -> tuple[list[tuple[Any, Any]], tuple[Any, ...]]:
        return [(k, getattr(obj, n)) for k, n in zip(keys, data, strict=True)], tuple(
            getattr(obj, n) for n in meta
        )

    def flatten(obj: Any) -> tuple[list[Any], tuple[Any, ...]]:
        return [getattr(obj, n) for n in data], tuple(getattr(obj, n) for n in meta)

    def unflatten(aux: tuple[Any, ...], children: Any) -> Any:
        return _new(cls, (data, children), (meta, aux))

    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)
    return cls


@dataclass_transform(eq_default=False, frozen_default=True, field_specifiers=(dataclasses.field,))
def pytree_dataclass(cls: type[_T]) -> type[_T]:
    """Makes ``cls`` a frozen dataclass registered as a pytree (fields marked by
    :func:`static_field` are auxiliary data, the others are children;
    :func:`register_fields`)."""
    dc: Any = dataclasses.dataclass(frozen=True, eq=False)(cls)
    return register_fields(dc)


def as_param(value: Any, dtype: Any) -> jax.Array:
    """A parameter as an array of the computation's dtype."""
    return jax.numpy.asarray(value).astype(dtype)


def scalar_param(value: Any, dtype: Any, name: str) -> jax.Array:
    """A parameter that is one number (shape ``()`` or ``(1,)``), as a 0-d array of the
    computation's dtype; any other shape is a ``ValueError`` naming ``name`` (a vector
    would broadcast against the columns of a block and give a wrong matrix)."""
    p = as_param(value, dtype)
    if p.shape not in ((), (1,)):
        raise ValueError(
            f"{name} must be a scalar (one number); got shape {tuple(p.shape)}. It is not "
            "a per-dimension parameter."
        )
    return p.reshape(())


def is_scalar(value: Any) -> bool:
    """True for a real number or a 0-d array (a bool, Python's or an array's, is not a
    scalar parameter)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, numbers.Real):
        return True
    return (
        isinstance(value, (np.ndarray, np.generic, jax.Array))
        and np.ndim(value) == 0
        and value.dtype != np.bool_
    )


class AttrPytree:
    """``tree_flatten`` / ``tree_unflatten`` over the attributes that ``_CHILDREN`` (the
    leaves) and ``_AUX`` (static; ``None`` when empty) name, in that order. A subclass is
    registered with ``jax.tree_util.register_pytree_node_class``; unflattening sets the
    attributes without calling ``__init__``."""

    _CHILDREN: ClassVar[tuple[str, ...]] = ()
    _AUX: ClassVar[tuple[str, ...]] = ()

    def tree_flatten(self) -> tuple[tuple[Any, ...], tuple[Any, ...] | None]:
        aux = tuple(getattr(self, f) for f in self._AUX) if self._AUX else None
        return tuple(getattr(self, f) for f in self._CHILDREN), aux

    @classmethod
    def tree_unflatten(cls, aux: Any, children: Any) -> Self:
        return _new(cls, (cls._CHILDREN, children), (cls._AUX, aux or ()))
