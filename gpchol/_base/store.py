"""The one file protocol: a JSON manifest naming a content-addressed NPZ file, no pickle.

Used by :func:`gpchol.save`, the checkpoints of :func:`gpchol.fit` and the command line's
model file, each with its own manifest fields, content checks and wording of errors.
Writing: the arrays go to ``<stem>.<h>.npz`` (``h``: 16 hex digits of its SHA-256) next to
the manifest ``<stem>.json`` (:func:`write_arrays`), then the manifest naming it replaces
the previous one, which is the commit, and only then are superseded arrays files removed
(:func:`commit`). Both writes are atomic (temporary file, ``fsync``, ``os.replace``,
``fsync`` of the directory): a reader sees the previous pair or the new one, and a write
cut short leaves the previous pair whole. Reading (:class:`FileKind`): the manifest's JSON,
format and version, its arrays file's name, SHA-256 and NPZ (``allow_pickle=False``) are
checked; each problem raises the user's error naming the file.

Example:
    >>> import os, tempfile, numpy as np
    >>> from gpchol._base.store import FileKind, commit, write_arrays
    >>> path = os.path.join(tempfile.mkdtemp(), "m.json")
    >>> f = write_arrays(path, {"x": np.arange(3.0)})
    >>> text = '{"format": "demo", "format_version": 1, "arrays": "%s"}' % f.name
    >>> commit(path, text, keep=f.name)
    >>> kind = FileKind("demo", 1, {"unreadable": "{path}: unreadable"}, ValueError)
    >>> doc = kind.read(path)
    >>> kind.check(doc, path)
    1
    >>> kind.read_arrays(path, doc["arrays"], f.sha256)[1]["x"].tolist()
    [0.0, 1.0, 2.0]
"""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import os
import platform
import re
import stat
import sys
import zipfile
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

import jax
import numpy as np

from gpchol._base.io import TMP_PREFIX, fsync_dir, npz_bytes, sha256_bytes, write_bytes_atomic

__all__ = [
    "HASH_CHARS",
    "ArraysFile",
    "FileKind",
    "commit",
    "named_arrays",
    "remove_files",
    "stale_files",
    "versions",
    "write_arrays",
]

HASH_CHARS = 16
"""Hex digits of the SHA-256 in an arrays file's name."""


