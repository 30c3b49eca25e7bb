"""The files the command line writes: checked before the work, written atomically.

* :func:`check_output` is called for every output path (the model file, the plot, the
  predictions, the checkpoint) before any long computation, so an unwritable path is
  reported at once, not after the fit.
* :func:`write_file` writes through a temporary file in the target's directory and
  ``os.replace`` (a reader sees the old file or the complete new one), with the mode a
  newly created file gets under the user's umask (``0o666 & ~umask``; a plain
  ``tempfile.mkstemp`` file would stay ``0o600``).

Example:
    >>> import os, tempfile
    >>> from gpchol.cli.files import check_output, file_mode, write_file
    >>> path = os.path.join(tempfile.mkdtemp(), "out", "m.json")
    >>> check_output(path, "--out")
    >>> write_file(path, b"{}")
    >>> open(path, "rb").read(), os.stat(path).st_mode & 0o777 == file_mode()
    (b'{}', True)
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Mapping

from gpchol._base.io import current_umask, file_mode, write_bytes_atomic
from gpchol._fit.checkpoint import manifest_path
from gpchol.cli.errors import CLIError

__all__ = ["check_fit_outputs", "check_output", "current_umask", "file_mode", "write_file"]


def write_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically, with the user's umask's permissions.

    :func:`gpchol._base.io.write_bytes_atomic`: a temporary file in the target's
    directory gets the data and the mode :func:`file_mode`, is flushed to disk, then
    renamed over ``path``; it is removed on every exit path Python sees. Missing
    directories are created.

    Args:
        path: the destination file.
        data: its content.

    Raises:
        OSError: the file cannot be written.
    """
    write_bytes_atomic(path, data)


def _same(a: str, b: str) -> bool:
    """Whether paths ``a`` and ``b`` name the same file (existing or not)."""
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def check_output(path: str, flag: str, *, protect: Mapping[str, str | None] | None = None) -> None:
    """Checks, before any long computation, that a file can be written at ``path``.

    The path must not be a directory or a special file (a device, a pipe), must not be one
    of the ``protect`` files, and its directory (or the nearest existing ancestor, when
    directories are to be created) must take a new file: one is created there and removed.

    Args:
        path: the output file.
        flag: how the user named it, for the message (e.g. ``"--out"``).
        protect: ``description -> path`` of files the output must not overwrite (the
            input CSV, the model file); ``None`` entries are skipped.

    Raises:
        CLIError: the path cannot be written, naming the flag, the path and why.

    Example:
        >>> import tempfile
        >>> from gpchol.cli.files import check_output
        >>> d = tempfile.mkdtemp()
        >>> try:
        ...     check_output(d, "--out")
        ... except Exception as e:
        ...     print(str(e).endswith("is a directory; give a file name"))
        True
    """
    if not path or not path.strip():
        raise CLIError(f"{flag} needs a file name")
    full = os.path.abspath(path)
    if os.path.isdir(full):
        raise CLIError(f"{flag} {path} is a directory; give a file name")
    if os.path.lexists(full) and not os.path.isfile(full):
        raise CLIError(f"{flag} {path} exists and is not a regular file; give another name")
    for what, other in (protect or {}).items():
        if other is not None and _same(full, os.path.abspath(other)):
            raise CLIError(f"{flag} {path} is {what}; writing it would overwrite that file")
    directory = os.path.dirname(full)
    while not os.path.lexists(directory):
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    if not os.path.isdir(directory):
        raise CLIError(f"cannot write {flag} {path}: {directory} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".gpchol-probe-", dir=directory)
    except OSError as e:
        raise CLIError(
            f"cannot write {flag} {path}: {e.strerror or e} in directory {directory}"
        ) from None
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass


def check_fit_outputs(args: argparse.Namespace, *, plot: bool) -> tuple[str, str | None]:
    """Checks every file ``gpchol fit`` will write (``--out``, the plot when ``plot``,
    ``--checkpoint``'s manifest), before it starts: ``(model file, plot or None)``."""
    out = args.out
    inputs = {"the input CSV (--csv)": args.csv}
    check_output(out, "--out", protect=inputs)
    png = None
    if plot:
        png = os.path.splitext(out)[0] + ".png"
        if os.path.abspath(png) == os.path.abspath(out):
            raise CLIError(
                f"--out {out}: the plot would be written to the same file; give the model "
                "file a .json name, or pass --no-plot"
            )
        check_output(png, "the plot (--out with .png)", protect=inputs)
    if args.checkpoint:
        check_output(
            manifest_path(args.checkpoint),
            "--checkpoint",
            protect=inputs | {"the model file (--out)": out, "the plot": png},
        )
    return out, png
