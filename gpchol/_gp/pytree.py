"""Pytrees over named attributes: the protocol of the model and posterior classes."""

from __future__ import annotations

from typing import Any, ClassVar, Self

__all__ = ["AttrPytree"]


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
