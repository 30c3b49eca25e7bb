"""The ``gpchol`` command line end to end (subprocesses): fit, predict and bad input."""

from __future__ import annotations

import csv
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

CompletedRun = subprocess.CompletedProcess[str]


def run(args: list[str], cwd: pathlib.Path, timeout: float = 300) -> CompletedRun:
    env = dict(os.environ)
    env.pop("GPCHOL_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "gpchol.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def assert_clean_error(proc: CompletedRun, *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gpchol: error:")
    for w in words:
        assert w in lines[0], lines[0]


@pytest.fixture(scope="module")
def co2_fit(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, CompletedRun]:
    d = tmp_path_factory.mktemp("co2")
    proc = run(["fit", "--steps", "3", "--out", "m.json"], cwd=d)
    return d, proc


def test_fit_default_co2(co2_fit: tuple[pathlib.Path, CompletedRun]) -> None:
    d, proc = co2_fit
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "log marginal likelihood" in proc.stdout
    assert "ppm" in proc.stdout and "years" in proc.stdout
    assert "loss" in proc.stderr  # progress
    m = json.loads((d / "m.json").read_text())
    assert m["format"] == "gpchol-fit" and m["kernel"]["spec"] == "co2"
    assert m["data"]["n"] == 521 and len(m["data"]["sha256"]) == 64
    assert np.isfinite(m["log_marginal_likelihood"]) and "jax" in m["versions"]
    assert {"long.lengthscale", "noise"} <= set(m["params"])
    png = (d / "m.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_predict_from_the_fitted_model(co2_fit: tuple[pathlib.Path, CompletedRun]) -> None:
    d, _ = co2_fit
    (d / "new.csv").write_text("t\n1990.5\n2005.0\n")
    proc = run(["predict", "--model", "m.json", "--csv", "new.csv"], cwd=d)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(proc.stdout.splitlines()))
    assert [r["t"] for r in rows] == ["1990.5", "2005.0"]
    m = [float(r["mean"]) for r in rows]
    s = [float(r["std"]) for r in rows]
    assert 345 < m[0] < 365 and 360 < m[1] < 395  # ppm
    assert s[0] < s[1]  # extrapolation is less certain
    proc = run(["predict", "--model", "m.json", "--csv", "new.csv", "--out", "p.csv"], cwd=d)
    assert proc.returncode == 0 and (d / "p.csv").read_text().startswith("t,mean,std,std_y")


def test_fit_csv_and_predict(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(0)
    x = np.sort(rng.uniform(0, 6, 30))
    lines = ["x,z,target"] + [
        f"{a},{b},{np.sin(a) + 0.1 * b + 0.05 * rng.standard_normal()}"
        for a, b in zip(x, rng.standard_normal(30), strict=True)
    ]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    proc = run(
        [
            "fit",
            "--csv",
            "d.csv",
            "--x",
            "x,z",
            "--y",
            "target",
            "--kernel",
            "matern52+white",
            "--steps",
            "5",
            "--no-plot",
            "--out",
            "f.json",
            "--checkpoint",
            "ck",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "ck.json").exists() and (tmp_path / "ck.npz").exists()
    proc = run(["predict", "--model", "f.json", "--csv", "d.csv"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip().splitlines()) == 31


@pytest.fixture
def csvs(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "ok.csv").write_text("a,b\n" + "".join(f"{i},{i * i}\n" for i in range(6)))
    (tmp_path / "text.csv").write_text("a,b\n1,2\n2,abc\n3,4\n")
    (tmp_path / "nan.csv").write_text("a,b\n1,2\n2,nan\n3,4\ninf,5\n6,7\n7,8\n")
    (tmp_path / "few.csv").write_text("a,b\n1,2\n2,3\n")
    return tmp_path


@pytest.mark.parametrize(
    "args, words",
    [
        (["fit", "--csv", "nope.csv", "--x", "a", "--y", "b"], ["no such file", "nope.csv"]),
        (["fit", "--csv", "ok.csv", "--x", "a", "--y", "c"], ["'c'", "a, b"]),
        (["fit", "--csv", "text.csv", "--x", "a", "--y", "b"], ["non-numeric", "'abc'", "row 2"]),
        (["fit", "--csv", "nan.csv", "--x", "a", "--y", "b"], ["row(s) 2, 4", "--dropna"]),
        (
            ["fit", "--csv", "ok.csv", "--x", "a", "--y", "b", "--kernel", "rbf+foo"],
            ["unknown kernel name 'foo'", "matern52", "periodic"],
        ),
        (["fit", "--csv", "few.csv", "--x", "a", "--y", "b"], ["too few points"]),
        (["predict", "--model", "missing.json", "--csv", "ok.csv"], ["no such model file"]),
    ],
    ids=[
        "missing-file",
        "missing-column",
        "non-numeric",
        "nan-rows",
        "unknown-kernel",
        "too-few",
        "missing-model",
    ],
)
def test_bad_input_one_line_no_traceback(
    csvs: pathlib.Path, args: list[str], words: list[str]
) -> None:
    assert_clean_error(run(args, cwd=csvs, timeout=120), *words)


def test_dropna_drops_the_bad_rows(csvs: pathlib.Path) -> None:
    proc = run(
        [
            "fit",
            "--csv",
            "nan.csv",
            "--x",
            "a",
            "--y",
            "b",
            "--dropna",
            "--steps",
            "2",
            "--no-plot",
            "--quiet",
        ],
        cwd=csvs,
    )
    assert proc.returncode == 0, proc.stderr
    assert "dropping 2 row(s)" in proc.stderr
    assert "4 rows" in proc.stdout
