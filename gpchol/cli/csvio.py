"""CSV input and output of the command line: numeric columns in, predictions out.

Example:
    >>> import os, tempfile
    >>> from gpchol.cli.csvio import read_csv
    >>> path = os.path.join(tempfile.mkdtemp(), "d.csv")
    >>> _ = open(path, "w").write("t,y\\n1,2\\n2,NA\\n3,4\\n")
    >>> X, y = read_csv(path, ["t"], "y", dropna=True, min_rows=1)
    >>> X.shape, y.tolist()
    ((2, 1), [2.0, 4.0])
"""

from __future__ import annotations

import csv
import io
import os
import sys

import numpy as np

from gpchol.cli.errors import CLIError

__all__ = ["MISSING", "format_predictions", "read_csv", "read_rows"]

MISSING = frozenset({"", "na", "nan", "n/a", "null", "none"})
"""Cells read as missing values (case-insensitive)."""


def read_csv(
    path: str,
    x_cols: list[str],
    y_col: str | None,
    *,
    dropna: bool,
    min_rows: int,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Reads numeric columns from a CSV file with a header row.

    Args:
        path: the CSV file (UTF-8, an optional byte-order mark).
        x_cols: the input columns, in order.
        y_col: the target column, or ``None`` (inputs only).
        dropna: drop rows with a missing, NaN or inf value (saying so on stderr) instead
            of refusing them.
        min_rows: the fewest usable rows accepted.

    Returns:
        ``(X, y)``: ``X`` of shape ``(n, len(x_cols))`` and ``y`` of shape ``(n,)`` (or
        ``None`` without ``y_col``), float64.

    Raises:
        CLIError: every problem, as one line that names the file, the column and the rows
            (among them a column asked for twice, or one whose name the header repeats).
    """
    if not os.path.exists(path):
        raise CLIError(f"no such file: {path}")
    if os.path.isdir(path):
        raise CLIError(f"{path} is a directory, not a CSV file")
    try:
        lines, rows = read_rows(path)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise CLIError(f"cannot read {path} as CSV: {e}") from None
    if not rows:
        raise CLIError(f"{path} is empty (a header row with column names is needed)")
    header = [h.strip() for h in rows[0]]
    wanted = list(x_cols) + ([y_col] if y_col is not None else [])
    twice = [c for i, c in enumerate(wanted) if c in wanted[:i]]
    if twice:
        raise CLIError(f"column {twice[0]!r} is asked for twice; name each column once")
    missing = [c for c in wanted if c not in header]
    if missing:
        raise CLIError(
            f"column {missing[0]!r} not found in {path}; its columns are: " + ", ".join(header)
        )
    for c in wanted:
        where = [i + 1 for i, h in enumerate(header) if h == c]
        if len(where) > 1:
            raise CLIError(
                f"column {c!r} appears {len(where)} times in the header of {path} (columns "
                f"{', '.join(map(str, where))}); rename the copies so that each name is unique"
            )
    data = _numbers(rows[1:], lines[1:], [header.index(c) for c in wanted], wanted, path)
    bad = ~np.all(np.isfinite(data), axis=1)
    if np.any(bad):
        rows_bad = (np.flatnonzero(bad) + 1).tolist()
        shown = ", ".join(map(str, rows_bad[:10])) + (
            f" and {len(rows_bad) - 10} more" if len(rows_bad) > 10 else ""
        )
        if not dropna:
            raise CLIError(
                f"{len(rows_bad)} data row(s) of {path} have missing, NaN or inf values in "
                f"{', '.join(wanted)}: row(s) {shown}; pass --dropna to drop them"
            )
        print(f"gpchol: dropping {len(rows_bad)} row(s) with NaN/inf: {shown}", file=sys.stderr)
        data = data[~bad]
    if data.shape[0] < min_rows:
        raise CLIError(
            f"too few points: {data.shape[0]} usable row(s) in {path}; at least {min_rows} "
            "are needed"
        )
    X = data[:, : len(x_cols)]
    y = data[:, len(x_cols)] if y_col is not None else None
    return X, y


def read_rows(path: str) -> tuple[list[int], list[list[str]]]:
    """The non-blank rows of a CSV file and the file line each starts on (1-based).

    Blank rows are left out, so the ``i``-th row returned is the header (``i = 0``) or
    data row ``i``; its line number stays the file's (a message names the line an editor
    shows, blank lines and quoted line breaks counted).

    Args:
        path: the CSV file (UTF-8, an optional byte-order mark).

    Returns:
        ``(lines, rows)``: the line number of each row, and its cells.

    Raises:
        OSError, UnicodeDecodeError, csv.Error: the file cannot be read as CSV.

    Example:
        >>> import os, tempfile
        >>> from gpchol.cli.csvio import read_rows
        >>> path = os.path.join(tempfile.mkdtemp(), "d.csv")
        >>> _ = open(path, "w").write("x,y\\n\\n1,2\\n\\n3,4\\n")
        >>> read_rows(path)
        ([1, 3, 5], [['x', 'y'], ['1', '2'], ['3', '4']])
    """
    lines: list[int] = []
    rows: list[list[str]] = []
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        start = 1  # the line the next row starts on
        for row in reader:
            if any(c.strip() for c in row):
                lines.append(start)
                rows.append(row)
            start = reader.line_num + 1
    return lines, rows


def _numbers(
    rows: list[list[str]], lines: list[int], idx: list[int], names: list[str], path: str
) -> np.ndarray:
    """The cells ``idx`` of every row as floats, ``(len(rows), len(idx))``; missing: NaN.

    ``lines``: each row's line in the file, for the messages."""
    data = np.full((len(rows), len(idx)), np.nan)
    for i, row in enumerate(rows):
        for j, k in enumerate(idx):
            cell = row[k].strip() if k < len(row) else ""
            if cell.lower() in MISSING:
                continue
            try:
                data[i, j] = float(cell)
            except ValueError:
                raise CLIError(
                    f"non-numeric value {cell!r} in column {names[j]!r} at data row {i + 1} "
                    f"(line {lines[i]}) of {path}"
                ) from None
    return data


def format_predictions(
    x_names: list[str],
    X: np.ndarray,
    columns: dict[str, np.ndarray],
    *,
    labels: tuple[str, list[str]] | None = None,
) -> str:
    """The text of a CSV: the inputs, then one column per entry of ``columns``.

    Numbers are written with ``repr`` (shortest round-trip form).

    Args:
        x_names: names of the input columns.
        X: ``(n, len(x_names))`` inputs.
        columns: ``name -> (n,)`` values, in order.
        labels: ``(name, n texts)``: a text column written first (the group of each row).

    Returns:
        The CSV text, header first, ``\\n`` line ends.

    Example:
        >>> import numpy as np
        >>> from gpchol.cli.csvio import format_predictions
        >>> print(format_predictions(["t"], np.array([[1.5]]), {"mean": np.array([2.0])}), end="")
        t,mean
        1.5,2.0
    """
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*([labels[0]] if labels else []), *x_names, *columns])
    for i in range(X.shape[0]):
        values = [repr(float(v)) for v in (*X[i], *(c[i] for c in columns.values()))]
        w.writerow([labels[1][i], *values] if labels else values)
    return buf.getvalue()
