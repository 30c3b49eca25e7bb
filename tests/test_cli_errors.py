"""Hostile but fair input to the ``gpchol`` command line: one line, no traceback.

Every user error must end the command with a non-zero status and exactly one line on
stderr (``gpchol: error: ...``) that names what is wrong, before any long computation.
All run in-process (:func:`gpchol.cli.main`), without a fit, in well under a second each.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import time
import types
import warnings
from typing import Any

import numpy as np
import pytest

from gpchol.cli import commands, group, main, resources
from gpchol.cli.errors import CLIError
from gpchol.cli.files import check_output, file_mode, write_file
from gpchol.cli.interrupt import InterruptWatch
from gpchol.cli.model import FORMAT_VERSION, Model
from gpchol.cli.spec import ModelSpec


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line(err: str, *words: str, prefix: str = "gpchol: error:") -> str:
    assert "Traceback" not in err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(prefix), lines[0]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def d(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPCHOL_DEBUG", raising=False)
    (tmp_path / "ok.csv").write_text("a,b\n" + "".join(f"{i},{i * i}\n" for i in range(6)))
    (tmp_path / "text.csv").write_text("a,b\n1,2\n2,abc\n3,4\n")
    (tmp_path / "nan.csv").write_text("a,b\n1,2\n2,nan\n3,4\ninf,5\n6,7\n7,8\n")
    (tmp_path / "few.csv").write_text("a,b\n1,2\n2,3\n")
    (tmp_path / "dup.csv").write_text("a,b,a\n" + "".join(f"{i},{i % 3},{-i}\n" for i in range(6)))
    (tmp_path / "afile").write_text("not a directory")
    (tmp_path / "adir").mkdir()
    return tmp_path


CSV = ["--csv", "ok.csv", "--x", "a", "--y", "b"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["fit", "--csv", "nope.csv", "--x", "a", "--y", "b"], ["no such file", "nope.csv"]),
        (["fit", "--csv", "ok.csv", "--x", "a", "--y", "c"], ["'c'", "a, b"]),
        (["fit", "--csv", "text.csv", "--x", "a", "--y", "b"], ["non-numeric", "'abc'", "row 2"]),
        (["fit", "--csv", "nan.csv", "--x", "a", "--y", "b"], ["row(s) 2, 4", "--dropna"]),
        (["fit", *CSV, "--kernel", "rbf+foo"], ["unknown kernel name 'foo'", "matern52"]),
        (["fit", "--csv", "few.csv", "--x", "a", "--y", "b"], ["too few points"]),
        (["predict", "--model", "missing.json", "--csv", "ok.csv"], ["no such model file"]),
        (["fit", "--csv", "dup.csv", "--x", "a", "--y", "b"], ["'a' appears 2 times", "1, 3"]),
        (["fit", "--csv", "ok.csv", "--x", "a,a", "--y", "b"], ["'a' twice"]),
        (["fit", "--csv", "ok.csv", "--x", "a,a", "--y", "b", "--group", "b"], ["'a' twice"]),
        (["fit", "--csv", "ok.csv", "--x", "a", "--y", "a"], ["'a' is also an input column"]),
        (["fit", *CSV, "--out", "afile/m.json"], ["--out afile/m.json", "not a directory"]),
        (["fit", *CSV, "--out", "adir"], ["--out adir is a directory"]),
        (["fit", *CSV, "--out", "ok.csv"], ["--out ok.csv is the input CSV"]),
        (["fit", *CSV, "--out", "m.png"], ["plot would be written to the same file"]),
        (["fit", *CSV, "--out", "m.json", "--checkpoint", "m"], ["--checkpoint m.json", "--out"]),
        (["fit", *CSV, "--checkpoint", "afile/ck"], ["--checkpoint", "not a directory"]),
        (["predict", "--csv", "ok.csv", "--out", "ok.csv"], ["--out ok.csv is the input CSV"]),
        (["fit", "--steps", "abc"], ["--steps", "'abc' is not an integer", "gpchol fit --help"]),
        (["fit", "--steps", "-1"], ["--steps", "must be >= 0"]),
        (["fit", "--tol", "nan"], ["--tol", "finite"]),
        (["fit", "--learning-rate", "0"], ["--learning-rate", "> 0"]),
        (["fit", "--checkpoint-every", "0"], ["--checkpoint-every", ">= 1"]),
        (["fit", "--bogus"], ["unrecognized arguments: --bogus"]),
        (["frobnicate"], ["invalid choice", "frobnicate"]),
        (["predict"], ["--csv"]),
        (["fit", "--resume"], ["--resume needs --checkpoint"]),
        (["fit", "--csv", "ok.csv", "--x", "a", "--y", " "], ["--csv needs --x COLS", "--y COL"]),
        (["check", "--n", "0"], ["--n", "must be >= 1"]),
        (["check", "--n", "10000000"], ["needs about", "--no-memory-check"]),
    ],
    ids=lambda v: (
        "-".join(v)
        if isinstance(v, list) and v and v[0] in ("fit", "check", "predict", "frobnicate")
        else None
    ),
)
def test_user_error_is_one_line_before_any_work(
    d: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    words: list[str],
) -> None:
    # "before any work": the fit and the cost estimate are never reached (a call is
    # recorded, not timed)
    called: list[str] = []
    monkeypatch.setattr(commands, "announce_cost", lambda *a, **k: called.append("estimate"))
    monkeypatch.setattr(commands.gpchol, "fit", lambda *a, **k: called.append("fit"))
    monkeypatch.setattr(group, "fit_batched", lambda *a, **k: called.append("fit_batched"))
    rc, out, err = run_cli(capsys, *args)
    assert rc == 2, err
    assert_one_line(err, *words)
    assert "gpchol fit:" not in out  # refused before the fit started
    assert not called, called
    assert not [p for p in os.listdir(d) if p.startswith((".tmp-", ".gpchol-probe-"))]
    assert not (d / "gpchol-fit.json").exists()


# ------------------------------------------------------------------------- model files


@pytest.fixture
def model_file(d: pathlib.Path) -> dict[str, Any]:
    """A valid model file ``m.json`` (rbf+white, 2 inputs) written without a fit."""
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 5, (12, 2))
    y = np.sin(X[:, 0]) + 0.1 * X[:, 1]
    model = Model.standardized(ModelSpec.parse("rbf+white", 2), X, y, ["a", "b"], "y")
    result = types.SimpleNamespace(n_steps=0, converged=False, success=True, message="none")
    m = model.to_json(model.spec.init_params(), -1.0, result, {"optimizer": "lbfgs"})  # type: ignore[arg-type]
    (d / "m.json").write_text(json.dumps(m))
    (d / "new.csv").write_text("a,b\n1.0,2.0\n3.0,4.0\n")
    return m


def test_valid_model_file_predicts(
    model_file: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = run_cli(capsys, "predict", "--model", "m.json", "--csv", "new.csv")
    assert rc == 0, err
    assert out.splitlines()[0] == "a,b,mean,std,std_y" and len(out.splitlines()) == 3


def _drop(m: dict[str, Any], *keys: str) -> None:
    for k in keys[:-1]:
        m = m[k]
    del m[keys[-1]]


def _set(m: dict[str, Any], value: Any, *keys: str) -> None:
    for k in keys[:-1]:
        m = m[k]
    m[keys[-1]] = value


BAD_MODELS = {
    "missing-param": (
        lambda m: _drop(m, "params", "t0.rbf.lengthscale"),
        ["parameter 't0.rbf.lengthscale' is missing"],
    ),
    "unknown-param": (
        lambda m: _set(m, 1.0, "params", "t0.matern52.lengthscale"),
        ["unknown parameter"],
    ),
    "param-shape": (
        lambda m: _set(m, 1.0, "params", "t0.rbf.lengthscale"),
        ["'t0.rbf.lengthscale' has shape ()", "(2,)"],
    ),
    "param-nan": (lambda m: _set(m, float("nan"), "params", "noise"), ["'noise'", "non-finite"]),
    "param-negative": (lambda m: _set(m, -0.1, "params", "noise"), ["'noise' must be positive"]),
    "param-text": (lambda m: _set(m, "big", "params", "noise"), ["'noise' must be a number"]),
    "future-version": (
        lambda m: _set(m, FORMAT_VERSION + 1, "format_version"),
        ["format version 2", "upgrade gpchol"],
    ),
    "version-text": (
        lambda m: _set(m, "1", "format_version"),
        ["'format_version' must be an integer"],
    ),
    "no-version": (lambda m: _drop(m, "format_version"), ["'format_version' is missing"]),
    "other-format": (lambda m: _set(m, "something", "format"), ["not a gpchol model file"]),
    "no-kernel": (lambda m: _drop(m, "kernel"), ["'kernel' is missing"]),
    "bad-spec": (lambda m: _set(m, "rbf+nope", "kernel", "spec"), ["unknown kernel name 'nope'"]),
    "input-dim": (lambda m: _set(m, 3, "kernel", "input_dim"), ["shape"]),
    "learn-noise": (lambda m: _set(m, False, "kernel", "learn_noise"), ["'learn_noise' is False"]),
    "zero-scale": (
        lambda m: _set(m, [1.0, 0.0], "standardization", "x_scale"),
        ["'x_scale' must be positive"],
    ),
    "inf-y-scale": (
        lambda m: _set(m, 1e400, "standardization", "y_scale"),
        ["'y_scale' must be a finite positive"],
    ),
    "data-shape": (
        lambda m: _set(m, m["data"]["X"][:-1], "data", "X"),
        ["data 'X' has shape (11, 2)"],
    ),
    "ragged-data": (
        lambda m: _set(m, [[1.0], [1.0, 2.0]], "data", "X"),
        ["data 'X' must be a number"],
    ),
    "columns": (lambda m: _set(m, ["a"], "data", "x_columns"), ["'x_columns' must be a list of 2"]),
    "hash": (lambda m: _set(m, "0" * 64, "data", "sha256"), ["does not match its recorded sha256"]),
}


@pytest.mark.parametrize("name", list(BAD_MODELS))
def test_bad_model_file_is_one_line(
    d: pathlib.Path, model_file: dict[str, Any], capsys: pytest.CaptureFixture[str], name: str
) -> None:
    change, words = BAD_MODELS[name]
    change(model_file)
    (d / "m.json").write_text(json.dumps(model_file))
    rc, out, err = run_cli(capsys, "predict", "--model", "m.json", "--csv", "new.csv")
    assert rc == 2, err
    assert_one_line(err, "m.json", *words)
    assert out == ""


@pytest.mark.parametrize(
    "text, words",
    [
        ('{"format": "gpchol-fit", "format_ver', ["not valid JSON", "line 1", "truncated"]),
        ("[1, 2, 3]", ["not a gpchol model file"]),
        ("", ["not valid JSON"]),
        ("[" * 100_000 + "]" * 100_000, ["m.json"]),
    ],
    ids=["truncated", "list", "empty", "deep"],
)
def test_unreadable_model_file_is_one_line(
    d: pathlib.Path, capsys: pytest.CaptureFixture[str], text: str, words: list[str]
) -> None:
    (d / "new.csv").write_text("a\n1\n")
    (d / "m.json").write_text(text)
    rc, _, err = run_cli(capsys, "predict", "--model", "m.json", "--csv", "new.csv")
    assert rc == 2, err
    assert_one_line(err, *words)


# ----------------------------------------------------------------------- standardization


@pytest.mark.parametrize("scale", [1e-300, 1.0, 1e200, 1e306])
def test_standardization_cannot_overflow(scale: float) -> None:
    X = np.stack([np.arange(10.0) * scale, np.full(10, 5.0 * scale)], axis=1)
    y = np.arange(10.0)[::-1] * scale
    m = Model.standardized(ModelSpec.parse("rbf+white", 2), X, y, ["a", "b"], "y")
    for v in (m.x_shift, m.x_scale, m.y_shift, m.y_scale):
        assert np.all(np.isfinite(v))
    xs, ys = m.xs(X), m.ys(y)
    assert np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))
    np.testing.assert_allclose(xs[:, 0], (np.arange(10.0) - 4.5) / np.arange(10.0).std())
    np.testing.assert_allclose(xs[:, 1], 0.0, atol=1e-12)  # the constant column
    np.testing.assert_allclose(ys, -xs[:, 0])


def test_standardization_near_the_float_limit() -> None:
    X = np.array([[-1.7e308], [0.0], [1.7e308]])
    m = Model.standardized(ModelSpec.parse("rbf", 1), X, np.array([1.0, 2.0, 3.0]), ["a"], "y")
    xs = m.xs(X)[:, 0]
    assert np.all(np.isfinite(xs)) and xs[0] < 0 < xs[2] and abs(xs[1]) < 1e-12


def test_predict_refuses_inputs_that_overflow_the_standardization(
    model_file: dict[str, Any], d: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_file["standardization"]["x_scale"] = [1e-3, 1.0]  # 1e308 / 1e-3 overflows
    (d / "m.json").write_text(json.dumps(model_file))
    (d / "far.csv").write_text("a,b\n1.0,2.0\n1e308,-1e308\n")
    rc, _, err = run_cli(capsys, "predict", "--model", "m.json", "--csv", "far.csv")
    assert rc == 2, err
    assert_one_line(err, "data row 2 of far.csv", "too far")


# ---------------------------------------------------------------- memory and time estimate


def test_machine_memory_is_the_physical_memory_or_less() -> None:
    have = resources.machine_memory()
    assert have is not None and have > 2**27
    assert have <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_estimate_grows_as_n_squared_and_n_cubed() -> None:
    a = resources.estimate(10_000, 1, itemsize=8, matrices=3, flops_per_eval=3.0, rate=1e10)
    b = resources.estimate(20_000, 1, itemsize=8, matrices=3, flops_per_eval=3.0, rate=1e10)
    assert b.bytes - resources.RUNTIME_BYTES > 3.9 * (a.bytes - resources.RUNTIME_BYTES)
    assert b.seconds_per_eval == pytest.approx(8 * a.seconds_per_eval)
    assert a.bytes > 3 * 10_000**2 * 8  # at least three n x n float64 matrices
    assert resources.matmul_rate(size=64, repeat=1) > 0


def test_large_fit_prints_its_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    commands.announce_cost("the fit", 20_000, 1, 8, evals="up to 5 steps", override=False)
    out, err = capsys.readouterr()
    assert out == ""  # stdout stays clean (the predictions' CSV goes there)
    line = assert_one_line(err, "n=20000", "GiB", "per evaluation", prefix="gpchol:")
    assert "Ctrl-C" in line
    commands.announce_cost("the fit", 100, 1, 8, evals="up to 5 steps", override=False)
    assert capsys.readouterr() == ("", "")  # small: nothing printed


def test_fit_beyond_the_machine_memory_is_refused_before_the_fit(
    d: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resources, "machine_memory", lambda: 2**20)  # a 1 MiB machine
    monkeypatch.setattr(commands, "machine_memory", lambda: 2**20)
    rc, _, err = run_cli(capsys, "fit", *CSV, "--no-plot")
    assert rc == 2, err
    assert_one_line(err, "n=6 points needs about", "1.0 MiB", "--no-memory-check")
    assert not (d / "gpchol-fit.json").exists()
    with pytest.raises(CLIError, match="--no-memory-check"):
        commands.announce_cost("the fit", 6, 1, 8, evals="", override=False)
    commands.announce_cost("the fit", 6, 1, 8, evals="", override=True)  # the override


# --------------------------------------------------------------------------------- files


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_written_files_follow_the_umask(tmp_path: pathlib.Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        assert file_mode() == 0o666 & ~umask
        write_file(tmp_path / "sub" / "f.json", b"{}")
        write_file(tmp_path / "sub" / "f.json", b"[]")  # replacing an existing file
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "sub" / "f.json").st_mode & 0o777 == 0o666 & ~umask
    assert (tmp_path / "sub" / "f.json").read_bytes() == b"[]"
    assert os.listdir(tmp_path / "sub") == ["f.json"]


def test_check_output_refuses_special_files_and_protected_ones(tmp_path: pathlib.Path) -> None:
    with pytest.raises(CLIError, match="not a regular file"):
        check_output("/dev/null", "--out")
    (tmp_path / "data.csv").write_text("a\n")
    with pytest.raises(CLIError, match="is the input CSV"):
        check_output(
            str(tmp_path / "." / "data.csv"),
            "--out",
            protect={"the input CSV": str(tmp_path / "data.csv")},
        )
    with pytest.raises(CLIError, match="needs a file name"):
        check_output("", "--out")
    check_output(str(tmp_path / "new" / "deeper" / "m.json"), "--out")  # dirs are created later
    assert not (tmp_path / "new").exists()


# ------------------------------------------------------------------- main's error paths


def _command(monkeypatch: pytest.MonkeyPatch, fn: Any) -> None:
    monkeypatch.setitem(commands.COMMANDS, "check", fn)


@pytest.mark.parametrize(
    "exc, rc, words",
    [
        (
            RuntimeError("boom\nsecond line"),
            1,
            ["gpchol: internal error: RuntimeError: boom; second line", "GPCHOL_DEBUG"],
        ),
        (
            OSError(28, "No space left on device", "m.json"),
            1,
            ["gpchol: error:", "No space left", "m.json"],
        ),
        (MemoryError(), 1, ["gpchol: error: out of memory"]),
        (
            ValueError("checkpoint ck.json is another fit's:\n  y: shape (3,)"),
            2,
            ["another fit's:; y: shape (3,)"],
        ),
        (KeyboardInterrupt(), 130, ["gpchol: interrupted"]),
        (SystemExit(143), 143, ["gpchol: terminated"]),
    ],
    ids=["internal", "oserror", "memory", "multiline", "sigint", "sigterm"],
)
def test_main_turns_every_exception_into_one_line(
    d: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    exc: BaseException,
    rc: int,
    words: list[str],
) -> None:
    def fail(args: Any) -> int:
        raise exc

    _command(monkeypatch, fail)
    got, _, err = run_cli(capsys, "check")
    assert got == rc
    assert_one_line(err, *words, prefix="gpchol:")


def test_interrupted_fit_names_its_checkpoint(
    d: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class FitInterruptedLike(KeyboardInterrupt):
        checkpoint = "run/ck.json"

    def fail(args: Any) -> int:
        raise FitInterruptedLike("stopped after step 7")

    _command(monkeypatch, fail)
    rc, _, err = run_cli(capsys, "check")
    assert rc == 130
    assert_one_line(err, "gpchol: interrupted", "run/ck.json", "--resume", prefix="gpchol:")


def test_signal_that_surfaces_as_another_error_still_reads_interrupted(
    d: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # e.g. a KeyboardInterrupt raised inside a host callback reaches Python as an XLA
    # ValueError("INTERNAL: ... KeyboardInterrupt"): still "interrupted", status 130
    def fail(args: Any) -> int:
        os.kill(os.getpid(), signal.SIGINT)
        raise ValueError("INTERNAL: Error when calling buffer callback: KeyboardInterrupt")

    _command(monkeypatch, fail)
    previous = signal.signal(signal.SIGINT, lambda s, f: None)
    try:
        rc, _, err = run_cli(capsys, "check")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert rc == 130
    assert_one_line(err, "gpchol: interrupted", prefix="gpchol:")


def test_closed_stdout_pipe_ends_quietly(
    d: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(args: Any) -> int:
        raise BrokenPipeError(32, "Broken pipe")  # `gpchol predict ... | head`

    _command(monkeypatch, fail)
    rc, _, err = run_cli(capsys, "check")
    assert rc == 141 and err == ""


def test_warnings_are_one_line(
    d: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def warn(args: Any) -> int:
        warnings.warn("numerically singular\ncovariance", UserWarning, stacklevel=1)
        return 0

    _command(monkeypatch, warn)
    rc, _, err = run_cli(capsys, "check")
    assert rc == 0
    assert_one_line(err, "numerically singular; covariance", prefix="gpchol: warning:")


def test_help_returns_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "--help"]) == 0
    assert "--no-memory-check" in capsys.readouterr().out


# ------------------------------------------------------------------------------ Ctrl-C


def test_interrupt_watch_ends_a_stuck_process_after_the_grace_period(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # A handler that only records the signal, as gpchol.fit's does during a step: without
    # the watch, nothing would act on Ctrl-C until the (compiled) step returned.
    seen: list[int] = []
    exits: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda s, f: seen.append(s))
    try:
        with InterruptWatch(grace=0.2, hard_exit=exits.append, note="see ck.json") as watch:
            os.kill(os.getpid(), signal.SIGINT)
            deadline = time.monotonic() + 10
            while not exits and time.monotonic() < deadline:
                time.sleep(0.01)
        assert exits == [130] and watch.received == signal.SIGINT
        assert_one_line(
            capfd.readouterr().err, "stopped; see ck.json", prefix="gpchol: interrupted"
        )
        with InterruptWatch(grace=5.0, hard_exit=exits.append):  # stops in time: no exit
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
        time.sleep(0.1)
        assert exits == [130]
        with InterruptWatch(grace=None, hard_exit=exits.append) as watch:  # main(argv): no exit
            os.kill(os.getpid(), signal.SIGINT)
            assert watch.signalled(timeout=5.0) == signal.SIGINT
            time.sleep(0.3)
        assert exits == [130]
    finally:
        signal.signal(signal.SIGINT, previous)


# -------------------------------------------------------------- outputs that collide


def _saved_model(path: pathlib.Path) -> None:
    """A model file at ``path`` in gpchol.save's format (JSON + ``<stem>.<hash>.npz``)."""
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 5, (12, 1))
    model = Model.standardized(ModelSpec.parse("rbf+white", 1), X, np.sin(X[:, 0]), ["a"], "b")
    result = types.SimpleNamespace(n_steps=0, converged=False, success=True, message="none")
    model.save(str(path), model.spec.init_params(), -1.0, result, {"optimizer": "lbfgs"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "args, earlier, words",
    [
        # --out run saves run.<hash>.npz, which a checkpoint at run sweeps on resume
        (["--out", "run", "--checkpoint", "run"], None, ["--out run", "--checkpoint run"]),
        (["--out", "sub/run", "--checkpoint", "sub/run.npz"], None, ["--out", "--checkpoint"]),
        # --out m.npz: gpchol.save refuses it, which used to come after the fit
        (["--out", "m.npz"], None, ["--out m.npz", ".json"]),
        # a model file of an earlier fit as the checkpoint: overwritten, its arrays deleted
        (["--checkpoint", "co2"], "co2.json", ["--checkpoint co2", "co2.json", "model file"]),
        (["--checkpoint", "co2", "--resume"], "co2.json", ["--checkpoint co2", "not a gpchol"]),
        # a model file saved without .json: its arrays are named as the checkpoint's
        (["--out", "other.json", "--checkpoint", "run"], "run", ["--checkpoint run", "model file"]),
    ],
    ids=["same-stem", "same-stem-npz", "out-npz", "model-as-ck", "model-as-ck-resume", "stem-file"],
)
def test_fit_outputs_that_collide_are_refused_before_the_fit(
    d: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    earlier: str | None,
    words: list[str],
) -> None:
    if earlier is not None:
        _saved_model(d / earlier)
    before = {p: (d / p).read_bytes() for p in os.listdir(d) if (d / p).is_file()}
    called: list[str] = []
    monkeypatch.setattr(commands, "announce_cost", lambda *a, **k: called.append("estimate"))
    monkeypatch.setattr(commands.gpchol, "fit", lambda *a, **k: called.append("fit"))
    rc, out, err = run_cli(capsys, "fit", *CSV, "--no-plot", *args)
    assert rc == 2, err
    assert_one_line(err, *words)
    assert not called and "gpchol fit:" not in out
    after = {p: (d / p).read_bytes() for p in os.listdir(d) if (d / p).is_file()}
    assert after == before  # the earlier model's files are untouched


def test_checkpoint_manifests_are_not_refused_up_front(
    d: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # an existing checkpoint manifest (of any fit: the fit itself checks whose) and a
    # damaged one are not refused up front
    called: list[str] = []
    monkeypatch.setattr(commands, "announce_cost", lambda *a, **k: None)
    monkeypatch.setattr(commands.gpchol, "fit", lambda *a, **k: called.append("fit") or 1 / 0)
    (d / "ck.json").write_text(json.dumps({"format": "gpchol fit checkpoint", "version": 2}))
    (d / "old.json").write_text(json.dumps({"npz_sha256": "0" * 64}))  # the first format
    (d / "bad.json").write_text('{"format": "gpchol fit chec')
    for ck in ("ck", "old", "bad"):
        run_cli(capsys, "fit", *CSV, "--no-plot", "--checkpoint", ck, "--resume")
    assert called == ["fit"] * 3


# ------------------------------------------------------------------ CSV line numbers


@pytest.mark.parametrize(
    "text, args, words",
    [
        ("x,y\n1,2\n\n\n3,4\n5,abc\n", [], ["data row 3 (line 6)"]),
        ("\nx,y\n1,2\n\n3,4\n\n5,abc\n", [], ["data row 3 (line 7)"]),
        ('x,y\n1,"2"\n"3\n",4\n\n5,abc\n', [], ["data row 3 (line 6)"]),  # a quoted line break
        ("x,y,g\n1,2,a\n\n2,3,a\n\n3,4,\n", ["--group", "g"], ["data row 3 (line 6)"]),
    ],
    ids=["blank-lines", "blank-first", "quoted-newline", "group-cell"],
)
def test_csv_errors_name_the_file_line_past_blank_lines(
    d: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    text: str,
    args: list[str],
    words: list[str],
) -> None:
    (d / "blank.csv").write_text(text)
    monkeypatch.setattr(group, "fit_batched", lambda *a, **k: 1 / 0)
    rc, _, err = run_cli(capsys, "fit", "--csv", "blank.csv", "--x", "x", "--y", "y", *args)
    assert rc == 2, err
    assert_one_line(err, *words)


# ------------------------------------------------------------------ checkpoint errors


def test_checkpoint_errors_name_the_command_lines_remedy(
    d: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a damaged manifest, resumed by the real fit: the library's remedy is resume=False
    (d / "ck.json").write_text('{"format": "gpchol fit chec')
    rc, _, err = run_cli(
        capsys, "fit", *CSV, "--no-plot", "--quiet", "--checkpoint", "ck", "--resume"
    )
    assert rc == 2, err
    line = assert_one_line(err, "ck.json", "is damaged", "run without --resume")
    assert "resume=False" not in line
    # the same from the fit of one GP per group
    from gpchol import CheckpointError

    def refuse(*a: Any, **k: Any) -> None:
        raise CheckpointError(
            "ck.json",
            "was written by a different fit. Delete it, use "
            "another checkpoint path, or pass resume=False.",
        )

    monkeypatch.setattr(group, "fit_batched", refuse)
    (d / "g.csv").write_text("a,b,g\n" + "".join(f"{i},{i * i},{i % 2}\n" for i in range(8)))
    rc, _, err = run_cli(
        capsys,
        "fit",
        "--csv",
        "g.csv",
        "--x",
        "a",
        "--y",
        "b",
        "--group",
        "g",
        "--no-plot",
        "--checkpoint",
        "ck",
        "--resume",
    )
    assert rc == 2, err
    line = assert_one_line(err, "different fit", "or run without --resume")
    assert "resume=False" not in line
