"""Checkpoints of a fit: a manifest ``<base>.json`` naming a content-addressed ``.npz``.

A :class:`~gpchol._fit.state.FitState` on disk, committed in one atomic step by the one
file protocol (:mod:`gpchol._base.store`): the arrays file ``<base>.<h>.npz`` (``h``: 16
hex digits of its SHA-256), then the manifest ``<base>.json`` naming it (its
``os.replace`` is the commit), then every other arrays file and stale temporary file of
this checkpoint is removed. So ``<base>.json`` always names a complete arrays file on
disk: a crash, ``SIGKILL``, ``SIGINT`` or ``SIGTERM`` at any point leaves the previous
checkpoint or the new one, never a mix. One fit at a time uses a checkpoint path:
:class:`CheckpointLock` holds ``<base>.lock`` (an advisory ``flock``, POSIX) while it runs
and refuses a second.

The manifest holds the format name and version, the arrays file and its hash, the
fingerprint of the fit that wrote it (:mod:`gpchol._fit.fingerprint`) and the metadata of
the state (counters, how the start is stopping, the best start so far). The ``.npz`` file
holds the arrays, read back with ``allow_pickle=False``: ``history``, ``rng_key``, the
parameters ``u_0 ...``, the optimiser state ``s_0 ...``, the last good parameters
``g_0 ...`` (when any), the best start's parameters ``b_0 ...`` and its ``best_history``
(when any). Reading checks the format, the version, the fingerprint, the hash and every
array's shape, and raises :class:`CheckpointError` naming the file at fault and what is
wrong with it.

Example:
    >>> import os, tempfile, jax.numpy as jnp, numpy as np
    >>> from gpchol._fit.checkpoint import load_checkpoint, save_checkpoint
    >>> from gpchol._fit.state import FitState
    >>> path = os.path.join(tempfile.mkdtemp(), "ck")
    >>> st = FitState(params=jnp.ones(2), opt_state=(jnp.zeros(2),), key=np.zeros(2, np.uint32))
    >>> name = save_checkpoint(path, st, fingerprint={"model": "m"}, optimizer="adam")
    >>> sorted(os.listdir(os.path.dirname(path))) == sorted(["ck.json", name])
    True
    >>> back = load_checkpoint(path, fingerprint={"model": "m"}, params_like=jnp.zeros(2),
    ...                        init_opt_state=lambda u: (jnp.zeros(2),))
    >>> back.params.tolist(), back.step
    ([1.0, 1.0], 0)
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gpchol._base.errors import PicklableError
from gpchol._base.store import FileKind, commit, remove_files, stale_files, write_arrays
from gpchol._fit.fingerprint import compare
from gpchol._fit.state import FitState, StartRecord

__all__ = [
    "FORMAT",
    "VERSION",
    "CheckpointError",
    "CheckpointLock",
    "checkpoint_exists",
    "load_checkpoint",
    "manifest_path",
    "save_checkpoint",
]

FORMAT = "gpchol fit checkpoint"
"""The ``format`` field of a manifest."""

VERSION = 2
"""The checkpoint format version (``version`` in the manifest; 1: the unfingerprinted
``<base>.json`` + ``<base>.npz`` pair of earlier releases, refused on resume)."""

_REMEDY = "Delete the checkpoint's files or pass resume=False to start over."


class CheckpointError(PicklableError, ValueError):
    """A checkpoint that cannot be resumed: another fit's, damaged, or of another format.

    A subclass of :class:`ValueError`. The message names the file at fault and what is
    wrong (for a checkpoint of another fit: each component of the fingerprint that
    differs), and how to start over.

    Attributes:
        path: the file at fault (the manifest or its arrays file).
        differences: for a checkpoint of another fit, one line per differing component of
            the fingerprint; else empty.

    Example:
        >>> from gpchol._fit.checkpoint import CheckpointError
        >>> e = CheckpointError("ck.json", "is damaged")
        >>> str(e), isinstance(e, ValueError)
        ('checkpoint ck.json is damaged', True)
    """

    def __init__(self, path: str, problem: str, differences: list[str] | None = None) -> None:
        super().__init__(f"checkpoint {path} {problem}")
        self.path = path
        self.differences = list(differences or [])


_NOT_JSON = "is damaged: not valid JSON ({error}; {size} bytes, truncated or overwritten?). "
_FILES = FileKind(
    FORMAT,
    VERSION,
    {
        "unreadable": "cannot be read ({strerror}).",
        "not-utf8": _NOT_JSON + _REMEDY,
        "not-json": _NOT_JSON + _REMEDY,
        "format": "is not a gpchol fit checkpoint. " + _REMEDY,
        "version-type": "has format version {version!r}; this gpchol reads version {newest} "
        "(written by a newer gpchol?). " + _REMEDY,
        "version-older": "was written by an earlier gpchol (format version 1, with no "
        "fingerprint to prove it belongs to this fit), so it cannot be resumed. Delete it and "
        "{stem}.npz, or pass resume=False to start over.",
        "arrays-name": "is damaged: it names no valid arrays file ({name!r}).",
        "arrays-missing": "is missing (named by {path}; deleted or moved?). " + _REMEDY,
        "arrays-hash": "is damaged: its SHA-256 does not match the one in {path} (truncated or "
        "overwritten?). " + _REMEDY,
        "arrays-unreadable": "cannot be read ({error}). " + _REMEDY,
    },
    CheckpointError,
    version_key="version",
    oldest=VERSION,
)
"""How a resume words the problems of the protocol's part of a checkpoint."""


