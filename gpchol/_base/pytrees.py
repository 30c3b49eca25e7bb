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
from typing import Any, ClassVar, Self, TypeVar, dataclass_transform

import jax
import numpy as np

__all__ = ["AttrPytree", "as_param", "is_scalar", "pytree_dataclass", "static_field"]

_T = TypeVar("_T")


def static_field(default: Any = None) -> Any:
    """A dataclass field stored as static pytree metadata (not a leaf)."""
    return dataclasses.field(default=default, metadata={"static": True})


@dataclass_transform(eq_default=False, frozen_default=True, field_specifiers=(dataclasses.field,))
def pytree_dataclass(cls: type[_T]) -> type[_T]:
    """Makes ``cls`` a frozen dataclass registered as a pytree (fields marked by
    :func:`static_field` are auxiliary data, the others are children)."""
    dc: Any = dataclasses.dataclass(frozen=True, eq=False)(cls)
    fields = dataclasses.fields(dc)
    meta = [f.name for f in fields if f.metadata.get("static", False)]
    data = [f.name for f in fields if not f.metadata.get("static", False)]
    return jax.tree_util.register_dataclass(dc, data_fields=data, meta_fields=meta)


def as_param(value: Any, dtype: Any) -> jax.Array:
    """A parameter as an array of the computation's dtype."""
    return jax.numpy.asarray(value).astype(dtype)


def is_scalar(value: Any) -> bool:
    """True for a real number or a 0-d array (a bool is not a scalar parameter)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, numbers.Real):
        return True
    return isinstance(value, (np.ndarray, np.generic, jax.Array)) and np.ndim(value) == 0


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
        obj = object.__new__(cls)
        for names, values in ((cls._CHILDREN, children), (cls._AUX, aux or ())):
            for f, v in zip(names, values, strict=True):
                setattr(obj, f, v)
        return obj
