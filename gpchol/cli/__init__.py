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
status, never as a traceback.

Modules: :mod:`~gpchol.cli.parsing` (arguments), :mod:`~gpchol.cli.commands` (the
subcommands), :mod:`~gpchol.cli.csvio` (CSV files), :mod:`~gpchol.cli.model` (the model
and its JSON file), :mod:`~gpchol.cli.plotting` (the plot; matplotlib only when drawn),
:mod:`~gpchol.cli.spec` (the kernel SPEC language), :mod:`~gpchol.cli.errors`.

Example:
    >>> from gpchol.cli import main
    >>> main(["fit", "--steps", "-1"])  # bad input: one line on stderr, exit status 2
    2
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from gpchol.cli.commands import COMMANDS
from gpchol.cli.errors import CLIError
from gpchol.cli.parsing import build_parser

__all__ = ["CLIError", "build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``gpchol`` command; returns its exit status.

    Args:
        argv: the arguments after the program name (default: ``sys.argv[1:]``).

    Returns:
        0 on success, 1 when a fit did not succeed or a check failed (or on an internal
        error), 2 on bad input (one line on stderr), 130 when interrupted.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command](args)
    except (CLIError, ValueError, TypeError) as e:
        print(f"gpchol: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gpchol: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if os.environ.get("GPCHOL_DEBUG"):
            raise
        print(
            f"gpchol: internal error: {type(e).__name__}: {e} (set GPCHOL_DEBUG=1 for the "
            "traceback)",
            file=sys.stderr,
        )
        return 1
