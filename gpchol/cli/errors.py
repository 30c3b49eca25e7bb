"""The command line's user-facing error.

Example:
    >>> from gpchol.cli.errors import CLIError
    >>> str(CLIError("no such file: data.csv"))
    'no such file: data.csv'
"""

from __future__ import annotations

__all__ = ["CLIError"]


class CLIError(Exception):
    """A user-facing error: printed as one line on stderr, exit status 2."""
