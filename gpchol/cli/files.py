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
import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any

from gpchol._base.io import current_umask, file_mode, write_bytes_atomic
from gpchol._fit.checkpoint import FORMAT as CHECKPOINT_FORMAT
from gpchol._fit.checkpoint import manifest_path
from gpchol.cli.errors import CLIError

__all__ = [
    "check_fit_outputs",
    "check_output",
    "current_umask",
    "file_mode",
    "resumed_steps",
    "write_file",
]


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


def _stem(path: str) -> str:
    """What the arrays files of the manifest ``path`` are named after: ``path`` without
    ``.json`` (:func:`gpchol.save` and the checkpoints name them ``<stem>.<hash>.npz``)."""
    return path[: -len(".json")] if path.endswith(".json") else path


def _json(path: str) -> tuple[bool, Any]:
    """``(parsed, document)`` of the JSON file ``path``; ``(False, None)`` when it cannot
    be read or parsed."""
    try:
        with open(path, "rb") as f:
            return True, json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return False, None


def _is_checkpoint(doc: Any) -> bool:
    """Whether ``doc`` is a checkpoint's manifest, as :mod:`gpchol._fit.checkpoint` reads
    them: its ``format``, or the first version's ``npz_sha256`` without a format."""
    return isinstance(doc, dict) and (
        doc.get("format") == CHECKPOINT_FORMAT or ("format" not in doc and "npz_sha256" in doc)
    )


def _check_checkpoint_path(checkpoint: str) -> None:
    """Refuses a ``--checkpoint`` whose manifest is an existing file that is not a
    checkpoint (a model file of an earlier fit: starting a fit would overwrite it and
    delete its arrays file), or whose arrays files would share names with those of an
    existing model file saved without ``.json``."""
    manifest = manifest_path(checkpoint)
    if os.path.isfile(manifest):
        parsed, doc = _json(manifest)
        if parsed and not _is_checkpoint(doc):
            what = (
                "a gpchol model file"
                if isinstance(doc, dict) and str(doc.get("format", "")).startswith("gpchol")
                else "a JSON file"
            )
            raise CLIError(
                f"--checkpoint {checkpoint}: {manifest} exists and is {what}, not a gpchol "
                "fit checkpoint; a fit would overwrite it and delete its arrays file. Give "
                "--checkpoint another path, or move that file"
            )
    base = _stem(manifest)
    if os.path.isfile(base):
        parsed, doc = _json(base)
        arrays = doc.get("arrays") if parsed and isinstance(doc, dict) else None
        name = arrays.get("file") if isinstance(arrays, dict) else arrays
        if isinstance(name, str) and name.startswith(os.path.basename(base) + "."):
            raise CLIError(
                f"--checkpoint {checkpoint}: the model file {base} has its arrays file "
                f"{name} where the checkpoint keeps its own, and a fit would delete it. "
                "Give --checkpoint another path, or move that model file"
            )


def check_fit_outputs(args: argparse.Namespace, *, plot: bool) -> tuple[str, str | None]:
    """Checks every file ``gpchol fit`` will write, before it starts.

    ``--out`` (not a ``.npz`` name for a single model: :func:`gpchol.save` names the
    arrays file after it), the plot when ``plot``, and ``--checkpoint``'s manifest, which
    must not be ``--out``, must not share ``--out``'s arrays file names (a resume would
    delete the model's), and must be a checkpoint or a new file.

    Args:
        args: the parsed arguments of ``gpchol fit``.
        plot: the plot will be drawn (next to ``--out``, as ``.png``).

    Returns:
        ``(model file, plot or None)``.

    Raises:
        CLIError: a file that cannot or must not be written, naming the flags.
    """
    out = args.out
    single = getattr(args, "group", None) is None  # a gpchol.save file: JSON + arrays
    inputs = {"the input CSV (--csv)": args.csv}
    if single and out and out.endswith(".npz"):
        raise CLIError(
            f"--out {out} ends in .npz; give the model file a .json name (its arrays file "
            "is named after it)"
        )
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
        manifest = manifest_path(args.checkpoint)
        check_output(
            manifest,
            "--checkpoint",
            protect=inputs | {"the model file (--out)": out, "the plot": png},
        )
        if single and _same(_stem(out), _stem(manifest)):
            raise CLIError(
                f"--out {out} and --checkpoint {args.checkpoint} would name their arrays "
                f"files alike ({os.path.basename(_stem(out))}.<hash>.npz), and the "
                "checkpoint would delete the model's; give --out and --checkpoint different "
                "names"
            )
        _check_checkpoint_path(args.checkpoint)
    return out, png


def resumed_steps(checkpoint: str | None) -> int | None:
    """The step a ``--resume`` of ``checkpoint`` continues from (its manifest's count of
    the steps taken), or ``None`` when there is no checkpoint to resume (a new fit).

    Read before the fit, to tell the steps run in this process from those before (the
    command line's fits have one start: the count is the start's). A manifest that
    cannot be read counts as step 0 (the fit itself then reports what is wrong with it).

    Example:
        >>> from gpchol.cli.files import resumed_steps
        >>> resumed_steps("/nonexistent/ck") is None
        True
    """
    if not checkpoint or not os.path.exists(manifest_path(checkpoint)):
        return None
    _, doc = _json(manifest_path(checkpoint))
    state = doc.get("state") if _is_checkpoint(doc) else None
    step = state.get("step") if isinstance(state, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else 0
