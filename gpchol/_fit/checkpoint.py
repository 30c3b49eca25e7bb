"""Checkpoints of a fit: a manifest ``<base>.json`` naming a content-addressed ``.npz``.

A :class:`~gpchol._fit.state.FitState` on disk, committed in one atomic step:

1. the arrays go to ``<base>.<h>.npz``, ``h`` the first 16 hex digits of the file's
   SHA-256 (temporary file, ``fsync``, ``os.replace``, ``fsync`` of the directory);
2. the manifest ``<base>.json`` that names that file and its full SHA-256 is written the
   same way: its ``os.replace`` is the commit;
3. only then the previous arrays file (and any stale temporary file of this checkpoint)
   is removed.

So at every instant ``<base>.json`` names a complete arrays file that is on disk: a crash,
``SIGKILL``, ``SIGINT`` or ``SIGTERM`` at any point leaves the previous checkpoint or the
new one, never a mix. One fit at a time uses a checkpoint path: :class:`CheckpointLock`
holds ``<base>.lock`` (an advisory ``flock``, POSIX) while it runs and refuses a second.

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
import re
import sys
import zipfile
from collections.abc import Callable
from types import TracebackType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gpchol._base.io import (
    TMP_PREFIX,
    file_sha256,
    fsync_dir,
    load_npz,
    npz_bytes,
    save_json_atomic,
    sha256_bytes,
    write_bytes_atomic,
)
from gpchol._fit.fingerprint import compare
from gpchol._fit.state import FitState, StartRecord

__all__ = [
    "FORMAT",
    "VERSION",
    "CheckpointError",
    "CheckpointLock",
    "arrays_files",
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

_HASH_CHARS = 16
_REMEDY = "Delete the checkpoint's files or pass resume=False to start over."


class CheckpointError(ValueError):
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


def _arrays_pattern(base: str) -> re.Pattern[str]:
    name = re.escape(os.path.basename(base))
    return re.compile(rf"{name}\.[0-9a-f]{{{_HASH_CHARS}}}\.npz")


def arrays_files(path: str | os.PathLike[str]) -> list[str]:
    """The arrays files (``<base>.<hash>.npz``) of the checkpoint at ``path`` on disk.

    Normally one, the file the manifest names; another is the new file of a commit that
    was cut short (removed by the next commit).

    Args:
        path: the base path (see :func:`manifest_path`).

    Returns:
        Their paths, sorted.
    """
    base = _base(path)
    directory = os.path.dirname(base) or "."
    pattern = _arrays_pattern(base)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(os.path.join(os.path.dirname(base), n) for n in names if pattern.fullmatch(n))


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


def _sweep(base: str, keep: str) -> None:
    """Removes this checkpoint's arrays files but ``keep`` and its stale temporary files."""
    directory = os.path.dirname(base) or "."
    name = os.path.basename(base)
    arrays = _arrays_pattern(base)
    tmp = re.compile(
        re.escape(TMP_PREFIX)
        + r"[a-z0-9_]{8}"  # tempfile.mkstemp's random part
        + re.escape(name)
        + rf"(\.json|\.[0-9a-f]{{{_HASH_CHARS}}}\.npz)"
    )
    removed = False
    for n in os.listdir(directory):
        if n != os.path.basename(keep) and (arrays.fullmatch(n) or tmp.fullmatch(n)):
            try:
                os.unlink(os.path.join(directory, n))
                removed = True
            except OSError:
                pass
    if removed:
        fsync_dir(directory)


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
    data = npz_bytes(arrays)
    digest = sha256_bytes(data)
    npz_name = f"{os.path.basename(base)}.{digest[:_HASH_CHARS]}.npz"
    npz_path = os.path.join(os.path.dirname(base), npz_name)
    write_bytes_atomic(npz_path, data)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "arrays": npz_name,
        "arrays_sha256": digest,
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
    save_json_atomic(base + ".json", manifest)  # the commit
    _sweep(base, keep=npz_path)
    return npz_name


