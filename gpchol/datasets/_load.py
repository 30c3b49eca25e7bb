"""Loaders for the data sets in ``gpchol/datasets/data`` (NumPy, csv and gzip only)."""

from __future__ import annotations

import csv
import datetime
import functools
import gzip
import importlib.resources
import io
from collections.abc import Callable
from typing import IO, Any

import numpy as np

from gpchol._base.validate import check_int

__all__ = ["DATASETS", "Dataset", "load"]

DATASETS: tuple[str, ...] = ("co2", "diamonds")
"""The names :func:`load` knows."""

_CO2_FILE = "mauna_loa_co2_weekly.csv"
_DIAMONDS_FILE = "diamonds.csv.gz"

# ggplot2's (ordered) factor levels, worst to best for cut and clarity, D (best) to J
# (worst) for color; the codes are the positions in these tuples.
CUT_LEVELS = ("Fair", "Good", "Very Good", "Premium", "Ideal")
COLOR_LEVELS = ("D", "E", "F", "G", "H", "I", "J")
CLARITY_LEVELS = ("I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF")


class Dataset(dict):
    """A dict of NumPy arrays (and a few strings) whose keys are also attributes.

    Every data set has ``X`` (``(n, d)`` float64 features), ``y`` (``(n,)`` float64
    target), ``feature_names`` (tuple of ``d`` strings), ``target_name``, ``columns``
    (a dict of every column, ``(n,)`` each) and ``description``.
    """

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(
                f"this data set has no field {name!r}; its fields: {sorted(self)}"
            ) from None

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self))


def _open_data(filename: str) -> IO[bytes]:
    resource = importlib.resources.files("gpchol.datasets").joinpath("data", filename)
    return resource.open("rb")


def _decimal_year(yyyymmdd: int) -> float:
    """``year + (day of year - 1) / (days in year)``: 0h of the given date."""
    year, month, day = yyyymmdd // 10000, (yyyymmdd // 100) % 100, yyyymmdd % 100
    date = datetime.date(year, month, day)
    start = datetime.date(year, 1, 1)
    days = (datetime.date(year + 1, 1, 1) - start).days
    return year + (date - start).days / days


@functools.lru_cache(maxsize=1)
def _read_co2() -> tuple[np.ndarray, np.ndarray]:
    """The weekly file as ``(date int64 YYYYMMDD, co2 float64 with NaN where missing)``."""
    dates, values = [], []
    with _open_data(_CO2_FILE) as raw, io.TextIOWrapper(raw, encoding="utf-8") as text:
        reader = csv.reader(text)
        header = next(reader)
        if header != ["date", "co2"]:
            raise RuntimeError(f"unexpected header in {_CO2_FILE}: {header}")
        for row in reader:
            dates.append(int(row[0]))
            values.append(float(row[1]) if row[1].strip() else np.nan)
    return np.asarray(dates, dtype=np.int64), np.asarray(values, dtype=np.float64)


def _load_co2(*, monthly: bool = False, dropna: bool = True) -> Dataset:
    dates, co2 = _read_co2()
    dates, co2 = dates.copy(), co2.copy()
    if monthly:
        year, month = dates // 10000, (dates // 100) % 100
        keys = year * 12 + (month - 1)
        present = ~np.isnan(co2)
        # every calendar month from the first to the last in the file
        all_keys = np.arange(keys.min(), keys.max() + 1)
        slot = keys - keys.min()
        sums = np.bincount(slot[present], weights=co2[present], minlength=all_keys.size)
        counts = np.bincount(slot[present], minlength=all_keys.size)
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
        years, months = all_keys // 12, all_keys % 12 + 1
        t = years + (months - 0.5) / 12.0
        if dropna:
            keep = counts > 0
            years, months, t = years[keep], months[keep], t[keep]
            means, counts = means[keep], counts[keep]
        columns = {
            "t": t.astype(np.float64),
            "co2": means,
            "year": years.astype(np.int64),
            "month": months.astype(np.int64),
            "n_weeks": counts.astype(np.int64),
        }
        description = (
            "Monthly mean atmospheric CO2 (ppmv) at Mauna Loa, 1958-03 to 2001-12: the mean "
            "of the weekly values dated in each calendar month. t is the middle of the "
            "month in decimal years, year + (month - 0.5) / 12. "
            + (
                "Months without any weekly value (1958-06, 1958-10, 1964-02..04) are "
                "dropped: 521 of the 526 months remain."
                if dropna
                else "All 526 months; months without data have co2 = NaN and n_weeks = 0."
            )
            + " Source: Keeling & Whorf, Scripps (CDIAC), public domain."
        )
    else:
        t = np.array([_decimal_year(int(d)) for d in dates], dtype=np.float64)
        if dropna:
            keep = ~np.isnan(co2)
            dates, co2, t = dates[keep], co2[keep], t[keep]
        columns = {"t": t, "co2": co2, "date": dates}
        description = (
            "Weekly mean atmospheric CO2 (ppmv) at Mauna Loa, 1958-03-29 to 2001-12-29. t is "
            "the date in decimal years, year + (day of year - 1) / (days in that year). "
            + (
                "The 59 weeks without a value are dropped: 2225 of 2284 rows remain."
                if dropna
                else "All 2284 weeks; the 59 without a value have co2 = NaN."
            )
            + " Source: Keeling & Whorf, Scripps (CDIAC), public domain."
        )
    return Dataset(
        X=columns["t"][:, None].copy(),
        y=columns["co2"].copy(),
        feature_names=("t",),
        target_name="co2",
        columns=columns,
        description=description,
    )


