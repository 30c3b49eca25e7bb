"""The argument parser of the ``gpchol`` command (``check``, ``fit``, ``predict``).

A bad argument raises :class:`~gpchol.cli.errors.CLIError` (one line, exit status 2)
instead of argparse's usage text; numbers are checked here (``--steps`` an integer
``>= 0``, ``--tol`` a finite number ``>= 0``, ``--learning-rate`` finite and positive).

Example:
    >>> from gpchol.cli.parsing import build_parser
    >>> args = build_parser().parse_args(["fit", "--steps", "5", "--no-plot"])
    >>> args.command, args.steps, args.no_plot, args.out
    ('fit', 5, True, 'gpchol-fit.json')
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any, NoReturn

from gpchol.cli.errors import CLIError
from gpchol.cli.resources import MEMORY_FLAG
from gpchol.cli.spec import KERNEL_NAMES, ModelSpec, SpecError

__all__ = ["build_parser", "fit_options"]


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one-line ``CLIError`` exceptions."""

    def error(self, message: str) -> NoReturn:
        """Raises :class:`CLIError` (argparse would print the usage and exit)."""
        raise CLIError(f"{message} (see `{self.prog} --help`)")


def _integer(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, not {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def _number(*, positive: bool) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise argparse.ArgumentTypeError(
                f"must be a finite number {'> 0' if positive else '>= 0'}, not {text}"
            )
        return value

    parse.__name__ = "number"
    return parse


def _add_memory_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        MEMORY_FLAG,
        action="store_true",
        help="run even when the memory estimate exceeds this machine's memory",
    )


def _add_cache_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        default=None,
        help="JAX compilation cache (default $GPCHOL_CACHE_DIR, else ~/.cache/gpchol/jax)",
    )
    p.add_argument("--no-cache", action="store_true", help="no compilation cache")


def build_parser() -> argparse.ArgumentParser:
    """The parser; ``args.command`` is the subcommand's name (``None`` without one)."""
    parser = _Parser(
        prog="gpchol",
        description="gpchol: differentiable tiled Cholesky and exact Gaussian processes.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_check(sub)
    _add_fit(sub)
    _add_predict(sub)
    return parser


def fit_options(args: argparse.Namespace) -> dict[str, Any]:
    """The optimiser, stopping and checkpoint options of ``gpchol fit`` as keyword
    arguments of :func:`gpchol.fit` and :func:`gpchol.fit_batched` (one place for both)."""
    return {
        "optimizer": args.optimizer,
        "steps": args.steps,
        "learning_rate": args.learning_rate,
        "tol": args.tol,
        "checkpoint": args.checkpoint,
        "checkpoint_every": args.checkpoint_every,
        "resume": args.resume,
        "progress": not args.quiet,
    }


def model_columns(args: argparse.Namespace) -> tuple[list[str], str, ModelSpec]:
    """``gpchol fit --csv``'s ``(x columns, y column, kernel SPEC)`` from ``--x``, ``--y``
    and ``--kernel``, or a :class:`~gpchol.cli.errors.CLIError` naming the flag."""
    if not args.x or not args.y or not args.y.strip():
        raise CLIError("--csv needs --x COLS (comma-separated) and --y COL")
    x_cols = [c.strip() for c in args.x.split(",") if c.strip()]
    if not x_cols:
        raise CLIError("--x needs at least one column name")
    twice = [c for i, c in enumerate(x_cols) if c in x_cols[:i]]
    if twice:
        raise CLIError(f"--x names column {twice[0]!r} twice")
    y_col = args.y.strip()
    if y_col in x_cols:
        raise CLIError(f"--y column {y_col!r} is also an input column in --x")
    try:
        spec = ModelSpec.parse(args.kernel or "rbf+white", len(x_cols))
    except SpecError as e:
        raise CLIError(str(e)) from None
    return x_cols, y_col, spec


def _add_check(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="factor and differentiate a random SPD matrix with every backend",
        description="Factor and differentiate a random SPD matrix with every available "
        "backend; compare with jnp.linalg.cholesky; print errors and timings.",
    )
    p.add_argument("--n", type=_integer(1), default=1000, help="matrix size (default 1000)")
    p.add_argument("--tile-size", type=_integer(1), default=None, help="tile size (default: auto)")
    p.add_argument("--float32", action="store_true", help="use float32 (default float64)")
    p.add_argument("--seed", type=_integer(0), default=0, help="random seed")
    _add_memory_flag(p)


def _add_fit(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fit",
        help="fit GP hyperparameters (default: the R&W kernel on the embedded CO2 data)",
        description="Fit the hyperparameters of an exact GP by maximising the log marginal "
        "likelihood. Without --csv: the Rasmussen & Williams kernel on the embedded monthly "
        "Mauna Loa CO2 data (n=521). Writes the model (JSON, no pickle) and a plot.",
        epilog="Kernel SPEC: a sum of products of names, e.g. 'rbf+white', "
        "'matern52*periodic+white'; 'white' is the learned observation noise. Names: "
        + ", ".join(KERNEL_NAMES),
    )
    p.add_argument("--csv", metavar="FILE", help="CSV file with a header row")
    p.add_argument("--x", metavar="COLS", help="comma-separated input column names")
    p.add_argument("--y", metavar="COL", help="target column name")
    p.add_argument("--kernel", metavar="SPEC", help="kernel SPEC (default 'rbf+white')")
    p.add_argument(
        "--group",
        metavar="COL",
        help="fit one GP per value of this column, all at once; one JSON of all models",
    )
    p.add_argument(
        "--steps", type=_integer(0), default=200, help="max optimiser steps (default 200)"
    )
    p.add_argument("--optimizer", choices=("lbfgs", "adam"), default="lbfgs")
    p.add_argument(
        "--learning-rate",
        type=_number(positive=True),
        default=None,
        help="Adam's step (default 0.05); with lbfgs, a fixed step in place of the line search",
    )
    p.add_argument(
        "--tol", type=_number(positive=False), default=1e-9, help="relative loss-change tolerance"
    )
    p.add_argument("--float32", action="store_true", help="float32 (default float64)")
    p.add_argument("--checkpoint", metavar="PATH", help="checkpoint base path")
    p.add_argument("--checkpoint-every", type=_integer(1), default=10, metavar="K")
    p.add_argument(
        "--resume",
        action="store_true",
        help="resume from --checkpoint (a new fit if there is none yet: a note says so)",
    )
    p.add_argument("--dropna", action="store_true", help="drop rows with NaN/inf/missing")
    p.add_argument("--out", default="gpchol-fit.json", help="model file (gpchol-fit.json)")
    p.add_argument("--no-plot", action="store_true", help="do not write the PNG plot")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    _add_memory_flag(p)
    _add_cache_flags(p)


def _add_predict(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict",
        help="predict with a fitted model: CSV of mean and std",
        description="Posterior mean and standard deviation (of the latent function: std; "
        "of a new observation: std_y) at the inputs of a CSV file. With a model file of "
        "`gpchol fit --group`, the CSV also needs the group column: each row is predicted "
        "by its group's model.",
    )
    p.add_argument("--model", default="gpchol-fit.json", help="model file from `gpchol fit`")
    p.add_argument("--csv", metavar="FILE", required=True, help="CSV with the input columns")
    p.add_argument("--out", metavar="FILE", help="output CSV (default: stdout)")
    p.add_argument("--dropna", action="store_true", help="drop rows with NaN/inf/missing")
    _add_memory_flag(p)
    _add_cache_flags(p)
