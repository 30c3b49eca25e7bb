"""Atomic files: what the file protocol (:mod:`gpchol._base.store`) and the CLI write.

Every writer goes through a temporary file in the target's directory followed by
``os.replace``, so a reader sees either the old file or the complete new one, never a
partial write (a crash or Ctrl-C in the middle leaves the old file in place). The data
and then the directory entry are flushed to disk (``fsync``), so a committed file also
survives a power cut; the temporary file is removed on every exit path Python sees (an
exception, ``KeyboardInterrupt``, ``SystemExit``).

Example:
    >>> import os, tempfile, numpy as np
    >>> from gpchol._base.io import npz_bytes, write_bytes_atomic
    >>> path = os.path.join(tempfile.mkdtemp(), "a.npz")
    >>> write_bytes_atomic(path, npz_bytes({"x": np.arange(3.0)}))
    >>> with np.load(path, allow_pickle=False) as z:
    ...     z["x"].tolist()
    [0.0, 1.0, 2.0]
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from typing import Any

import numpy as np

__all__ = [
    "TMP_PREFIX",
    "current_umask",
    "file_mode",
    "fsync_dir",
    "npz_bytes",
    "sha256_bytes",
    "write_bytes_atomic",
]


TMP_PREFIX = ".tmp-"
"""How the temporary files of :func:`write_bytes_atomic` are named: ``.tmp-XXXXXXXX<name>``."""


def current_umask() -> int:
    """The process's umask, read without changing it where possible.

    From ``/proc/self/status`` on Linux; elsewhere by setting and restoring it
    (``os.umask``), which is not atomic with respect to other threads.

    Example:
        >>> from gpchol._base.io import current_umask
        >>> 0 <= current_umask() <= 0o777
        True
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def file_mode() -> int:
    """The permission bits a new file gets under the user's umask: ``0o666 & ~umask``.

    (``tempfile.mkstemp`` creates ``0o600`` files; :func:`write_bytes_atomic` sets this
    mode on its temporary file so that the committed file looks like any other.)

    Example:
        >>> from gpchol._base.io import file_mode
        >>> file_mode() & ~0o666
        0
    """
    return 0o666 & ~current_umask()


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Flushes a directory's entries to disk (no-op where directories cannot be opened).

    Args:
        directory: the directory whose entries (a rename, a new or removed file) to flush.

    Example:
        >>> import tempfile
        >>> from gpchol._base.io import fsync_dir
        >>> fsync_dir(tempfile.mkdtemp())
    """
    try:
        fd = os.open(os.fspath(directory), os.O_RDONLY)
    except OSError:  # e.g. Windows, where a directory cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically (temporary file + ``os.replace``).

    The temporary file sits in the target's directory, so a reader sees the old file or
    the complete new one, never a partial write. The file gets the user's umask's
    permissions (:func:`file_mode`), like one written with ``open``.

    Args:
        path: destination file; its directory is created when missing.
        data: the bytes to write.

    Raises:
        OSError: the file cannot be written (no space, no permission, ...): its
            ``filename`` is ``path`` and its ``errno`` the failure's, so its message
            names the file.

    Example:
        >>> import os, tempfile
        >>> from gpchol._base.io import write_bytes_atomic
        >>> path = os.path.join(tempfile.mkdtemp(), "a.txt")
        >>> write_bytes_atomic(path, b"hello")
        >>> open(path, "rb").read()
        b'hello'
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=os.path.basename(path), dir=directory)
        with os.fdopen(fd, "wb") as f:
            if hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), file_mode())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        fsync_dir(directory)
    except BaseException as e:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if isinstance(e, OSError) and e.filename != os.fspath(path):
            raise _naming(e, os.fspath(path)) from e
        raise


def _naming(e: OSError, path: str) -> OSError:
    """``e`` as an error of writing ``path`` (the file the caller named, not a temporary
    one): the same ``errno`` (and so the same subclass), ``path`` as its file name."""
    if e.errno is None:
        return OSError(f"cannot write {path}: {e}")
    return OSError(e.errno, e.strerror or str(e), path)


def sha256_bytes(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """The bytes of an uncompressed ``.npz`` holding ``arrays`` (no object arrays)."""
    buf = io.BytesIO()
    clean: dict[str, Any] = {}
    for k, v in arrays.items():
        a = np.asarray(v)
        if a.dtype.hasobject:  # object fields of a structured dtype too: np.savez pickles them
            raise TypeError(
                f"array {k!r} has dtype {a.dtype} (Python objects); only numeric arrays are stored."
            )
        clean[k] = a
    np.savez(buf, **clean)
    return buf.getvalue()