@functools.lru_cache(maxsize=1)
def _read_diamonds() -> dict[str, np.ndarray]:
    with (
        _open_data(_DIAMONDS_FILE) as raw,
        gzip.open(raw, "rt", encoding="utf-8", newline="") as text,
    ):
        reader = csv.reader(text)
        header = next(reader)
        rows = list(reader)
    expected = ["carat", "cut", "color", "clarity", "depth", "table", "price", "x", "y", "z"]
    if header != expected:
        raise RuntimeError(f"unexpected header in {_DIAMONDS_FILE}: {header}")
    cols = list(zip(*rows, strict=True))
    out: dict[str, np.ndarray] = {}
    for name, values in zip(header, cols, strict=True):
        if name in ("cut", "color", "clarity"):
            out[name] = np.asarray(values, dtype=str)
        else:
            out[name] = np.asarray(values, dtype=np.float64)
    for name, levels in (("cut", CUT_LEVELS), ("color", COLOR_LEVELS), ("clarity", CLARITY_LEVELS)):
        lookup = {level: code for code, level in enumerate(levels)}
        out[f"{name}_code"] = np.asarray([lookup[v] for v in out[name]], dtype=np.int64)
    return out


_DIAMOND_FEATURES = ("carat", "depth", "table", "x", "y", "z")


def _load_diamonds(*, n: int | None = None, seed: int = 0) -> Dataset:
    raw = _read_diamonds()
    total = raw["carat"].shape[0]
    if n is None:
        index = np.arange(total)
    else:
        n = check_int(n, "n", "rows to load, or None for all", strict=False)
        if n > total:
            raise ValueError(f"n={n} is more than the {total} rows of the diamonds data")
        rng = np.random.default_rng(seed)
        index = np.sort(rng.choice(total, size=int(n), replace=False))
    columns = {name: values[index].copy() for name, values in raw.items()}
    X = np.stack([columns[name] for name in _DIAMOND_FEATURES], axis=1)
    description = (
        f"{index.size} of the 53,940 round-cut diamonds of ggplot2 (MIT licence, via "
        "plotnine). X holds carat, depth (%), table (%), x, y, z (mm) as float64; y is "
        "log(price in USD). columns also holds price, the categoricals cut, color and "
        "clarity as strings and as ordered integer codes (cut_code 0=Fair..4=Ideal, "
        "color_code 0=D..6=J, clarity_code 0=I1..7=IF). 20 rows have a zero x, y or z "
        "(unmeasured); they are kept."
        + ("" if n is None else f" Rows drawn without replacement with seed {seed}, in file order.")
    )
    return Dataset(
        X=X,
        y=np.log(columns["price"]),
        feature_names=_DIAMOND_FEATURES,
        target_name="log_price",
        columns=columns,
        description=description,
    )


def load(name: str, **options: Any) -> Dataset:
    """Loads one of the data sets shipped with gpchol.

    Args:
        name: ``"co2"`` or ``"diamonds"`` (see :data:`DATASETS`).
        **options: for ``"co2"``:

            * ``monthly`` (bool, default False): monthly means (of the weekly values dated
              in each calendar month) instead of the weekly series.
            * ``dropna`` (bool, default True): drop the weeks (months) without a value;
              with False they are kept with ``co2 = NaN``.

            For ``"diamonds"``:

            * ``n`` (int or None, default None): a random subsample of ``n`` rows, drawn
              without replacement and returned in file order; ``None`` for all 53,940.
            * ``seed`` (int, default 0): the seed of that subsample.

    Returns:
        A :class:`Dataset` (a dict with attribute access) holding NumPy arrays:

        * ``"co2"``: ``X`` ``(n, 1)`` time in decimal years, ``y`` ``(n,)`` CO2 in ppmv;
          ``columns`` has ``t``, ``co2`` and ``date`` (int YYYYMMDD; weekly) or ``year``,
          ``month``, ``n_weeks`` (monthly). Weekly: 2,225 rows (the 59 missing weeks of
          2,284 dropped); monthly: 521 rows (1958-03 to 2001-12 is 526 months, 5 of
          which have no data). Weekly ``t`` is the date, ``year + (day of year - 1) /
          (days in year)``; monthly ``t`` is mid-month, ``year + (month - 0.5) / 12``.
        * ``"diamonds"``: ``X`` ``(n, 6)`` carat, depth, table, x, y, z; ``y`` ``(n,)``
          log price; ``columns`` has every column, the categoricals ``cut``, ``color``,
          ``clarity`` as strings and ``cut_code``, ``color_code``, ``clarity_code`` as
          ordered integer codes.

    Raises:
        ValueError: for an unknown name (the message lists the known ones) or an invalid
            ``n``.
        TypeError: for an option the data set does not have.

    Example:
        >>> from gpchol.datasets import load
        >>> d = load("diamonds", n=100, seed=1)
        >>> d.X.shape, d.feature_names[0], d.target_name
        ((100, 6), 'carat', 'log_price')
    """
    loaders: dict[str, Callable[..., Dataset]] = {"co2": _load_co2, "diamonds": _load_diamonds}
    key = name.lower() if isinstance(name, str) else name
    if key not in loaders:
        raise ValueError(f"unknown data set {name!r}; known: {', '.join(DATASETS)}")
    return loaders[key](**options)