def _base(path: str | os.PathLike[str]) -> str:
    base = os.fspath(path)
    for ext in (".json", ".npz"):
        if base.endswith(ext):
            return base[: -len(ext)]
    return base


def manifest_path(path: str | os.PathLike[str]) -> str:
    """The manifest of the checkpoint at ``path``: ``<base>.json``.

    Args:
        path: the base path, with or without a ``.json``/``.npz`` extension.

    Returns:
        The manifest's path.

    Example:
        >>> from gpchol._fit.checkpoint import manifest_path
        >>> manifest_path("run/ck.npz"), manifest_path("run/ck")
        ('run/ck.json', 'run/ck.json')
    """
    return _base(path) + ".json"


def checkpoint_exists(path: str | os.PathLike[str]) -> bool:
    """Whether the checkpoint's manifest exists (a fit with ``resume=True`` reads it).

    Example:
        >>> from gpchol._fit.checkpoint import checkpoint_exists
        >>> checkpoint_exists("/nonexistent/ck")
        False
    """
    return os.path.exists(manifest_path(path))


class CheckpointLock:
    """``<base>.lock``, held (``flock``) by the one fit that uses a checkpoint path.

    A context manager: entering creates and locks the file, or raises
    :class:`CheckpointError` when another fit (in this process or another) holds it;
    leaving removes it. Where ``fcntl`` is missing (Windows) it does nothing. A lock left
    by a killed process is free again (the kernel drops it), so nothing is to be cleaned.

    Args:
        path: the checkpoint's base path (see :func:`manifest_path`).

    Example:
        >>> import os, tempfile
        >>> from gpchol._fit.checkpoint import CheckpointError, CheckpointLock
        >>> base = os.path.join(tempfile.mkdtemp(), "ck")
        >>> with CheckpointLock(base):
        ...     try:
        ...         CheckpointLock(base).__enter__()
        ...     except CheckpointError as e:
        ...         print("refused:", "another fit" in str(e))
        refused: True
        >>> os.path.exists(base + ".lock")
        False
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = _base(path) + ".lock"
        self._fd: int | None = None

    def __enter__(self) -> CheckpointLock:
        if sys.platform == "win32":
            return self
        import fcntl

        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as e:
                raise CheckpointError(
                    self.path, f"cannot be created ({e.strerror or e}): is the directory writable?"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise CheckpointError(
                    self.path,
                    "is held by another fit that is running on this checkpoint (one fit per "
                    "checkpoint path at a time): wait for it to end, or use another path.",
                ) from None
            try:  # the file may have been removed and made anew between open and flock
                st, now = os.fstat(fd), os.stat(self.path)
                same = (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)
            except OSError:
                same = False
            if same:
                self._fd = fd
                return self
            os.close(fd)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)  # while still locked: a waiter re-checks the inode
        except OSError:
            pass
        os.close(self._fd)  # releases the lock
        self._fd = None


def _numbered(prefix: str, tree: Any) -> dict[str, np.ndarray]:
    """``{prefix_0: leaf 0, prefix_1: leaf 1, ...}`` as NumPy arrays."""
    leaves = jax.tree_util.tree_leaves(tree)
    return {f"{prefix}_{i}": np.asarray(x) for i, x in enumerate(leaves)}


def save_checkpoint(
    path: str | os.PathLike[str],
    state: FitState,
    *,
    fingerprint: dict[str, str],
    optimizer: str,
) -> str:
    """Commits ``state`` as the checkpoint at ``path`` (arrays file, then the manifest).

    The previous checkpoint stays complete until the manifest's ``os.replace``; its arrays
    file (and any stale temporary file of this checkpoint) is removed after it.

    Args:
        path: the base path (see :func:`manifest_path`).
        state: the fit's state.
        fingerprint: the fit's fingerprint (a resume by another fit is refused).
        optimizer: the optimiser's name (for the reader's information; it is also part of
            the fingerprint).

    Returns:
        The arrays file's name (``<base>.<hash>.npz``, without the directory).
    """
    base = _base(path)
    arrays = {"history": np.asarray(state.history, np.float64), "rng_key": state.key}
    arrays.update(_numbered("u", state.params))
    state_arrays = _numbered("s", state.opt_state)
    arrays.update(state_arrays)
    if state.last_good is not None:
        arrays.update(_numbered("g", state.last_good))
    if state.best is not None:
        arrays.update(_numbered("b", state.best_params))
        arrays["best_history"] = np.asarray(state.best.history, np.float64)
    # the optimiser states a result hands to a later warm start (same layout as "s")
    if state.best_opt_state is not None:
        arrays.update(_numbered("o", state.best_opt_state))
    if state.last_pairs is not None:
        arrays.update(_numbered("p", state.last_pairs))
    json_path = base + ".json"
    f = write_arrays(json_path, arrays)
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "arrays": f.name,
        "arrays_sha256": f.sha256,
        "optimizer": optimizer,
        "fingerprint": fingerprint,
        "state": {
            "restart": state.restart,
            "step": state.step,
            "stall": state.stall,
            "done": state.done,
            "stopped": state.stopped,
            "message": state.message,
            "restart_losses": state.restart_losses,
            "n_param_leaves": len(jax.tree_util.tree_leaves(state.params)),
            "n_state_leaves": len(state_arrays),
            "has_last_good": state.last_good is not None,
            "best": None if state.best is None else state.best.meta(),
        },
    }
    # optional entries (a reader that predates them resumes without them)
    for name, tree in (("best_opt_state", state.best_opt_state), ("last_pairs", state.last_pairs)):
        if tree is not None:
            manifest["state"][f"has_{name}"] = True
    text = json.dumps(manifest, indent=2) + "\n"
    commit(json_path, text, keep=f.name, remove=stale_files(json_path))  # the commit
    return f.name


def _read_manifest(json_path: str) -> dict[str, Any]:
    meta = _FILES.read(json_path)
    # the first format (version 1) had no 'format' field; its 'npz_sha256' marks it
    first = isinstance(meta, dict) and meta.get("format") != FORMAT and "npz_sha256" in meta
    _FILES.check({**meta, "format": FORMAT} if first else meta, json_path)
    return meta


def _tree_from_arrays(template: Any, arrays: list[np.ndarray], what: str, npz_path: str) -> Any:
    """``template``'s pytree with ``arrays`` as leaves (its dtypes); checks count and shapes."""
    t_leaves, treedef = jax.tree_util.tree_flatten(template)
    if len(t_leaves) != len(arrays):
        raise CheckpointError(
            npz_path,
            f"does not match this fit: its {what} has {len(arrays)} arrays, this fit's has "
            f"{len(t_leaves)}. " + _REMEDY,
        )
    out = []
    for t, a in zip(t_leaves, arrays, strict=True):
        t = jnp.asarray(t)
        if tuple(t.shape) != tuple(a.shape) or np.dtype(t.dtype) != a.dtype:
            raise CheckpointError(
                npz_path,
                f"does not match this fit: a {what} array is {a.dtype} of shape {a.shape}, "
                f"expected {np.dtype(t.dtype)} of shape {tuple(t.shape)}. " + _REMEDY,
            )
        out.append(jnp.asarray(a))
    return jax.tree_util.tree_unflatten(treedef, out)


