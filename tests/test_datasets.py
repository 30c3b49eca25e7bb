"""Shipped data sets: files present as package data, shapes, values, options, errors."""

import importlib.resources

import numpy as np
import pytest

from gpchol.datasets import DATASETS, Dataset, load


def test_data_files_are_package_resources():
    data = importlib.resources.files("gpchol.datasets").joinpath("data")
    names = {entry.name for entry in data.iterdir()}
    assert {"mauna_loa_co2_weekly.csv", "diamonds.csv.gz", "README.md"} <= names
    readme = data.joinpath("README.md").read_text(encoding="utf-8")
    assert "public domain" in readme and "MIT" in readme


def test_co2_weekly():
    d = load("co2")
    assert isinstance(d, Dataset)
    assert d.X.shape == (2225, 1) and d.y.shape == (2225,)
    assert d.X.dtype == np.float64 and d.y.dtype == np.float64
    assert np.all(np.isfinite(d.y))
    t = d.columns["t"]
    assert np.all(np.diff(t) > 0)
    assert t[0] == pytest.approx(1958 + 87 / 365)  # 1958-03-29 is day 88
    assert 2001.99 < t[-1] < 2002.0
    assert d.columns["date"][0] == 19580329 and d.columns["date"][-1] == 20011229
    assert 310 < d.y.min() < 320 and 370 < d.y.max() < 380
    assert d.y[0] == 316.1
    assert d.feature_names == ("t",) and d.target_name == "co2"
    assert "dropped" in d.description


def test_co2_weekly_keep_missing():
    d = load("co2", dropna=False)
    assert d.y.shape == (2284,)
    assert int(np.isnan(d.y).sum()) == 59


def test_co2_monthly():
    d = load("co2", monthly=True)
    # 1958-03 .. 2001-12 is 526 months; 5 of them have no weekly value
    assert d.X.shape == (521, 1)
    assert np.all(np.isfinite(d.y))
    assert d.columns["year"][0] == 1958 and d.columns["month"][0] == 3
    assert d.columns["year"][-1] == 2001 and d.columns["month"][-1] == 12
    np.testing.assert_allclose(d.columns["t"][0], 1958 + 2.5 / 12)
    assert np.all(np.diff(d.columns["t"]) > 0)
    # a month is the mean of its weekly values
    weekly = load("co2")
    dates = weekly.columns["date"]
    in_month = (dates // 100) == 198501
    i = np.flatnonzero((d.columns["year"] == 1985) & (d.columns["month"] == 1))[0]
    assert d.columns["n_weeks"][i] == in_month.sum()
    np.testing.assert_allclose(d.y[i], weekly.y[in_month].mean())
    assert d.columns["n_weeks"].sum() == 2225


def test_co2_monthly_keep_missing():
    d = load("co2", monthly=True, dropna=False)
    assert d.y.shape == (526,)
    missing = np.isnan(d.y)
    assert missing.sum() == 5
    months = set(zip(d.columns["year"][missing], d.columns["month"][missing], strict=True))
    assert months == {(1958, 6), (1958, 10), (1964, 2), (1964, 3), (1964, 4)}


def test_loads_return_fresh_arrays():
    a = load("co2")
    a.y[:] = 0.0
    a.columns["t"][:] = 0.0
    b = load("co2")
    assert b.y[0] == 316.1 and b.columns["t"][0] > 1958


def test_diamonds_full():
    d = load("diamonds")
    assert d.X.shape == (53940, 6) and d.y.shape == (53940,)
    assert d.feature_names == ("carat", "depth", "table", "x", "y", "z")
    assert d.target_name == "log_price"
    c = d.columns
    np.testing.assert_allclose(d.y, np.log(c["price"]))
    assert c["carat"][0] == 0.23 and c["price"][0] == 326.0
    assert c["cut"][0] == "Ideal" and c["color"][0] == "E" and c["clarity"][0] == "SI2"
    assert c["cut_code"][0] == 4 and c["color_code"][0] == 1 and c["clarity_code"][0] == 1
    assert set(np.unique(c["cut"])) == {"Fair", "Good", "Very Good", "Premium", "Ideal"}
    assert c["cut_code"].min() == 0 and c["cut_code"].max() == 4
    assert c["clarity_code"].max() == 7 and c["color_code"].max() == 6
    assert np.all(np.isfinite(d.X))
    assert int(np.sum((c["x"] == 0) | (c["y"] == 0) | (c["z"] == 0))) == 20
    assert int(np.sum(c["cut"] == "Ideal")) == 21551


def test_diamonds_subsample_is_seeded():
    a = load("diamonds", n=500, seed=1)
    b = load("diamonds", n=500, seed=1)
    c = load("diamonds", n=500, seed=2)
    assert a.X.shape == (500, 6) and a.columns["cut"].shape == (500,)
    np.testing.assert_array_equal(a.X, b.X)
    assert not np.array_equal(a.X, c.X)
    # the rows are rows of the full data, in file order
    full = load("diamonds")
    rows = {tuple(r) for r in np.column_stack([full.X, full.columns["price"]])}
    assert all(tuple(r) in rows for r in np.column_stack([a.X, a.columns["price"]]))


@pytest.mark.parametrize("n", [0, -3, 53941, 2.5, True])
def test_diamonds_bad_n(n):
    with pytest.raises(ValueError, match="n"):
        load("diamonds", n=n)


def test_unknown_name_and_option():
    with pytest.raises(ValueError, match="known: co2, diamonds"):
        load("iris")
    with pytest.raises(TypeError):
        load("co2", n=10)
    assert DATASETS == ("co2", "diamonds")
    assert load("CO2", monthly=True).y.shape == (521,)


def test_dataset_attribute_access():
    d = load("co2", monthly=True)
    assert d.X is d["X"]
    with pytest.raises(AttributeError, match="no field 'nope'"):
        _ = d.nope
    assert "X" in dir(d)