def versions() -> dict[str, str]:
    """The versions a saved file records: ``{"gpchol", "jax", "numpy", "python"}``."""
    pkg = sys.modules.get("gpchol")
    return {
        "gpchol": str(getattr(pkg, "__version__", "unknown")),
        "jax": jax.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


def _stem(json_path: str) -> str:
    """The manifest's path without ``.json``: what its arrays files are named after."""
    return json_path[: -len(".json")] if json_path.endswith(".json") else json_path


def _arrays_name(json_path: str) -> re.Pattern[str]:
    name = re.escape(os.path.basename(_stem(json_path)))
    return re.compile(rf"{name}\.[0-9a-f]{{{HASH_CHARS}}}\.npz")


@dataclasses.dataclass(frozen=True)
class ArraysFile:
    """An arrays file :func:`write_arrays` wrote: its name (no directory), SHA-256, size."""

    name: str
    sha256: str
    size: int


def write_arrays(json_path: str, arrays: Mapping[str, np.ndarray]) -> ArraysFile:
    """Writes ``arrays`` (numeric; an uncompressed NPZ) next to the manifest, atomically."""
    data = npz_bytes(dict(arrays))
    digest = sha256_bytes(data)
    name = f"{os.path.basename(_stem(json_path))}.{digest[:HASH_CHARS]}.npz"
    write_bytes_atomic(os.path.join(os.path.dirname(json_path), name), data)
    return ArraysFile(name, digest, len(data))


def named_arrays(json_path: str, *keys: str) -> str | None:
    """The arrays file the manifest names now (at ``doc[keys[0]]...``; else ``None``).

    Read before a :func:`commit`, it is the file the commit supersedes.
    """
    try:
        with open(json_path, "rb") as f:
            value = json.load(f)
        for key in keys:
            value = value[key]
    except Exception:
        return None
    return value if isinstance(value, str) and _arrays_name(json_path).fullmatch(value) else None


def stale_files(json_path: str) -> list[str]:
    """The manifest's arrays files and temporary files on disk (a ``SIGKILL`` leaves some).

    Only for a writer that holds the path alone (a lock): another writer's arrays file
    before its commit looks the same.
    """
    directory = os.path.dirname(json_path) or "."
    name = re.escape(os.path.basename(_stem(json_path)))
    tmp = re.compile(  # tempfile.mkstemp's random part: 8 of [a-z0-9_]
        re.escape(TMP_PREFIX) + rf"[a-z0-9_]{{8}}{name}(\.json|\.[0-9a-f]{{{HASH_CHARS}}}\.npz)"
    )
    arrays = _arrays_name(json_path)
    return [n for n in os.listdir(directory) if arrays.fullmatch(n) or tmp.fullmatch(n)]


def remove_files(json_path: str, names: Iterable[str | None], *, keep: str | None) -> None:
    """Removes ``names`` (in the manifest's directory) but ``keep``; flushes the directory."""
    directory = os.path.dirname(json_path) or "."
    removed = False
    for n in set(names) - {None, keep}:
        try:
            os.unlink(os.path.join(directory, str(n)))
            removed = True
        except OSError:
            pass
    if removed:
        fsync_dir(directory)


def commit(
    json_path: str, text: str, *, keep: str | None, remove: Iterable[str | None] = ()
) -> None:
    """Writes the manifest ``text`` atomically (the commit), then removes ``remove``.

    ``keep`` (the arrays file it names) is never removed; ``remove``: superseded arrays
    files (:func:`named_arrays`, or :func:`stale_files` under a lock).
    """
    write_bytes_atomic(json_path, text.encode("utf-8"))
    remove_files(json_path, remove, keep=keep)


# What a problem's message falls back to when a kind of file words it like another.
_FALLBACK = {
    "missing": "unreadable",
    "directory": "unreadable",
    "not-utf8": "unreadable",
    "version-missing": "version-type",
    "version-newer": "version-type",
    "version-older": "version-type",
    "arrays-npz": "arrays-unreadable",
}


class FileKind:
    """One kind of manifest: its ``format``, versions read, and how problems are worded.

    Args:
        format: the manifest's ``format`` field.
        version: the newest version read (``oldest``: the oldest).
        messages: problem -> ``str.format`` template with the manifest's ``path`` and
            ``stem`` and the problem's fields: ``missing``, ``directory``, ``unreadable``
            (``error``, ``strerror``), ``not-utf8`` (the same and ``size``), ``not-json``
            (the same, ``line``, ``column``, ``msg``), ``format``, ``version-missing``,
            ``-type``, ``-newer``, ``-older`` (``version``, ``newest``, ``by``, ``ours``),
            ``arrays-name``, ``-missing``, ``-unreadable``, ``-hash``, ``-npz`` (``name``,
            ``arrays``, ``error``). One left out is worded as the one it falls back to.
        error: ``error(file at fault, message)``: the exception to raise.
        version_key: the manifest's version field.
    """

    def __init__(
        self,
        format: str,
        version: int,
        messages: Mapping[str, str],
        error: Callable[[str, str], Exception],
        *,
        version_key: str = "format_version",
        oldest: int = 1,
    ) -> None:
        self.format, self.version, self.oldest = format, version, oldest
        self.messages, self.error, self.version_key = messages, error, version_key

    def fail(self, problem: str, path: str, at: str | None = None, **fields: Any) -> NoReturn:
        """Raises the error of ``problem`` for the manifest ``path`` (``at``: file at fault)."""
        while problem not in self.messages:
            problem = _FALLBACK[problem]
        text = self.messages[problem].format(path=path, stem=_stem(path), **fields)
        raise self.error(at or path, text) from None

    def read(self, path: str) -> Any:
        """The manifest at ``path``, parsed (no check of its content)."""
        if not os.path.exists(path):
            self.fail("missing", path, strerror=os.strerror(errno.ENOENT))
        if os.path.isdir(path):
            self.fail("directory", path, strerror=os.strerror(errno.EISDIR))
        try:
            # a plain file only (as the arrays file below): opening a pipe waits for a
            # writer, and a link to a device never ends or fills memory
            if not stat.S_ISREG(os.stat(path).st_mode):
                raise OSError(errno.EINVAL, "not a regular file", path)
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as e:
            self.fail("unreadable", path, error=e, strerror=e.strerror or e)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self.fail("not-utf8", path, error=e, strerror=e, size=len(raw))
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            self.fail(
                "not-json", path, error=e, size=len(raw), line=e.lineno, column=e.colno, msg=e.msg
            )
        except (RecursionError, ValueError) as e:
            self.fail("unreadable", path, error=e, strerror=e)

    def check(self, doc: Any, path: str) -> int:
        """Checks the manifest's format and version; returns the version."""
        if not isinstance(doc, dict) or doc.get("format") != self.format:
            self.fail("format", path)
        version = doc.get(self.version_key)
        written = doc.get("versions")
        written = written.get("gpchol") if isinstance(written, dict) else None
        fields: dict[str, Any] = {
            "version": version,
            "newest": self.version,
            "by": f"gpchol {written}" if isinstance(written, str) else "a newer gpchol",
            "ours": versions()["gpchol"],
        }
        if self.version_key not in doc:
            self.fail("version-missing", path, **fields)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            self.fail("version-type", path, **fields)
        if version > self.version:
            self.fail("version-newer", path, **fields)
        if version < self.oldest:
            self.fail("version-older", path, **fields)
        return version

    def read_arrays(self, path: str, name: Any, sha256: Any) -> tuple[str, dict[str, np.ndarray]]:
        """``(path, arrays)`` of the arrays file ``name`` with ``sha256`` that ``path`` names."""
        if not isinstance(name, str) or not _arrays_name(path).fullmatch(name):
            self.fail("arrays-name", path, name=name)
        npz = os.path.join(os.path.dirname(path), name)
        where = {"name": name, "arrays": npz}
        try:
            # a plain file only: a link to a device or a pipe would never end (or fill
            # memory), and opening a pipe waits for a writer
            if not stat.S_ISREG(os.stat(npz).st_mode):
                raise OSError(f"{npz} is not a regular file")
            with open(npz, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            self.fail("arrays-missing", path, npz, **where)
        except OSError as e:
            self.fail("arrays-unreadable", path, npz, error=e, **where)
        if sha256_bytes(data) != sha256:
            self.fail("arrays-hash", path, npz, **where)
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                # written stored: nothing to inflate (a small file cannot fill memory)
                if any(i.compress_type != zipfile.ZIP_STORED for i in z.zip.infolist()):
                    raise ValueError("it has compressed members, which gpchol never writes")
                return npz, {k: z[k] for k in z.files}
        except Exception as e:
            self.fail("arrays-npz", path, npz, error=e, **where)
