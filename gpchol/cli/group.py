"""``gpchol fit --group COL``: one GP per group of rows, all fitted at once.

The rows of the CSV file are split by the value of the group column (any text: a star,
a sensor, a patient); each group gets its own model (its own standardization and
hyperparameters), and all groups are fitted together by :func:`gpchol.fit_batched`
(one compiled loop; groups of unequal sizes are padded, which changes no group's
likelihood). The output is one JSON file holding one complete model per group, each in
the format of a single ``gpchol fit`` model file (:meth:`gpchol.cli.model.Model.to_json`).

Example:
    >>> import numpy as np
    >>> from gpchol.cli.group import split_groups
    >>> X, y = np.arange(6.0).reshape(6, 1), np.arange(6.0)
    >>> parts = split_groups(["a", "b", "a", "b", "a", "b"], X, y, "g", min_rows=3)
    >>> [(k, v[0].ravel().tolist()) for k, v in parts.items()]
    [('a', [0.0, 2.0, 4.0]), ('b', [1.0, 3.0, 5.0])]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

import jax.numpy as jnp
import numpy as np

from gpchol import CheckpointError, FitResult, GaussianProcess
from gpchol._fit import fit_batched
from gpchol.cli.csvio import MISSING, read_csv, read_rows
from gpchol.cli.errors import CLIError, checkpoint_message
from gpchol.cli.files import check_fit_outputs, write_file
from gpchol.cli.model import FORMAT_VERSION, GROUPS_FORMAT, Model, versions
from gpchol.cli.parsing import fit_options, model_columns
from gpchol.cli.spec import ModelSpec

__all__ = ["GROUPS_FORMAT", "MIN_ROWS", "group_labels", "run_group_fit", "split_groups"]

MIN_ROWS = 3
"""The fewest rows a group needs (as a single ``gpchol fit``)."""


def group_labels(
    path: str, group: str, wanted: list[str], dropna: bool, *, flag: str = "--group column"
) -> list[str]:
    """The group column's text in each data row kept by :func:`read_csv`.

    Rows :func:`~gpchol.cli.csvio.read_csv` drops with ``--dropna`` (a missing, NaN or
    inf value in ``wanted``) are dropped here too, so the labels match its rows one to
    one; a row whose group cell is empty gets the label ``""`` with ``--dropna`` (for
    the caller to drop) and is an error without.

    Args:
        path: the CSV file (already read once by ``read_csv``, which reported its errors).
        group: the group column's name.
        wanted: the input and target columns.
        dropna: as ``--dropna``.
        flag: how the messages name the group column.

    Returns:
        One label per row ``read_csv`` keeps, in file order.

    Raises:
        CLIError: no such column, a column named twice, an empty group cell.
    """
    lines, rows = read_rows(path)
    header = [h.strip() for h in rows[0]]
    if group not in header:
        raise CLIError(
            f"{flag} {group!r} not found in {path}; its columns are: " + ", ".join(header)
        )
    if header.count(group) > 1:
        raise CLIError(f"{flag} {group!r} appears more than once in the header of {path}")
    if group in wanted:
        raise CLIError(f"{flag} {group!r} is also an input (--x) or the target (--y)")
    g = header.index(group)
    idx = [header.index(c) for c in wanted]
    labels = []
    for i, (line, row) in enumerate(zip(lines[1:], rows[1:], strict=True)):
        label = row[g].strip() if g < len(row) else ""
        if dropna:
            cells = [row[k].strip() if k < len(row) else "" for k in idx]
            if not all(_finite(c) for c in cells):
                continue  # read_csv drops this row too
        elif not label:
            raise CLIError(
                f"the {flag} {group!r} is empty at data row {i + 1} (line {line}) of "
                f"{path}; fill it in or pass --dropna to drop such rows"
            )
        labels.append(label)
    return labels


def _finite(cell: str) -> bool:
    if cell.lower() in MISSING:
        return False
    try:
        return math.isfinite(float(cell))
    except ValueError:
        return False


def split_groups(
    labels: list[str], X: np.ndarray, y: np.ndarray, group: str, *, min_rows: int
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``label -> (X rows, y rows)`` in order of first appearance.

    Raises:
        CLIError: a group with fewer than ``min_rows`` rows (every group with one row: the
            column is an identifier per row, not a group).
    """
    order: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        order.setdefault(label, []).append(i)
    small = [k for k, v in order.items() if len(v) < min_rows]
    if small and all(len(v) == 1 for v in order.values()):
        raise CLIError(
            f"the --group column {group!r} has a different value in every row ({len(order)} "
            f"groups of one row): a GP per group needs at least {min_rows} rows per group. Is "
            f"{group!r} a row identifier rather than a group?"
        )
    if small:
        shown = ", ".join(repr(k) for k in small[:5]) + (" ..." if len(small) > 5 else "")
        raise CLIError(
            f"{len(small)} group(s) of the --group column {group!r} have fewer than "
            f"{min_rows} rows ({shown}); a GP per group needs at least {min_rows} points. "
            "Drop those rows or merge the groups"
        )
    return {k: (X[v], y[v]) for k, v in order.items()}


