"""The fingerprint of a fit: what a checkpoint must match to be resumed by it.

A checkpoint stores the fingerprint of the fit that wrote it; a resume compares it with
its own and refuses on any difference, naming each one (so the state of one model, data
set or optimiser is never continued, or returned, as another's). The fingerprint is a
dict of short, human-readable strings, one per component:

* ``parameters``: the parameter pytree (structure, e.g. dict keys and kernel types) and
  each leaf's dtype and shape;
* ``initial values``: the SHA-256 of the initial (unconstrained) parameter values;
* ``transforms``: the transforms of the parameters;
* ``optimizer``: the optimiser's name, learning rate and the structure of its state;
* ``stopping``: ``steps``, ``tol`` and ``patience``;
* ``restarts``: ``restarts``, ``restart_scale`` and the random key;
* ``y``: the observations' dtype, shape and SHA-256 (GP fits);
* ``model``: for GP fits, the model built at the initial parameters (its pytree
  structure, e.g. the kernel and mean types and the jitter, and the dtype, shape and
  SHA-256 of its arrays: inputs ``X``, noise, mean, ...);
* ``loss data``: for a plain loss (or a model that is not a pytree of arrays), the
  dtype, shape and SHA-256 of the arrays the loss closes over (the constants of its
  traced computation; Python scalars written into the code are not among them);
* ``user``: the SHA-256 of the ``fingerprint`` argument of :func:`gpchol.fit`, when given.

Example:
    >>> import jax.numpy as jnp
    >>> from gpchol._fit.fingerprint import compare, tree_digest
    >>> tree_digest({"a": jnp.ones(2)}) == tree_digest({"a": jnp.ones(2)})
    True
    >>> compare({"y": "shape (3,)"}, {"y": "shape (4,)"})
    ['y: checkpoint shape (3,), this fit shape (4,)']
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from gpchol._base.transforms import Transform

__all__ = ["compare", "describe_structure", "describe_tree", "fit_fingerprint", "tree_digest"]

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _clean(text: str) -> str:
    """``text`` without memory addresses (``<function f at 0x7f...>``: differ run to run)."""
    return _ADDRESS.sub("", text)


def _leaf_array(x: Any) -> np.ndarray | None:
    """A leaf as a NumPy array, or ``None`` when it is not array-like."""
    if isinstance(x, (str, bytes)) or x is None:
        return None
    try:
        dtype = getattr(x, "dtype", None)
        if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        a = np.asarray(x)
    except Exception:  # any object NumPy cannot convert
        return None
    return None if a.dtype == object else a


def tree_digest(tree: Any) -> str:
    """The hex SHA-256 of a pytree's structure and leaves (dtype, shape and bytes of each).

    Args:
        tree: a pytree; leaves that are not arrays enter by their type and ``repr``.

    Returns:
        64 hex digits.

    Example:
        >>> import numpy as np
        >>> from gpchol._fit.fingerprint import tree_digest
        >>> tree_digest([np.zeros(2)]) != tree_digest([np.zeros(3)])
        True
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    h = hashlib.sha256(_clean(str(treedef)).encode())
    for x in leaves:
        a = _leaf_array(x)
        if a is None:
            h.update(f"|{type(x).__name__}:{_clean(repr(x))}".encode())
        else:
            h.update(f"|{a.dtype.str}{a.shape}:".encode())
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _shapes(leaves: list[Any]) -> str:
    out = []
    for x in leaves:
        a = _leaf_array(x)
        out.append(type(x).__name__ if a is None else f"{a.dtype}{list(a.shape)}")
    return "[" + ", ".join(out) + "]"


def describe_structure(tree: Any) -> str:
    """A pytree's structure alone (its node types and keys), as one line.

    Args:
        tree: a pytree.

    Returns:
        E.g. ``"PyTreeDef({'s': *})"``.

    Example:
        >>> import numpy as np
        >>> from gpchol._fit.fingerprint import describe_structure
        >>> describe_structure({"s": np.zeros(2)})
        "PyTreeDef({'s': *})"
    """
    return _clean(str(jax.tree_util.tree_structure(tree)))


def describe_tree(tree: Any) -> str:
    """A pytree's structure and the dtype and shape of each leaf, as one line.

    Args:
        tree: a pytree.

    Returns:
        E.g. ``"PyTreeDef({'s': *}) leaves [float64[]]"``.

    Example:
        >>> import numpy as np
        >>> from gpchol._fit.fingerprint import describe_tree
        >>> describe_tree({"s": np.zeros(2)})
        "PyTreeDef({'s': *}) leaves [float64[2]]"
    """
    return f"{describe_structure(tree)} leaves {_shapes(jax.tree_util.tree_leaves(tree))}"


def _arrays_summary(arrays: list[Any]) -> str:
    """Dtypes and shapes of ``arrays`` and the SHA-256 of all of them."""
    return f"{_shapes(arrays)} sha256 {tree_digest(list(arrays))[:16]}"


def _transforms(transforms: Any) -> str:
    leaves, treedef = jax.tree_util.tree_flatten(
        transforms, is_leaf=lambda x: x is None or isinstance(x, Transform)
    )
    return f"{_clean(str(treedef))} [{', '.join(_clean(repr(t)) for t in leaves)}]"