def _check_fields(st: Any) -> None:
    """The manifest's state fields have their types (a hand edit such as ``"done":
    "false"`` is refused, not read as ``True``); a ``ValueError`` says which."""
    kinds: dict[str, type] = {
        "restart": int,
        "step": int,
        "stall": int,
        "done": bool,
        "message": str,
        "restart_losses": list,
        "n_param_leaves": int,
        "n_state_leaves": int,
        "has_last_good": bool,
    }
    for name, kind in kinds.items():
        v = st[name]
        negative = isinstance(v, int) and v < 0
        if not isinstance(v, kind) or (kind is int and (isinstance(v, bool) or negative)):
            raise ValueError(f"state field {name!r} is {v!r}, not a {kind.__name__}")
    if st["stopped"] is not None and not isinstance(st["stopped"], str):
        raise ValueError(f"state field 'stopped' is {st['stopped']!r}")
    losses = st["restart_losses"]
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in losses):
        raise ValueError("state field 'restart_losses' holds a value that is not a number")


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    fingerprint: dict[str, str],
    params_like: Any,
    init_opt_state: Callable[[Any], Any],
) -> FitState:
    """Reads the checkpoint at ``path`` back into a :class:`~gpchol._fit.state.FitState`.

    Args:
        path: the base path (see :func:`manifest_path`).
        fingerprint: this fit's fingerprint; must equal the one of the fit that wrote the
            checkpoint.
        params_like: a pytree like this fit's unconstrained parameters (structure, shapes
            and dtypes of the parameters read back).
        init_opt_state: the optimiser's ``init`` (gives the optimiser state's structure).

    Returns:
        The state as it was written.

    Raises:
        CheckpointError: (a :class:`ValueError`) the manifest is not valid JSON, not a
            checkpoint, of another version or written by another fit (the message lists
            each difference), or its arrays file is missing, damaged or does not fit
            ``params_like``. The message names the file.

    A checkpoint read back whole is then the only one of its base path: arrays files it
    does not name and stale temporary files of its base path are removed.
    """
    json_path = manifest_path(path)
    meta = _read_manifest(json_path)
    differences = compare(meta.get("fingerprint"), fingerprint)
    if differences:
        raise CheckpointError(
            json_path,
            "was written by a different fit, so resuming it would return that fit's "
            "state as this one's. It differs in: "
            + "; ".join(differences)
            + ". Delete it, use another checkpoint path, or pass resume=False.",
            differences,
        )
    npz_path, arrays = _FILES.read_arrays(json_path, meta.get("arrays"), meta.get("arrays_sha256"))
    try:
        st = meta["state"]
        _check_fields(st)
        n_u, n_s = st["n_param_leaves"], st["n_state_leaves"]

        def tree(prefix: str, template: Any, n: int, what: str) -> Any:
            leaves = [arrays[f"{prefix}_{i}"] for i in range(n)]
            return _tree_from_arrays(template, leaves, what, npz_path)

        key = arrays["rng_key"]
        if key.dtype != np.uint32 or key.ndim != 1:
            raise ValueError(f"rng_key is {key.dtype} of shape {key.shape}, not uint32 key data")
        params = tree("u", params_like, n_u, "parameters")
        state = FitState(
            params=params,
            opt_state=tree("s", init_opt_state(params), n_s, "optimizer state"),
            key=key,
            restart=st["restart"],
            step=st["step"],
            history=[float(x) for x in arrays["history"]],
            stall=st["stall"],
            done=st["done"],
            stopped=st["stopped"],
            message=st["message"],
            restart_losses=[float(x) for x in st["restart_losses"]],
        )
        if st["has_last_good"]:
            state.last_good = tree("g", params_like, n_u, "parameters")
        if st["best"] is not None:
            best_history = [float(x) for x in arrays["best_history"]]
            state.best = StartRecord.from_meta(st["best"], best_history)
            state.best_params = tree("b", params_like, n_u, "parameters")
        # absent from a checkpoint of an earlier gpchol: a warm start then gets a fresh state
        if st.get("has_best_opt_state"):
            state.best_opt_state = tree("o", state.opt_state, n_s, "optimizer state")
        if st.get("has_last_pairs"):
            state.last_pairs = tree("p", state.opt_state, n_s, "optimizer state")
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(
            json_path, f"is damaged: a field or array is missing or malformed ({e!r}). " + _REMEDY
        ) from None
    # what a commit cut short (SIGKILL) left
    remove_files(json_path, stale_files(json_path), keep=os.path.basename(npz_path))
    return state
