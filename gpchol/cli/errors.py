"""The command line's user-facing error, and how any message becomes one line.

Example:
    >>> from gpchol.cli.errors import CLIError, one_line
    >>> str(CLIError("no such file: data.csv"))
    'no such file: data.csv'
    >>> one_line("checkpoint ck.json is another fit's:\\n  y: shape (3,)\\n  model: other")
    "checkpoint ck.json is another fit's:; y: shape (3,); model: other"
"""

from __future__ import annotations

__all__ = ["CLIError", "checkpoint_message", "one_line"]


class CLIError(Exception):
    """A user-facing error: printed as one line on stderr, exit status 2."""


def one_line(message: object) -> str:
    """``message`` as one line: its non-blank lines, stripped, joined with ``"; "``.

    Args:
        message: anything (an exception's text may span several lines).

    Returns:
        The text without line breaks (``"(no message)"`` when it is empty).
    """
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    return "; ".join(lines) or "(no message)"


def checkpoint_message(error: Exception) -> str:
    """A checkpoint error's message with the library's remedy in the command line's terms.

    :class:`gpchol.CheckpointError` tells a Python caller to ``pass resume=False``; the
    command line's user starts over by running without ``--resume``.

    Example:
        >>> from gpchol.cli.errors import checkpoint_message
        >>> checkpoint_message(ValueError("checkpoint ck.json is damaged. Delete its files or "
        ...                               "pass resume=False to start over."))
        'checkpoint ck.json is damaged. Delete its files or run without --resume to start over.'
    """
    text = str(error).replace("pass resume=False", "run without --resume")
    return text.replace("resume=False", "no --resume")
