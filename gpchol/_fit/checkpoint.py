"""Checkpoints of a fit: its state as ``<path>.json`` (metadata) + ``<path>.npz`` (arrays).

A :class:`~gpchol._fit.state.FitState` on disk, in the format every version so far wrote.

The JSON file holds the metadata (counters, how the start is stopping, the best start so
far, the optimiser's name, the format version and the SHA-256 of the arrays file); the
``.npz`` file holds the arrays, read back with ``allow_pickle=False``: ``history``,
``rng_key``, the parameters ``u_0 ...``, the optimiser state ``s_0 ...``, the last good
parameters ``g_0 ...`` (when any), the best start's parameters ``b_0 ...`` and its
``best_history`` (when any). Each file is written atomically (:mod:`gpchol._base.io`);
the arrays first, so the JSON file never points at arrays that are not on disk. Reading
checks the version, the optimiser, the hash and every array's shape against this fit.

Example:
    >>> import os, tempfile, jax.numpy as jnp, numpy as np
    >>> from gpchol._fit.checkpoint import load_checkpoint, save_checkpoint
    >>> from gpchol._fit.state import FitState
    >>> path = os.path.join(tempfile.mkdtemp(), "ck")
    >>> st = FitState(params=jnp.ones(2), opt_state=(jnp.zeros(2),), key=np.zeros(2, np.uint32))
    >>> save_checkpoint(path, st, optimizer="adam", steps=10, restarts=0)
    >>> sorted(os.listdir(os.path.dirname(path)))
    ['ck.json', 'ck.npz']
    >>> back = load_checkpoint(path, optimizer="adam", params_like=jnp.zeros(2),
    ...                        init_opt_state=lambda u: (jnp.zeros(2),))
    >>> back.params.tolist(), back.step
    ([1.0, 1.0], 0)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gpchol._base.io import file_sha256, load_json, load_npz, save_json_atomic, save_npz_atomic
from gpchol._fit.state import FitState, StartRecord

__all__ = ["VERSION", "checkpoint_exists", "checkpoint_paths", "load_checkpoint", "save_checkpoint"]

VERSION = 1
"""The checkpoint format version (written as ``version`` in the JSON file)."""


def checkpoint_paths(path: str | os.PathLike[str]) -> tuple[str, str]:
    """The two files of a checkpoint: ``(<base>.json, <base>.npz)``.

    Args:
        path: the base path, with or without a ``.json``/``.npz`` extension.

    Returns:
        ``(json_path, npz_path)``.

    Example:
        >>> from gpchol._fit.checkpoint import checkpoint_paths
        >>> checkpoint_paths("run/ck.npz")
        ('run/ck.json', 'run/ck.npz')
    """
    base = os.fspath(path)
    for ext in (".json", ".npz"):
        if base.endswith(ext):
            base = base[: -len(ext)]
    return base + ".json", base + ".npz"


def checkpoint_exists(path: str | os.PathLike[str]) -> bool:
    """Whether the checkpoint's metadata file exists (a fit with ``resume=True`` reads it)."""
    return os.path.exists(checkpoint_paths(path)[0])


def _numbered(prefix: str, tree: Any) -> dict[str, np.ndarray]:
    """``{prefix_0: leaf 0, prefix_1: leaf 1, ...}`` as NumPy arrays."""
    leaves = jax.tree_util.tree_leaves(tree)
    return {f"{prefix}_{i}": np.asarray(x) for i, x in enumerate(leaves)}


def save_checkpoint(
    path: str | os.PathLike[str],
    state: FitState,
    *,
    optimizer: str,
    steps: int,
    restarts: int,
) -> None:
    """Writes ``state`` to the checkpoint at ``path`` (arrays, then metadata; each atomic).

    Args:
        path: the base path (see :func:`checkpoint_paths`).
        state: the fit's state.
        optimizer: the optimiser's name (a resume with another optimiser is refused).
        steps: the fit's ``steps`` argument (recorded for the reader's information).
        restarts: the fit's ``restarts`` argument (recorded likewise).
    """
    json_path, npz_path = checkpoint_paths(path)
    arrays = {"history": np.asarray(state.history, np.float64), "rng_key": state.key}
    arrays.update(_numbered("u", state.params))
    state_arrays = _numbered("s", state.opt_state)
    arrays.update(state_arrays)
    if state.last_good is not None:
        arrays.update(_numbered("g", state.last_good))
    if state.best is not None:
        arrays.update(_numbered("b", state.best_params))
        arrays["best_history"] = np.asarray(state.best.history, np.float64)
    digest = save_npz_atomic(npz_path, arrays)
    meta = {
        "restart": state.restart,
        "step": state.step,
        "stall": state.stall,
        "done": state.done,
        "stopped": state.stopped,
        "message": state.message,
        "restart_losses": state.restart_losses,
        "version": VERSION,
        "optimizer": optimizer,
        "npz_sha256": digest,
        "n_param_leaves": len(jax.tree_util.tree_leaves(state.params)),
        "n_state_leaves": len(state_arrays),
        "has_last_good": state.last_good is not None,
        "best": None if state.best is None else state.best.meta(),
        "steps": int(steps),
        "restarts": int(restarts),
    }
    save_json_atomic(json_path, meta)


