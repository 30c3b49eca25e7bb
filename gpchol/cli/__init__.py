"""The ``gpchol`` command line.

Subcommands:

* ``gpchol check`` -- factor and differentiate a random SPD matrix with every available
  backend, compare with JAX's own Cholesky, print errors and timings.
* ``gpchol fit`` -- fit GP hyperparameters: with no arguments the Rasmussen & Williams
  kernel on the embedded monthly Mauna Loa CO2 data; with ``--csv FILE --x COLS --y COL
  --kernel SPEC`` the user's own data. Writes ``gpchol-fit.json`` (parameters, log
  marginal likelihood, training data and its hash, versions, kernel spec; no pickle) and
  ``gpchol-fit.png``.
* ``gpchol predict --model gpchol-fit.json --csv FILE`` -- CSV of posterior mean and std.

Example (shell)::

    gpchol fit --steps 50
    gpchol fit --csv data.csv --x t --y value --kernel "matern52*periodic+white"
    gpchol predict --model gpchol-fit.json --csv new.csv --out pred.csv

Errors in the user's input are reported as one line on stderr with a non-zero exit
status, never as a traceback (argument errors included); warnings are one line each.
Every output path is checked before the work starts; a large fit prints its memory and
time estimate first and is refused (naming ``--no-memory-check``) when it cannot fit in
the machine's memory. The program keeps JAX's compiled programs in a persistent cache
(``~/.cache/gpchol/jax``; ``--cache-dir DIR``, ``--no-cache`` or ``GPCHOL_CACHE_DIR``,
:mod:`~gpchol.cli.cache`), so a second run starts at once. Ctrl-C prints ``gpchol:
interrupted`` and exits with status 130 (a fit first commits its checkpoint between two
steps; a computation that does not end within two seconds is cut short,
:mod:`~gpchol.cli.interrupt`); ``SIGTERM`` likewise gives ``gpchol: terminated`` and 143.
Files are written atomically with the user's umask.

Modules: :mod:`~gpchol.cli.parsing` (arguments), :mod:`~gpchol.cli.commands` (the
subcommands), :mod:`~gpchol.cli.csvio` (CSV files), :mod:`~gpchol.cli.model` (the model
and its JSON file), :mod:`~gpchol.cli.plotting` (the plot; matplotlib only when drawn),
:mod:`~gpchol.cli.spec` (the kernel SPEC language), :mod:`~gpchol.cli.files` (output
paths and atomic writes), :mod:`~gpchol.cli.resources` (memory and time estimates),
:mod:`~gpchol.cli.interrupt` (Ctrl-C during long computations), :mod:`~gpchol.cli.errors`,
:mod:`~gpchol.cli.cache` (the compilation cache and the compile clock).

Example:
    >>> from gpchol.cli import main
    >>> main(["fit", "--steps", "-1"])  # bad input: one line on stderr, exit status 2
    2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import TextIO

from gpchol.cli.cache import compilation_cache, resolve_cache_dir
from gpchol.cli.commands import COMMANDS
from gpchol.cli.errors import CLIError, one_line
from gpchol.cli.interrupt import GRACE_SECONDS, InterruptWatch, exit_status
from gpchol.cli.parsing import build_parser

__all__ = ["CLIError", "build_parser", "main"]


def _error(message: object) -> None:
    print(f"gpchol: error: {one_line(message)}", file=sys.stderr)


@contextlib.contextmanager
def _one_line_warnings() -> Iterator[None]:
    """Python warnings printed as ``gpchol: warning: ...`` (one line, no source line)."""

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        print(f"gpchol: warning: {one_line(message)}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def _resume_note(args: argparse.Namespace) -> str:
    """What an interrupted fit's user can do: resume from the checkpoint, if there is one."""
    checkpoint = getattr(args, "checkpoint", None)
    if not checkpoint:
        return ""
    return (
        f"checkpoint {checkpoint} holds the last committed step: run the same command with "
        "--resume to continue"
    )


def _stopped(e: BaseException, signum: int) -> int:
    """Prints how the command was stopped by ``signum``; returns the exit status."""
    word = "terminated" if signum == signal.SIGTERM else "interrupted"
    checkpoint = getattr(e, "checkpoint", None)
    hint = (
        f" (checkpoint {checkpoint} is up to date: run the same command with --resume to continue)"
        if checkpoint
        else ""
    )
    print(f"gpchol: {word}{hint}", file=sys.stderr, flush=True)
    return exit_status(signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``gpchol`` command; returns its exit status.

    Args:
        argv: the arguments after the program name (default: ``sys.argv[1:]``). With the
            default (the ``gpchol`` program), Ctrl-C ends the process within two seconds
            even during a long compiled computation (:mod:`~gpchol.cli.interrupt`); with
            an explicit list (a call from Python code), the process is never ended: the
            ``KeyboardInterrupt`` comes when the computation returns.

    Returns:
        0 on success, 1 when a fit did not succeed or a check failed (or on an internal
        error, or a file that cannot be written), 2 on bad input (one line on stderr),
        130 when interrupted (SIGINT, Ctrl-C), 143 when terminated (SIGTERM), 141
        (silently) when the reader of stdout went away (a closed pipe).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except CLIError as e:
        _error(e)
        return 2
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except KeyboardInterrupt as e:
        return _stopped(e, signal.SIGINT)
    if args.command is None:
        parser.print_help()
        return 2
    # As the program (argv from the command line), a computation that does not stop
    # within GRACE_SECONDS of Ctrl-C is cut short by ending the process; called from
    # Python with an argument list, the caller's process is never ended.
    grace = GRACE_SECONDS if argv is None else None
    # JAX's persistent compilation cache: the program's default, from Python only when
    # asked for (gpchol.cli.cache); set here, at run time, never at import.
    cache_dir = resolve_cache_dir(
        getattr(args, "cache_dir", None),
        no_cache=getattr(args, "no_cache", True),
        program=argv is None,
    )
    with (
        InterruptWatch(grace, note=_resume_note(args)) as watch,
        _one_line_warnings(),
        compilation_cache(cache_dir),
    ):
        try:
            return COMMANDS[args.command](args)
        except KeyboardInterrupt as e:
            return _stopped(e, signal.SIGINT)
        except SystemExit as e:  # a fit stopped by SIGTERM (status 143) after its commit
            if e.code == exit_status(signal.SIGTERM):
                return _stopped(e, signal.SIGTERM)
            raise
        except Exception as e:
            signum = watch.signalled()
            if signum is not None:  # a signal that surfaced as another error
                return _stopped(e, signum)
            return _failed(e)


def _failed(e: Exception) -> int:
    """Prints the one line for a command that raised ``e``; returns the exit status."""
    if isinstance(e, (CLIError, ValueError, TypeError)):
        _error(e)
        return 2
    if isinstance(e, MemoryError):
        _error(
            "out of memory; use fewer rows or float32 (the estimate printed for a large fit "
            "tells how much is needed)"
        )
        return 1
    if isinstance(e, BrokenPipeError):  # e.g. `gpchol predict ... | head`: the reader left
        try:  # no error at exit either, when Python flushes stdout
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return exit_status(getattr(signal, "SIGPIPE", 13))
    if isinstance(e, OSError):
        _error(e)
        return 1
    if os.environ.get("GPCHOL_DEBUG"):
        raise e
    print(
        f"gpchol: internal error: {type(e).__name__}: {one_line(e)} (set GPCHOL_DEBUG=1 for "
        "the traceback)",
        file=sys.stderr,
    )
    return 1