def _model(build: Callable[[Any], Any], params: Any) -> str | None:
    """The model built at ``params``: its pytree structure and the digest of its leaves.

    ``None`` when it cannot be built outside ``jit`` or holds no array as a pytree leaf
    (a model class that is not a pytree): then the loss's constants stand in for it.
    """
    try:
        model = build(params)
    except Exception:  # the step traces it anyway; its error is the one to show
        return None
    leaves, treedef = jax.tree_util.tree_flatten(model)
    if all(_leaf_array(x) is None for x in leaves):
        return None
    return f"{_clean(str(treedef))} {_arrays_summary(leaves)}"


def _loss_data(loss_u: Callable[[Any], Any], u0: Any) -> str:
    """The arrays a loss closes over: the constants of its traced computation."""
    try:
        consts = jax.make_jaxpr(loss_u)(u0).consts
    except Exception as e:  # the step traces it anyway; its error is the one to show
        return f"not traced ({type(e).__name__})"
    arrays = [a for a in (_leaf_array(c) for c in consts) if a is not None]
    return _arrays_summary(arrays)


def fit_fingerprint(
    *,
    build_or_loss: Callable[[Any], Any],
    params: Any,
    y: Any,
    u0: Any,
    loss_u: Callable[[Any], Any],
    transforms: Any,
    optimizer: str,
    learning_rate: float | None,
    opt_state: Any,
    steps: int,
    tol: float,
    patience: int,
    restarts: int,
    restart_scale: float,
    key: np.ndarray,
    user: Any = None,
) -> dict[str, str]:
    """The fingerprint of a fit (see the module's documentation for the components).

    Args:
        build_or_loss: :func:`gpchol.fit`'s first argument.
        params: the initial parameters (constrained space).
        y: the observations, or ``None`` for a plain loss.
        u0: the initial parameters (unconstrained space).
        loss_u: the loss as a function of the unconstrained parameters.
        transforms: the parameters' transforms.
        optimizer: the optimiser's name.
        learning_rate: :func:`gpchol.fit`'s ``learning_rate``.
        opt_state: the optimiser's initial state.
        steps: see :func:`gpchol.fit`.
        tol: see :func:`gpchol.fit`.
        patience: see :func:`gpchol.fit`.
        restarts: see :func:`gpchol.fit`.
        restart_scale: see :func:`gpchol.fit`.
        key: the raw data of the restarts' random key.
        user: :func:`gpchol.fit`'s ``fingerprint`` (anything identifying the data of a
            plain loss), or ``None``.

    Returns:
        ``{component: description}``, JSON-ready.

    Example:
        >>> import numpy as np, jax.numpy as jnp
        >>> from gpchol._fit.fingerprint import fit_fingerprint
        >>> fp = fit_fingerprint(
        ...     build_or_loss=None, params=1.0, y=None, u0=jnp.asarray(1.0),
        ...     loss_u=lambda u: (u - 2.0) ** 2, transforms=None, optimizer="adam",
        ...     learning_rate=0.1, opt_state=(), steps=10, tol=0.0, patience=3,
        ...     restarts=0, restart_scale=1.0, key=np.zeros(2, np.uint32))
        >>> fp["stopping"]
        'steps=10, tol=0.0, patience=3'
    """
    fp = {
        "parameters": describe_tree(params),
        "initial values": tree_digest(u0)[:16],
        "transforms": _transforms(transforms),
        "optimizer": f"{optimizer}, learning_rate={learning_rate!r}, state "
        + describe_tree(opt_state),
        "stopping": f"steps={int(steps)}, tol={float(tol)!r}, patience={int(patience)}",
        "restarts": f"restarts={int(restarts)}, restart_scale={float(restart_scale)!r}, "
        f"key {np.asarray(key).tolist()}",
    }
    model = None if y is None else _model(build_or_loss, params)
    if y is not None:
        fp["y"] = _arrays_summary([y])
    if model is not None:
        fp["model"] = model
    else:
        fp["loss data"] = _loss_data(loss_u, u0)
    if user is not None:
        fp["user"] = tree_digest(user)[:16]
    return fp


def compare(saved: Any, current: dict[str, str]) -> list[str]:
    """The components on which a checkpoint's fingerprint and this fit's differ.

    Args:
        saved: the fingerprint read from the checkpoint.
        current: this fit's.

    Returns:
        One ``"component: checkpoint ..., this fit ..."`` line per difference (empty when
        they match).

    Example:
        >>> from gpchol._fit.fingerprint import compare
        >>> compare({"a": "1", "b": "2"}, {"a": "1", "b": "2"})
        []
    """
    if not isinstance(saved, dict):
        return [f"fingerprint: checkpoint {saved!r}, this fit a fingerprint"]

    def short(text: Any) -> str:
        text = "(none)" if text is None else str(text)
        return text if len(text) <= 160 else text[:157] + "..."

    out = []
    for name in list(current) + [k for k in saved if k not in current]:
        if saved.get(name) != current.get(name):
            out.append(
                f"{name}: checkpoint {short(saved.get(name))}, this fit {short(current.get(name))}"
            )
    return out