def _tree_from_arrays(template: Any, arrays: list[np.ndarray], what: str) -> Any:
    """``template``'s pytree with ``arrays`` as leaves (its dtypes); checks count and shapes."""
    t_leaves, treedef = jax.tree_util.tree_flatten(template)
    if len(t_leaves) != len(arrays):
        raise ValueError(
            f"checkpoint does not match this fit: its {what} has {len(arrays)} arrays, this "
            f"fit's has {len(t_leaves)}. Delete the checkpoint or pass resume=False."
        )
    out = []
    for t, a in zip(t_leaves, arrays, strict=True):
        t = jnp.asarray(t)
        if tuple(t.shape) != tuple(a.shape):
            raise ValueError(
                f"checkpoint does not match this fit: a {what} array has shape {a.shape}, "
                f"expected {tuple(t.shape)}. Delete the checkpoint or pass resume=False."
            )
        out.append(jnp.asarray(a, dtype=t.dtype))
    return jax.tree_util.tree_unflatten(treedef, out)


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    optimizer: str,
    params_like: Any,
    init_opt_state: Callable[[Any], Any],
) -> FitState:
    """Reads the checkpoint at ``path`` back into a :class:`~gpchol._fit.state.FitState`.

    Args:
        path: the base path (see :func:`checkpoint_paths`).
        optimizer: this fit's optimiser name; must be the one that wrote the checkpoint.
        params_like: a pytree like this fit's unconstrained parameters (structure, shapes
            and dtypes of the parameters read back).
        init_opt_state: the optimiser's ``init`` (gives the optimiser state's structure).

    Returns:
        The state as it was written.

    Raises:
        ValueError: the checkpoint is of another version or optimiser, its arrays file is
            missing or does not match its hash, or its arrays do not fit ``params_like``.
    """
    json_path, npz_path = checkpoint_paths(path)
    meta = load_json(json_path)
    if meta.get("version") != VERSION or meta.get("optimizer") != optimizer:
        raise ValueError(
            f"checkpoint {json_path} was written by a different fit (optimizer "
            f"{meta.get('optimizer')!r}, version {meta.get('version')}); delete it or pass "
            "resume=False."
        )
    if not os.path.exists(npz_path) or file_sha256(npz_path) != meta.get("npz_sha256"):
        raise ValueError(
            f"checkpoint arrays {npz_path} are missing or do not match {json_path} "
            "(an interrupted write of an old version?); delete both or pass resume=False."
        )
    arrays = load_npz(npz_path)
    n_u, n_s = meta["n_param_leaves"], meta["n_state_leaves"]

    def tree(prefix: str, template: Any, n: int, what: str) -> Any:
        return _tree_from_arrays(template, [arrays[f"{prefix}_{i}"] for i in range(n)], what)

    params = tree("u", params_like, n_u, "parameters")
    state = FitState(
        params=params,
        opt_state=tree("s", init_opt_state(params), n_s, "optimizer state"),
        key=arrays["rng_key"],
        restart=meta.get("restart", 0),
        step=meta.get("step", 0),
        history=[float(x) for x in arrays["history"]],
        stall=meta.get("stall", 0),
        done=meta.get("done", False),
        stopped=meta.get("stopped"),
        message=meta.get("message", ""),
        restart_losses=list(meta.get("restart_losses", [])),
    )
    if meta.get("has_last_good"):
        state.last_good = tree("g", params_like, n_u, "parameters")
    if meta.get("best") is not None:
        best_history = [float(x) for x in arrays["best_history"]]
        state.best = StartRecord.from_meta(meta["best"], best_history)
        state.best_params = tree("b", params_like, n_u, "parameters")
    return state