def _read_manifest(json_path: str) -> dict[str, Any]:
    try:
        with open(json_path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise CheckpointError(json_path, f"cannot be read ({e.strerror or e}).") from None
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(
            json_path,
            f"is damaged: not valid JSON ({e}; {len(raw)} bytes, truncated or overwritten?). "
            + _REMEDY,
        ) from None
    if not isinstance(meta, dict) or (meta.get("format") != FORMAT and "npz_sha256" not in meta):
        raise CheckpointError(json_path, "is not a gpchol fit checkpoint. " + _REMEDY)
    version = meta.get("version")
    if version != VERSION:
        if version == 1:
            problem = (
                "was written by an earlier gpchol (format version 1, with no fingerprint "
                "to prove it belongs to this fit), so it cannot be resumed. Delete it and "
                f"{_base(json_path)}.npz, or pass resume=False to start over."
            )
        else:
            problem = (
                f"has format version {version!r}; this gpchol reads version {VERSION} "
                "(written by a newer gpchol?). " + _REMEDY
            )
        raise CheckpointError(json_path, problem)
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
        if tuple(t.shape) != tuple(a.shape):
            raise CheckpointError(
                npz_path,
                f"does not match this fit: a {what} array has shape {a.shape}, expected "
                f"{tuple(t.shape)}. " + _REMEDY,
            )
        out.append(jnp.asarray(a, dtype=t.dtype))
    return jax.tree_util.tree_unflatten(treedef, out)


def _read_arrays(json_path: str, meta: dict[str, Any]) -> tuple[str, dict[str, np.ndarray]]:
    name, digest = meta.get("arrays"), meta.get("arrays_sha256")
    base = _base(json_path)
    if not isinstance(name, str) or not _arrays_pattern(base).fullmatch(name):
        raise CheckpointError(json_path, f"is damaged: it names no valid arrays file ({name!r}).")
    npz_path = os.path.join(os.path.dirname(base), name)
    if not os.path.exists(npz_path):
        raise CheckpointError(
            npz_path,
            f"is missing (named by {json_path}; deleted or moved?). " + _REMEDY,
        )
    if file_sha256(npz_path) != digest:
        raise CheckpointError(
            npz_path,
            f"is damaged: its SHA-256 does not match the one in {json_path} (truncated or "
            "overwritten?). " + _REMEDY,
        )
    try:
        return npz_path, load_npz(npz_path)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise CheckpointError(npz_path, f"cannot be read ({e}). " + _REMEDY) from None


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
    npz_path, arrays = _read_arrays(json_path, meta)
    try:
        st = meta["state"]
        n_u, n_s = int(st["n_param_leaves"]), int(st["n_state_leaves"])

        def tree(prefix: str, template: Any, n: int, what: str) -> Any:
            leaves = [arrays[f"{prefix}_{i}"] for i in range(n)]
            return _tree_from_arrays(template, leaves, what, npz_path)

        params = tree("u", params_like, n_u, "parameters")
        state = FitState(
            params=params,
            opt_state=tree("s", init_opt_state(params), n_s, "optimizer state"),
            key=arrays["rng_key"],
            restart=int(st["restart"]),
            step=int(st["step"]),
            history=[float(x) for x in arrays["history"]],
            stall=int(st["stall"]),
            done=bool(st["done"]),
            stopped=st["stopped"],
            message=str(st["message"]),
            restart_losses=[float(x) for x in st["restart_losses"]],
        )
        if st["has_last_good"]:
            state.last_good = tree("g", params_like, n_u, "parameters")
        if st["best"] is not None:
            best_history = [float(x) for x in arrays["best_history"]]
            state.best = StartRecord.from_meta(st["best"], best_history)
            state.best_params = tree("b", params_like, n_u, "parameters")
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(
            json_path, f"is damaged: a field or array is missing or malformed ({e!r}). " + _REMEDY
        ) from None
    _sweep(_base(json_path), keep=npz_path)  # what a commit cut short (SIGKILL) left
    return state