def _read(args: argparse.Namespace) -> tuple[dict[str, Model], ModelSpec, list[str], str]:
    """The per-group models of the CSV file: ``(models, spec, x columns, y column)``."""
    if args.csv is None:
        raise CLIError("--group needs --csv FILE (and --x, --y)")
    x_cols, y_col, spec = model_columns(args)
    group = args.group.strip()
    if not group:
        raise CLIError("--group needs a column name")
    X, y = read_csv(args.csv, x_cols, y_col, dropna=args.dropna, min_rows=1)
    assert y is not None
    labels = group_labels(args.csv, group, x_cols + [y_col], args.dropna)
    keep = np.array([bool(k) for k in labels], dtype=bool)  # "": empty cell, --dropna
    labels = [k for k in labels if k]
    X, y = X[keep], y[keep]
    if not labels:
        raise CLIError(f"the --group column {group!r} of {args.csv} is empty on every row")
    models = {}
    for label, (Xg, yg) in split_groups(labels, X, y, group, min_rows=MIN_ROWS).items():
        try:
            models[label] = Model.standardized(spec, Xg, yg, x_cols, y_col)
        except CLIError as e:
            raise CLIError(f"group {label!r}: {e}") from None
    return models, spec, x_cols, y_col


def run_group_fit(args: argparse.Namespace, dtype: type[np.floating]) -> int:
    """``gpchol fit --group COL``: fits one GP per group; writes one JSON of all models.

    Returns:
        0 when every group's fit succeeded, else 1 (the failed groups are named on
        stderr; their models hold the last finite parameters).
    """
    t_start = time.perf_counter()
    check_fit_outputs(args, plot=False)
    models, spec, x_cols, y_col = _read(args)
    labels = list(models)
    sizes = [m.X.shape[0] for m in models.values()]
    source = (
        f"{args.csv}: {sum(sizes)} rows in {len(labels)} groups by {args.group.strip()} "
        f"({min(sizes)}..{max(sizes)} rows each), x={','.join(x_cols)}, y={y_col}"
    )
    print(
        f"gpchol fit: {source}; kernel {spec.spec}; {np.dtype(dtype).name}; "
        f"{args.optimizer}, up to {args.steps} steps, all groups at once",
        flush=True,
    )
    if not args.no_plot:
        print("gpchol: no plot with --group (one model per group)", file=sys.stderr)
    Xs = [np.asarray(m.xs(m.X), dtype) for m in models.values()]
    ys = [np.asarray(m.ys(m.y), dtype) for m in models.values()]
    init = {k: jnp.asarray(v, dtype) for k, v in spec.init_params().items()}

    def build(p: dict[str, Any], x: Any) -> GaussianProcess:
        kernel, noise = spec.build(p)
        return GaussianProcess(kernel, x, noise=noise)

    t_fit = time.perf_counter()
    try:
        res = fit_batched(
            build,
            init,
            Xs,
            ys,
            transforms=spec.transforms(),
            **fit_options(args),
        )
    except CheckpointError as e:
        raise CLIError(checkpoint_message(e)) from None
    except ValueError as e:
        raise CLIError(str(e)) from None
    seconds_fit = time.perf_counter() - t_fit
    print(res.message)
    out: dict[str, Any] = {}
    failed = []
    for b, (label, model) in enumerate(models.items()):
        params = {k: np.asarray(v[b]) for k, v in res.params.items()}
        loss = float(res.loss[b])
        lml = -loss - model.X.shape[0] * math.log(model.y_scale)
        status = int(res.status[b])
        message = (
            "converged"
            if res.converged[b]
            else "failed: a non-finite loss or gradient; the last finite parameters are kept"
            if res.failed[b]
            else f"reached steps={args.steps} without meeting tol={args.tol:g}"
        )
        if res.failed[b]:
            failed.append(label)
        result = FitResult(
            params=params,
            loss=loss,
            log_marginal_likelihood=-loss,
            history=np.zeros(0),
            n_steps=int(res.n_steps[b]),
            converged=bool(res.converged[b]),
            success=not bool(res.failed[b]),
            message=message,
            unconstrained_params=None,
            restart_losses=[loss],
            optimizer=args.optimizer,
        )
        info = {
            "optimizer": args.optimizer,
            "steps": args.steps,
            "dtype": np.dtype(dtype).name,
            "source": f"{args.csv}: group {label!r} of column {args.group.strip()}",
            "status": status,
        }
        out[label] = model.to_json(params, lml, result, info)
        print(f"  {label}: log marginal likelihood {lml:.4f} ({int(res.n_steps[b])} steps)")
    doc = {
        "format": GROUPS_FORMAT,
        "format_version": FORMAT_VERSION,
        "group_column": args.group.strip(),
        "fit": {
            "n_groups": len(labels),
            "seconds": round(time.perf_counter() - t_start, 2),
            "fit_seconds": round(seconds_fit, 2),
            "message": res.message,
        },
        "groups": out,
        "versions": versions(),
    }
    write_file(args.out, (json.dumps(doc, indent=2, allow_nan=True) + "\n").encode())
    print(f"wrote {args.out} ({len(labels)} models)")
    print(f"total time {time.perf_counter() - t_start:.1f} s (fit {seconds_fit:.1f} s)")
    if failed:
        print(
            f"gpchol: warning: the fit failed for {len(failed)} group(s): "
            + ", ".join(repr(k) for k in failed[:10]),
            file=sys.stderr,
        )
        return 1
    return 0
