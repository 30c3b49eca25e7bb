"""The ``gpchol`` command line end to end: fit, predict, the files written, Ctrl-C.

The commands run in-process through :func:`gpchol.cli.main` (no interpreter start-up per
call); one test runs the real command in a subprocess to send it SIGINT. Bad input and
hostile files are in ``test_cli_errors.py``.
"""

from __future__ import annotations

import csv
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest
from helpers import assert_same_saved_files

from gpchol import load
from gpchol._internal import persist_module
from gpchol.cli import main
from gpchol.cli.model import Model
from gpchol.cli.spec import ModelSpec


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Runs ``gpchol ARGS`` in-process: ``(exit status, stdout, stderr)``."""
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def in_tmp(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPCHOL_DEBUG", raising=False)
    return tmp_path


@pytest.fixture
def umask_027() -> object:
    old = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(old)


def no_temp_files(d: pathlib.Path) -> bool:
    return not [p for p in os.listdir(d) if p.startswith((".tmp-", ".gpchol-probe-"))]


@pytest.mark.slow
def test_fit_default_co2_then_predict(
    in_tmp: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = cli(capsys, "fit", "--steps", "3", "--out", "m.json")
    assert rc == 0, err
    assert "Traceback" not in err
    assert "log marginal likelihood" in out
    assert "ppm" in out and "years" in out
    assert "loss" in err  # progress
    assert "needs about" not in out  # n=521: no estimate printed
    saved = json.loads((in_tmp / "m.json").read_text())  # a gpchol.save file ...
    assert saved["format"] == "gpchol" and "jax" in saved["versions"]
    m = load(in_tmp / "m.json")  # ... whose content gpchol.load returns
    assert m["format"] == "gpchol-fit" and m["kernel"]["spec"] == "co2"
    assert m["data"]["n"] == 521 and len(m["data"]["sha256"]) == 64
    assert m["data"]["X"].shape == (521, 1) and m["data"]["X"].dtype == np.float64
    assert np.isfinite(m["log_marginal_likelihood"])
    assert {"long.lengthscale", "noise"} <= set(m["params"])
    png = (in_tmp / "m.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000

    (in_tmp / "new.csv").write_text("t\n1990.5\n2005.0\n")
    rc, out, err = cli(capsys, "predict", "--model", "m.json", "--csv", "new.csv")
    assert rc == 0, err
    rows = list(csv.DictReader(out.splitlines()))
    assert [r["t"] for r in rows] == ["1990.5", "2005.0"]
    mean = [float(r["mean"]) for r in rows]
    std = [float(r["std"]) for r in rows]
    assert 345 < mean[0] < 365 and 360 < mean[1] < 395  # ppm
    assert std[0] < std[1]  # extrapolation is less certain
    rc, _, err = cli(capsys, "predict", "--model", "m.json", "--csv", "new.csv", "--out", "p.csv")
    assert rc == 0 and (in_tmp / "p.csv").read_text().startswith("t,mean,std,std_y")
    assert no_temp_files(in_tmp)


def test_fit_csv_and_predict_files_follow_the_umask(
    in_tmp: pathlib.Path, capsys: pytest.CaptureFixture[str], umask_027: object
) -> None:
    rng = np.random.default_rng(0)
    x = np.sort(rng.uniform(0, 6, 30))
    lines = ["x,z,target"] + [
        f"{a},{b},{np.sin(a) + 0.1 * b + 0.05 * rng.standard_normal()}"
        for a, b in zip(x, rng.standard_normal(30), strict=True)
    ]
    (in_tmp / "d.csv").write_text("\n".join(lines) + "\n")
    rc, _, err = cli(
        capsys,
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
        "--quiet",
        "--out",
        "f.json",
        "--checkpoint",
        "ck",
    )
    assert rc == 0, err
    assert (in_tmp / "ck.json").exists()  # the checkpoint's manifest
    assert not (in_tmp / "f.png").exists()
    assert os.stat(in_tmp / "f.json").st_mode & 0o777 == 0o640  # 0o666 & ~0o027
    rc, _, err = cli(capsys, "predict", "--model", "f.json", "--csv", "d.csv", "--out", "p.csv")
    assert rc == 0, err
    assert len((in_tmp / "p.csv").read_text().strip().splitlines()) == 31
    npz = [p for p in os.listdir(in_tmp) if p.startswith("f.") and p.endswith(".npz")]
    assert len(npz) == 1 and os.stat(in_tmp / npz[0]).st_mode & 0o777 == 0o640
    # the same model in the first format (one JSON file) predicts the same numbers
    model, params = Model.from_json("f.json")
    result = types.SimpleNamespace(n_steps=1, converged=False, success=True, message="")
    legacy = model.to_json(params, -1.0, result, {})  # type: ignore[arg-type]
    (in_tmp / "old.json").write_text(json.dumps(legacy))
    rc, _, err = cli(capsys, "predict", "--model", "old.json", "--csv", "d.csv", "--out", "q.csv")
    assert rc == 0, err
    assert (in_tmp / "q.csv").read_text() == (in_tmp / "p.csv").read_text()
    # a damaged arrays file: one line, naming the file
    (in_tmp / npz[0]).write_bytes((in_tmp / npz[0]).read_bytes()[:-2] + b"xx")
    rc, _, err = cli(capsys, "predict", "--model", "f.json", "--csv", "d.csv")
    assert rc == 2 and "Traceback" not in err
    assert "f.json" in err and "does not match the recorded sha256" in err
    assert os.stat(in_tmp / "p.csv").st_mode & 0o777 == 0o640
    assert no_temp_files(in_tmp)


def test_dropna_drops_the_bad_rows(
    in_tmp: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (in_tmp / "nan.csv").write_text("a,b\n1,2\n2,nan\n3,4\ninf,5\n6,7\n7,8\n")
    rc, out, err = cli(
        capsys,
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
    )
    assert rc == 0, err
    assert "dropping 2 row(s)" in err
    assert "4 rows" in out


def test_huge_x_values_are_standardized_not_ignored(
    in_tmp: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # x near 1e200 used to overflow the std to inf: every standardized x became 0 and the
    # fit ignored x (a flat prediction). Now the fit sees x: predictions follow y.
    x = np.arange(12.0)
    y = np.where(x < 6, -1.0, 1.0)
    rows = "".join(f"{float(a) * 1e200!r},{float(b)}\n" for a, b in zip(x, y, strict=True))
    (in_tmp / "big.csv").write_text("x,y\n" + rows)
    # (the plot is drawn: its grid, 10% beyond the last x, must be representable too)
    rc, out, err = cli(
        capsys, "fit", "--csv", "big.csv", "--x", "x", "--y", "y", "--steps", "2", "--quiet"
    )
    assert rc in (0, 1), err  # 1: the fit did not meet the tolerance in 2 steps
    assert "Traceback" not in err
    m = load(in_tmp / "gpchol-fit.json")
    assert (
        np.isfinite(m["standardization"]["x_scale"][0]) and m["standardization"]["x_scale"][0] > 0
    )
    (in_tmp / "new.csv").write_text("x\n1e200\n1e201\n")
    rc, out, err = cli(capsys, "predict", "--csv", "new.csv")
    assert rc == 0, err
    mean = [float(r["mean"]) for r in csv.DictReader(out.splitlines())]
    assert mean[0] < -0.5 < 0.5 < mean[1]


def _sigint_as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


# slow: a fresh interpreter imports JAX and compiles the fit before the signal (the
# in-process interrupt tests of tests/test_cli_errors.py stay in the everyday tier)
@pytest.mark.slow
def test_sigint_prints_interrupted_and_exits_130(tmp_path: pathlib.Path) -> None:
    (tmp_path / "d.csv").write_text("a,b\n" + "".join(f"{i},{(i * 7) % 5}\n" for i in range(8)))
    env = dict(os.environ)
    env.pop("GPCHOL_DEBUG", None)
    args = ["fit", "--csv", "d.csv", "--x", "a", "--y", "b", "--optimizer", "adam"]
    args += ["--steps", "100000000", "--tol", "0", "--no-plot", "--checkpoint", "ck"]
    args += ["--checkpoint-every", "5", "--quiet"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpchol.cli", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # as from a terminal: SIGINT delivered (a test runner may have it ignored or
        # blocked, which the child would inherit)
        preexec_fn=_sigint_as_in_a_terminal,
    )
    try:
        deadline = time.monotonic() + 180
        while not (tmp_path / "ck.json").exists():  # the fit's steps are running
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the fit did not start"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, (
        f"exit {proc.returncode}; stderr {err!r}; the test process's SIGINT handler "
        f"{signal.getsignal(signal.SIGINT)!r}, blocked "
        f"{signal.pthread_sigmask(signal.SIG_BLOCK, set())}"
    )
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[-1].startswith("gpchol: interrupted"), err


# ------------------------------------------------- files written before the shared protocol

FIXTURES = pathlib.Path(__file__).parent / "data" / "persist"


def fixture_model() -> tuple[Model, dict[str, np.ndarray]]:
    """The model and parameters in ``tests/data/persist/model.json`` (README there)."""
    X = np.array([[0.0, 1.0], [0.5, -1.0], [1.0, 2.0], [2.0, 0.25], [3.5, 0.0]])
    y = np.array([1.0, 0.5, -0.25, 2.0, 1.5])
    model = Model.standardized(ModelSpec.parse("rbf+white", 2), X, y, ["a", "b"], "y")
    params = {k: np.asarray(v, np.float64) * 1.5 for k, v in model.spec.init_params().items()}
    return model, params


FIXTURE_RESULT = types.SimpleNamespace(n_steps=3, converged=False, success=True, message="m")
FIXTURE_ARGS = {"optimizer": "lbfgs", "steps": 3, "dtype": "float64"}


def test_model_file_written_before_the_shared_protocol(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model file written before the one file protocol (gpchol._base.store) reads back
    whole, and writing the same model gives the same files."""
    model, params = fixture_model()
    old = FIXTURES / "model.json"
    back, back_params = Model.from_json(str(old))
    for f in ("X", "y", "x_shift", "x_scale"):
        np.testing.assert_array_equal(getattr(back, f), getattr(model, f), err_msg=f)
    assert (back.y_shift, back.y_scale) == (model.y_shift, model.y_scale)
    assert (back.x_names, back.y_name, back.spec.spec) == (["a", "b"], "y", "rbf+white")
    assert set(back_params) == set(params)
    for k, v in params.items():
        assert back_params[k].tobytes() == v.tobytes(), k
    recorded = json.loads(old.read_text())["versions"]
    monkeypatch.setattr(persist_module, "versions", lambda: dict(recorded))
    model.save(str(tmp_path / "model.json"), params, -1.5, FIXTURE_RESULT, FIXTURE_ARGS)  # type: ignore[arg-type]
    assert_same_saved_files(tmp_path / "model.json", old)
    assert len(os.listdir(tmp_path)) == 2


@pytest.mark.slow  # a fresh interpreter
def test_python_dash_m_gpchol_is_the_command(tmp_path: pathlib.Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpchol", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith("usage: gpchol") and "predict" in out


# ------------------------------------------------------------- the order of the outputs


def _sine_csv(d: pathlib.Path, scale: float = 1.0) -> None:
    x = np.linspace(0.0, 6.0, 20)
    rows = "".join(f"{float(a)!r},{float(scale * np.sin(a))!r}\n" for a in x)
    (d / "d.csv").write_text("x,y\n" + rows)


def test_no_plot_of_two_input_columns_and_no_claim_of_one(
    in_tmp: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the note said no plot, then "wrote m.png" of a file that was never written
    x = np.linspace(0.0, 6.0, 12)
    rows = "".join(f"{a:.6f},{a / 2:.6f},{np.sin(a):.6f}\n" for a in x)
    (in_tmp / "d.csv").write_text("a,b,y\n" + rows)
    rc, out, err = cli(capsys, "fit", "--csv", "d.csv", "--x", "a,b", "--y", "y", "--steps", "2")
    assert rc in (0, 1), err
    assert "no plot for inputs with more than one column" in err
    assert "wrote gpchol-fit.json" in out and "png" not in out
    assert not (in_tmp / "gpchol-fit.png").exists()


def test_failed_plot_is_a_warning_after_the_model_is_saved(
    in_tmp: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # e.g. data of 1.5e308 * sin(x): the plot's arithmetic overflows ("Singular matrix")
    from gpchol.cli import plotting

    def overflow(*args: object, **kwargs: object) -> None:
        raise np.linalg.LinAlgError("Singular matrix")

    monkeypatch.setattr(plotting, "plot_fit", overflow)
    _sine_csv(in_tmp)
    fit = ["fit", "--csv", "d.csv", "--x", "x", "--y", "y", "--steps", "3", "--quiet"]
    rc, out, err = cli(capsys, *fit, "--out", "m.json")
    assert rc in (0, 1), err  # as the fit ended (1: not converged in 3 steps)
    assert "Traceback" not in err
    warning = [ln for ln in err.splitlines() if ln.startswith("gpchol: warning:")]
    assert len(warning) == 1 and "m.png" in warning[0] and "Singular matrix" in warning[0], err
    assert "gpchol: error" not in err
    assert "wrote m.json" in out
    assert load(in_tmp / "m.json")["data"]["n"] == 20  # the fitted model is kept
    assert not (in_tmp / "m.png").exists() and no_temp_files(in_tmp)


@pytest.fixture
def _sigint_raises() -> object:
    """SIGINT raising KeyboardInterrupt, as in a terminal (a test run in the background
    of a non-interactive shell inherits it ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_resumed_fit_times_only_the_steps_it_ran(
    in_tmp: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    _sigint_raises: object,
) -> None:
    from gpchol.cli import commands

    _sine_csv(in_tmp)
    fit = ["fit", "--csv", "d.csv", "--x", "x", "--y", "y", "--no-plot", "--quiet"]
    fit += ["--optimizer", "adam", "--steps", "8", "--tol", "0", "--checkpoint", "ck"]
    real_fit = commands.gpchol.fit

    def interrupted_at_step_3(*args: object, **kwargs: object) -> object:
        def send(step: int, params: object, loss: float) -> None:
            if step == 3:
                os.kill(os.getpid(), signal.SIGINT)

        return real_fit(*args, callback=send, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(commands.gpchol, "fit", interrupted_at_step_3)
    rc, _, err = cli(capsys, *fit)
    assert rc == 130, err
    assert json.loads((in_tmp / "ck.json").read_text())["state"]["step"] == 3
    monkeypatch.setattr(commands.gpchol, "fit", real_fit)

    class Clock:  # 10 s of steps: 2000 ms for each of the 5 steps run here
        seconds, wall = 1.0, 11.0

        def __enter__(self) -> Clock:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    monkeypatch.setattr(commands, "CompileClock", Clock)
    rc, out, err = cli(capsys, *fit, "--resume")
    assert rc == 0, err
    line = next(x for x in out.splitlines() if x.startswith("log marginal likelihood"))
    assert "2000.0 ms/step" in line, line  # not 10 s / 8 = 1250.0 ms
    assert "(8 steps, 5 of them here after resuming at step 3;" in line, line
    info = load(in_tmp / "gpchol-fit.json")["fit"]
    assert info["n_steps"] == 8 and info["step_seconds"] == 10.0
    assert info["steps_run"] == 5 and info["resumed_at_step"] == 3


def test_resume_without_a_checkpoint_yet_says_so(
    in_tmp: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--resume`` with a checkpoint path that has no checkpoint (a typo, or a first run)
    starts a new fit, as the library does, and a note on stderr says so."""
    _sine_csv(in_tmp)
    rc, _, err = cli(
        capsys,
        *("fit", "--csv", "d.csv", "--x", "x", "--y", "y", "--no-plot", "--quiet"),
        *("--steps", "3", "--checkpoint", "typo", "--resume"),
    )
    assert rc in (0, 1), err
    assert "no checkpoint at typo yet (no typo.json); --resume starts a new fit" in err
    rc, _, err = cli(
        capsys,
        *("fit", "--csv", "d.csv", "--x", "x", "--y", "y", "--no-plot", "--quiet"),
        *("--steps", "3", "--checkpoint", "typo", "--resume"),
    )
    assert "no checkpoint" not in err  # the first run wrote it
