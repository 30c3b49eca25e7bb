"""Checkpoints of gpchol.fit that cannot lie or be lost.

* a checkpoint of another fit (parameters, transforms, optimiser, stopping rule, data,
  model, the arrays a plain loss closes over) is refused, naming each difference;
* damaged files (truncated manifest, corrupt or missing arrays, old or foreign format)
  are refused with the file named;
* one atomic commit per checkpoint: SIGINT/SIGTERM/SIGKILL at random times in a separate
  process (checkpoint_every=1) always leave a checkpoint that resumes to exactly the
  uninterrupted result, and no temporary file;
* SIGINT raises KeyboardInterrupt, SIGTERM SystemExit(143), after committing the state;
  the previous handlers come back; a caller's own handler is honoured.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_same_saved_files

import gpchol
from gpchol import GaussianProcess, Positive, fit, kernels
from gpchol._internal import checkpoint_module
from gpchol._internal import io as io_mod

# One small GP problem, shared by this process and the child processes of the signal
# tests (so that their checkpoints have this process's fingerprint).
PROBLEM = textwrap.dedent(
    """
    import jax.numpy as jnp
    import numpy as np
    from gpchol import GaussianProcess, Positive, kernels

    X = np.linspace(0.0, 5.0, 10)
    Y = np.sin(X) + 0.1 * np.cos(7.0 * X)
    P0 = {"amp": 1.0, "ls": 1.0, "noise": 0.1}
    KW = dict(
        transforms={k: Positive() for k in P0},
        optimizer="adam",
        learning_rate=0.02,
        steps=STEPS,
        tol=0.0,
        progress=False,
    )


    def build(p):
        return GaussianProcess(p["amp"] * kernels.ExpSquared(p["ls"]), X, noise=p["noise"])


    T = np.linspace(-1.0, 1.0, 7)
    YT = 0.5 * T - 0.2 + 0.05 * np.sin(9.0 * T)
    L0 = {"a": 0.0, "b": 0.0}
    KW_LOSS = dict(optimizer="adam", learning_rate=0.002, steps=5 * STEPS, tol=0.0, progress=False)


    def loss(p):  # a plain loss (fast to compile) over arrays it closes over
        return jnp.sum((p["a"] * T + p["b"] - YT) ** 2) + 0.1 * p["a"] ** 2


    def run(fit, kind, **kw):
        if kind == "gp":
            return fit(build, P0, Y, **KW, **kw)
        return fit(loss, L0, **KW_LOSS, **kw)
    """
)


@pytest.fixture(autouse=True)
def _sigint_as_in_a_terminal() -> Any:
    """SIGINT raising KeyboardInterrupt, as in a terminal: a test run started in the
    background of a non-interactive shell inherits SIGINT ignored (and a fit leaves an
    ignored signal ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _problem(steps: int) -> dict[str, Any]:
    ns: dict[str, Any] = {}
    exec(PROBLEM.replace("STEPS", str(steps)), ns)
    return ns


@pytest.fixture(scope="module")
def small() -> dict[str, Any]:
    return _problem(12)


def _files(d: pathlib.Path) -> list[str]:
    return sorted(os.listdir(d))


def _tmp_files(d: pathlib.Path) -> list[str]:
    return [n for n in os.listdir(d) if n.startswith(".tmp-")]


def _assert_one_checkpoint(d: pathlib.Path, base: str = "ck") -> dict[str, Any]:
    """Exactly a manifest and the arrays file it names (no temporary or stale file)."""
    meta = json.loads((d / f"{base}.json").read_text())
    assert _files(d) == sorted([f"{base}.json", meta["arrays"]]), _files(d)
    return meta


def _same_result(a: Any, b: Any) -> None:
    for k in a.params:
        assert np.array_equal(np.asarray(a.params[k]), np.asarray(b.params[k])), k
    assert np.array_equal(a.history, b.history) and a.loss == b.loss


# ------------------------------------------------------------------------ fingerprint


def test_other_fit_refused_naming_the_difference(
    small: dict[str, Any], tmp_path: pathlib.Path
) -> None:
    build, X, Y, P0, KW = small["build"], small["X"], small["Y"], small["P0"], small["KW"]
    ck = tmp_path / "ck"
    fit(build, P0, Y, checkpoint=ck, **KW)
    before = {n: (tmp_path / n).read_bytes() for n in _files(tmp_path)}

    def build_other_x(p: dict[str, Any]) -> GaussianProcess:
        return GaussianProcess(p["amp"] * kernels.ExpSquared(p["ls"]), X + 1e-9, noise=p["noise"])

    def build_matern(p: dict[str, Any]) -> GaussianProcess:
        return GaussianProcess(p["amp"] * kernels.Matern32(p["ls"]), X, noise=p["noise"])

    def renamed(p: dict[str, Any]) -> GaussianProcess:
        return build({"amp": p["a"], "ls": p["ls"], "noise": p["noise"]})

    renamed_p0 = {"a": 1.0, "ls": 1.0, "noise": 0.1}
    renamed_kw = {**KW, "transforms": {k: Positive() for k in renamed_p0}}
    y2 = Y.copy()
    y2[3] += 1e-12
    cases: list[tuple[str, Callable[[], Any]]] = [
        ("y: ", lambda: fit(build, P0, y2, checkpoint=ck, **KW)),
        ("model: ", lambda: fit(build_other_x, P0, Y, checkpoint=ck, **KW)),
        ("model: ", lambda: fit(build_matern, P0, Y, checkpoint=ck, **KW)),
        ("parameters: ", lambda: fit(renamed, renamed_p0, Y, checkpoint=ck, **renamed_kw)),
        ("initial values: ", lambda: fit(build, {**P0, "ls": 2.0}, Y, checkpoint=ck, **KW)),
        (
            "transforms: ",
            lambda: fit(build, P0, Y, checkpoint=ck, **{**KW, "transforms": None}),
        ),
        ("optimizer: ", lambda: fit(build, P0, Y, checkpoint=ck, **{**KW, "learning_rate": 0.1})),
        ("stopping: ", lambda: fit(build, P0, Y, checkpoint=ck, **{**KW, "steps": 13})),
        ("restarts: ", lambda: fit(build, P0, Y, checkpoint=ck, **{**KW, "restarts": 1})),
        ("user: ", lambda: fit(build, P0, Y, checkpoint=ck, fingerprint="data-v2", **KW)),
    ]
    for word, call in cases:
        with pytest.raises(ValueError) as info:
            call()
        e = info.value
        assert isinstance(e, gpchol.CheckpointError), (word, e)
        msg = str(e)
        assert str(tmp_path / "ck.json") in msg and "different fit" in msg, msg
        assert word in msg and "resume=False" in msg, (word, msg)
        assert any(d.startswith(word) for d in e.differences), (word, e.differences)  # type: ignore[attr-defined]
    # nothing was written; the same fit (a fresh closure on equal data) resumes
    assert {n: (tmp_path / n).read_bytes() for n in _files(tmp_path)} == before
    X2 = np.array(X)

    def build_again(p: dict[str, Any]) -> GaussianProcess:
        return GaussianProcess(p["amp"] * kernels.ExpSquared(p["ls"]), X2, noise=p["noise"])

    res = fit(build_again, dict(P0), jnp.asarray(Y), checkpoint=ck, **KW)
    assert res.n_steps == 12
    # resume=False starts over (the old checkpoint stays until the first commit)
    res2 = fit(build, P0, y2, checkpoint=ck, resume=False, **KW)
    assert res2.n_steps == 12
    _assert_one_checkpoint(tmp_path)


def test_plain_loss_fingerprints_closed_over_arrays(tmp_path: pathlib.Path) -> None:
    target = np.array([1.0, -2.0, 3.0])

    def make(t: np.ndarray) -> Callable[[Any], Any]:
        tj = jnp.asarray(t)
        return lambda p: jnp.sum((p - tj) ** 2)

    kw = dict(optimizer="adam", steps=5, progress=False, checkpoint=tmp_path / "p")
    fit(make(target), jnp.zeros(3), **kw)
    with pytest.raises(ValueError, match=r"loss data: checkpoint \[float64\[3\]\]"):
        fit(make(target + 1.0), jnp.zeros(3), **kw)
    assert fit(make(target.copy()), jnp.zeros(3), **kw).n_steps == 5


def test_kernel_pytree_params_resume(tmp_path: pathlib.Path) -> None:
    # parameters that are a kernel (default transforms): equal trees fingerprint equal
    X = np.linspace(0.0, 3.0, 8)[:, None] * np.ones((1, 2))
    y = np.cos(X[:, 0])

    def build(k: Any) -> GaussianProcess:
        return GaussianProcess(k, X, noise=0.1)

    def p0(ls: Any) -> Any:
        return 1.0 * kernels.ExpSquared(ls) + kernels.Matern32(0.5)

    kw = dict(optimizer="adam", steps=3, progress=False, checkpoint=tmp_path / "k")
    first = fit(build, p0(np.ones(2)), y, **kw)
    again = fit(build, p0(np.ones(2)), y, **kw)
    assert again.loss == first.loss and _assert_one_checkpoint(tmp_path, "k")
    with pytest.raises(ValueError, match=r"parameters: checkpoint PyTreeDef\(CustomNode\(Sum"):
        fit(build, p0(1.0), y, **kw)
    # the error survives pickling and copying, as one raised in a worker process is handed
    # back (its (path, problem) __init__ made cls(*args) fail: TypeError)
    import copy
    import pickle

    with pytest.raises(gpchol.CheckpointError) as info:
        fit(build, p0(1.0), y, **kw)
    for e in (pickle.loads(pickle.dumps(info.value)), copy.copy(info.value)):
        assert type(e) is gpchol.CheckpointError and str(e) == str(info.value)
        assert (e.path, e.differences) == (info.value.path, info.value.differences)


# ------------------------------------------------------------------------ damaged files


def test_damaged_checkpoints_named(small: dict[str, Any], tmp_path: pathlib.Path) -> None:
    build, Y, P0, KW = small["build"], small["Y"], small["P0"], small["KW"]
    ck = tmp_path / "ck"
    fit(build, P0, Y, checkpoint=ck, **KW)
    meta = _assert_one_checkpoint(tmp_path)
    manifest, arrays = tmp_path / "ck.json", tmp_path / meta["arrays"]
    good_manifest, good_arrays = manifest.read_bytes(), arrays.read_bytes()

    def refused(*words: str) -> str:
        with pytest.raises(ValueError) as info:
            fit(build, P0, Y, checkpoint=ck, **KW)
        assert isinstance(info.value, gpchol.CheckpointError)
        msg = str(info.value)
        for w in words:
            assert w in msg, (w, msg)
        return msg

    manifest.write_bytes(good_manifest[: len(good_manifest) // 2])  # truncated
    refused(str(manifest), "not valid JSON", "resume=False")
    manifest.write_bytes(b"")
    refused(str(manifest), "not valid JSON")
    manifest.write_bytes(b"\xff\xfe garbage")
    refused(str(manifest), "not valid JSON")
    manifest.write_text('{"hello": 1}')
    refused(str(manifest), "not a gpchol fit checkpoint")
    manifest.write_text(json.dumps({**json.loads(good_manifest), "version": 9}))
    refused(str(manifest), "version 9")
    # a checkpoint of the earlier format (no fingerprint) is not resumed
    manifest.write_text(json.dumps({"version": 1, "npz_sha256": "0" * 64, "step": 3}))
    refused(str(manifest), "format version 1", "ck.npz")
    broken = json.loads(good_manifest)
    del broken["state"]["stall"]
    manifest.write_text(json.dumps(broken))
    refused(str(manifest), "is damaged", "stall")
    # hand edits of a field's type are refused, not coerced ("false" was read as True)
    for field, value in (("done", "false"), ("step", 2.9), ("restart", -1), ("stopped", 3)):
        edited = json.loads(good_manifest)
        edited["state"][field] = value
        manifest.write_text(json.dumps(edited))
        refused(str(manifest), "is damaged", f"state field {field!r}")
    manifest.write_bytes(good_manifest)

    arrays.write_bytes(good_arrays[:-10])  # truncated arrays
    refused(str(arrays), "SHA-256", str(manifest))
    flipped = bytearray(good_arrays)
    flipped[len(flipped) // 2] ^= 0xFF
    arrays.write_bytes(bytes(flipped))
    refused(str(arrays), "SHA-256")
    arrays.unlink()
    refused(str(arrays), "is missing", str(manifest))
    arrays.write_bytes(good_arrays)
    assert fit(build, P0, Y, checkpoint=ck, **KW).n_steps == 12  # repaired: resumes


def test_commit_sweeps_stale_files_only(small: dict[str, Any], tmp_path: pathlib.Path) -> None:
    # left by a SIGKILL: a temporary file, an arrays file never committed; others' files
    build, Y, P0, KW = small["build"], small["Y"], small["P0"], small["KW"]
    stale = [
        ".tmp-ab12cd34ck.json",
        ".tmp-x_1y2z3wck.0123456789abcdef.npz",
        "ck.fedcba9876543210.npz",
    ]
    kept = ["ck.npz.bak", "ck2.0123456789abcdef.npz", ".tmp-ab12cd34other.json", "notes.txt"]
    for n in stale + kept:
        (tmp_path / n).write_bytes(b"x")
    fit(build, P0, Y, checkpoint=tmp_path / "ck", checkpoint_every=5, **KW)
    meta = json.loads((tmp_path / "ck.json").read_text())
    assert _files(tmp_path) == sorted(["ck.json", meta["arrays"], *kept])


def test_failed_write_keeps_previous_checkpoint(
    small: dict[str, Any], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build, Y, P0, KW = small["build"], small["Y"], small["P0"], small["KW"]
    ck = tmp_path / "ck"
    fit(build, P0, Y, checkpoint=ck, **KW)
    before = {n: (tmp_path / n).read_bytes() for n in _files(tmp_path)}
    real_replace = os.replace
    calls = {"n": 0}

    def second_replace_fails(src: Any, dst: Any) -> None:  # the arrays land, the manifest not
        calls["n"] += 1
        if str(dst).endswith(".json"):
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(io_mod.os, "replace", second_replace_fails)
    with pytest.raises(OSError, match="disk full"):
        fit(build, P0, Y, checkpoint=ck, resume=False, checkpoint_every=3, **KW)
    monkeypatch.undo()
    assert calls["n"] == 2 and not _tmp_files(tmp_path)
    assert (tmp_path / "ck.json").read_bytes() == before["ck.json"]  # the old commit stands
    res = fit(build, P0, Y, checkpoint=ck, **KW)  # and resumes (the orphan is swept)
    assert res.n_steps == 12
    _assert_one_checkpoint(tmp_path)


def test_one_fit_per_checkpoint_path(tmp_path: pathlib.Path) -> None:
    # a second fit on a checkpoint in use would sweep the first's files: refused
    def loss(p: Any) -> Any:
        return jnp.sum((p - 1.0) ** 2)

    kw = dict(optimizer="adam", steps=3, progress=False, checkpoint=tmp_path / "c")
    errors: list[BaseException] = []

    def nested(step: int, params: Any, v: float) -> None:
        if step == 1:
            assert (tmp_path / "c.lock").exists()
            try:
                fit(loss, jnp.zeros(2), **kw)
            except ValueError as e:
                errors.append(e)

    res = fit(loss, jnp.zeros(2), callback=nested, **kw)
    assert res.n_steps == 3 and len(errors) == 1
    assert isinstance(errors[0], gpchol.CheckpointError)
    assert str(tmp_path / "c.lock") in str(errors[0]) and "another fit" in str(errors[0])
    _assert_one_checkpoint(tmp_path, "c")  # the lock is gone with the fit


def test_divergence_keeps_last_good_params_and_checkpoint(tmp_path: pathlib.Path) -> None:
    def loss(p: Any) -> Any:  # finite for p < 2 only; Adam with a big step walks out
        return jnp.where(p < 2.0, (p - 5.0) ** 2, jnp.nan)

    kw = dict(optimizer="adam", learning_rate=0.7, steps=50, progress=False)
    ck = tmp_path / "d"
    res = fit(loss, 0.0, checkpoint=ck, checkpoint_every=1, **kw)
    assert not res.success and np.isfinite(res.loss) and float(res.params) < 2.0
    again = fit(loss, 0.0, checkpoint=ck, checkpoint_every=1, **kw)
    assert float(again.params) == float(res.params) and again.loss == res.loss
    assert not again.success and again.message == res.message
    _assert_one_checkpoint(tmp_path, "d")


# ------------------------------------------------------------------- signals in-process


def _send_at(k: int, *sigs: int) -> Callable[[int, Any, float], None]:
    def cb(step: int, params: Any, loss: float) -> None:
        if step == k:
            for s in sigs:
                os.kill(os.getpid(), s)

    return cb


def test_sigint_commits_then_raises_keyboard_interrupt(tmp_path: pathlib.Path) -> None:
    ns = _problem(20)
    build, Y, P0, KW = ns["build"], ns["Y"], ns["P0"], ns["KW"]
    ref = fit(build, P0, Y, **KW)
    ck = tmp_path / "ck"
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt) as info:
        fit(
            build,
            P0,
            Y,
            checkpoint=ck,
            checkpoint_every=100,
            callback=_send_at(7, signal.SIGINT),
            **KW,
        )
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    e = info.value
    assert isinstance(e, gpchol.FitInterrupted) and "SIGINT" in str(e)
    assert str(tmp_path / "ck.json") in str(e) and "resume=True" in str(e)
    meta = _assert_one_checkpoint(tmp_path)
    assert meta["state"]["step"] == 7  # the state at the signal, not the last periodic one
    _same_result(fit(build, P0, Y, checkpoint=ck, checkpoint_every=100, **KW), ref)

    # SIGTERM: SystemExit(143) after the commit
    with pytest.raises(SystemExit) as term:
        fit(build, P0, Y, checkpoint=ck, resume=False, callback=_send_at(4, signal.SIGTERM), **KW)
    assert term.value.code == 143 and type(term.value).__name__ == "FitTerminated"
    assert "SIGTERM" in str(term.value) and str(tmp_path / "ck.json") in str(term.value)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert _assert_one_checkpoint(tmp_path)["state"]["step"] == 4
    _same_result(fit(build, P0, Y, checkpoint=ck, **KW), ref)

    # without a checkpoint: the same exception, saying there is nothing to resume
    with pytest.raises(KeyboardInterrupt, match="no checkpoint"):
        fit(build, P0, Y, callback=_send_at(2, signal.SIGINT), **KW)


def test_second_signal_raises_at_once_and_own_handler_is_honoured(
    tmp_path: pathlib.Path,
) -> None:
    ns = _problem(20)
    build, Y, P0, KW = ns["build"], ns["Y"], ns["P0"], ns["KW"]
    ck = tmp_path / "ck"
    # two Ctrl-C: the second raises in the callback; the last periodic commit stands
    with pytest.raises(KeyboardInterrupt, match="second signal"):
        fit(
            build,
            P0,
            Y,
            checkpoint=ck,
            checkpoint_every=5,
            callback=_send_at(7, signal.SIGINT, signal.SIGINT),
            **KW,
        )
    assert _assert_one_checkpoint(tmp_path)["state"]["step"] == 5

    # a caller's own handler: called at the step boundary, after the commit; the fit goes on
    seen: list[int] = []

    def mine(signum: int, frame: Any) -> None:
        seen.append(signum)

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        res = fit(
            build,
            P0,
            Y,
            checkpoint=ck,
            resume=False,
            checkpoint_every=100,
            callback=_send_at(3, signal.SIGTERM),
            **KW,
        )
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == [signal.SIGTERM] and res.n_steps == 20


def test_handlers_only_while_fitting_in_the_main_thread() -> None:
    seen: dict[str, Any] = {}

    def record(where: str) -> Callable[[int, Any, float], None]:
        def cb(step: int, params: Any, loss: float) -> None:
            seen[where] = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))

        return cb

    def run(where: str) -> None:
        fit(lambda p: jnp.sum((p - 1.0) ** 2), jnp.zeros(2), optimizer="adam", steps=2,
            progress=False, callback=record(where))  # fmt: skip

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    run("main")
    assert all(h not in before for h in seen["main"])  # the fit's own, while it runs
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    t = threading.Thread(target=run, args=("thread",))
    t.start()
    t.join()
    assert seen["thread"] == before  # not the main thread: nothing installed
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        run("ignored")
        assert seen["ignored"][0] == signal.SIG_IGN  # ignored stays ignored
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_signal_in_a_fit_inside_a_fit_stops_both(tmp_path: pathlib.Path) -> None:
    def loss(p: Any) -> Any:
        return jnp.sum((p - 1.0) ** 2)

    kw = dict(optimizer="adam", steps=5, progress=False)

    def inner(step: int, params: Any, v: float) -> None:
        if step == 1:
            cb = _send_at(2, signal.SIGINT)
            fit(loss, jnp.zeros(2), checkpoint=tmp_path / "in", callback=cb, **kw)

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="SIGINT after step 2") as info:
        fit(loss, jnp.zeros(2), checkpoint=tmp_path / "out", callback=inner, **kw)
    assert str(tmp_path / "in.json") in str(info.value)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    meta = json.loads((tmp_path / "in.json").read_text())
    assert meta["state"]["step"] == 2 and not (tmp_path / "out.json").exists()
    assert not _tmp_files(tmp_path) and not list(tmp_path.glob("*.lock"))


# ------------------------------------------------------- signals at random, other process

CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    import jax
    jax.config.update("jax_enable_x64", True)
    from gpchol import fit
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from problem import KW, KW_LOSS, run


    def last_step_waits_for(sent, last):
        # no fit ends before its signal: at its last step it waits until the parent has
        # sent it (the parent creates `sent` after sending), so the signal is delivered
        # at that step's boundary at the latest
        def cb(step, params, loss):
            while step == last and not os.path.exists(sent):
                time.sleep(0.001)

        return cb


    for i, arg in enumerate(sys.argv[1:]):
        kind, d = arg.split(":", 1)
        last = (KW if kind == "gp" else KW_LOSS)["steps"]
        print("start", i, flush=True)
        try:
            cb = last_step_waits_for(d + ".sent", last)
            run(fit, kind, checkpoint=os.path.join(d, "ck"), checkpoint_every=1, callback=cb)
            print("finished", i, flush=True)
        except KeyboardInterrupt as e:
            print("interrupted", i, type(e).__name__, flush=True)
        except SystemExit as e:
            print("terminated", i, e.code, type(e).__name__, flush=True)
    """
)

RANDOM_STEPS = 400


def _wait_for(path: pathlib.Path, proc: subprocess.Popen[str], timeout: float) -> None:
    t0 = time.monotonic()
    while not path.exists():
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"child exited early ({proc.returncode}): {err}")
        if time.monotonic() - t0 > timeout:
            proc.kill()
            raise AssertionError(f"no checkpoint at {path} after {timeout} s")
        time.sleep(0.005)


# slow: a child process runs six 400-step fits, each stopped by a signal at a random time,
# then each is resumed here (about 40 s on 2 cores); the everyday tier's signal tests above
# stop fits in-process
@pytest.mark.slow
def test_signals_at_random_times_leave_a_resumable_checkpoint(
    tmp_path: pathlib.Path, rng: np.random.Generator
) -> None:
    # One child process fits again and again with checkpoint_every=1; each fit gets a
    # signal at a random time once it is committing (mid-step, mid-commit, ...; a fit
    # that reaches its last step waits there for it, so every fit is stopped by its
    # signal however fast the machine). Every checkpoint left must be one whole commit
    # that resumes, here, to the exact result of an uninterrupted fit (so the
    # fingerprint is also the same in another process).
    ns = _problem(RANDOM_STEPS)
    (tmp_path / "problem.py").write_text(PROBLEM.replace("STEPS", str(RANDOM_STEPS)))
    (tmp_path / "child.py").write_text(CHILD)
    tries = [
        ("gp", signal.SIGINT),
        ("loss", signal.SIGTERM),
        ("loss", signal.SIGINT),
        ("loss", signal.SIGTERM),
        ("loss", signal.SIGINT),
        ("loss", signal.SIGKILL),  # cannot be handled: the commit protocol alone holds
    ]
    dirs = [tmp_path / f"run{i}" for i in range(len(tries))]
    for d in dirs:
        d.mkdir()
    args = [f"{kind}:{d}" for (kind, _), d in zip(tries, dirs, strict=True)]
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "child.py"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    outcomes = []
    try:
        for i, ((_, sig), d) in enumerate(zip(tries, dirs, strict=True)):
            assert proc.stdout.readline().split() == ["start", str(i)]
            _wait_for(d / "ck.json", proc, timeout=120.0)  # compiled, stepping, committing
            time.sleep(rng.uniform(0.0, 0.25))
            proc.send_signal(sig)
            (tmp_path / f"run{i}.sent").touch()  # after the signal: the fit may end now
            if sig != signal.SIGKILL:
                outcomes.append(proc.stdout.readline().split())
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert proc.returncode == -signal.SIGKILL and "Traceback" not in err, (proc.returncode, err)
    for i, ((_, sig), out) in enumerate(zip(tries, outcomes, strict=False)):
        want = ["interrupted", str(i), "FitInterrupted"]
        if sig == signal.SIGTERM:
            want = ["terminated", str(i), "143", "FitTerminated"]
        assert out == want, (i, out)  # every fit stopped by its signal

    refs = {kind: ns["run"](fit, kind) for kind in ("gp", "loss")}
    for (kind, sig), d in zip(tries, dirs, strict=True):
        if sig != signal.SIGKILL:
            assert not _tmp_files(d), (sig, _files(d))  # removed on the way out
        res = ns["run"](fit, kind, checkpoint=d / "ck", checkpoint_every=10 * RANDOM_STEPS)
        _same_result(res, refs[kind])
        _assert_one_checkpoint(d)  # one commit; the resume swept what a kill left


# ------------------------------------------------- files written before the shared protocol

FIXTURES = pathlib.Path(__file__).parent / "data" / "persist"
FIXTURE_FINGERPRINT = {"model": "fixture model", "y": "float64[3] 0123abcd"}


def fixture_state() -> Any:
    """The state in ``tests/data/persist/ck.json`` (see the README there)."""
    cm = checkpoint_module

    def params(a: float, b: float) -> dict[str, Any]:
        return {"a": jnp.asarray([a, -2.0]), "b": jnp.asarray(b, jnp.float32)}

    opt = (jnp.asarray(3, jnp.int32), params(0.125, 0.0))
    best = cm.StartRecord(0.75, [1.0, 0.75], 2, True, True, "converged after 2 steps", 0)
    return cm.FitState(
        params=params(1.0, 0.5),
        opt_state=opt,
        key=np.array([0, 42], np.uint32),
        restart=1,
        step=3,
        history=[5.0, 4.5, 4.25],
        stall=1,
        last_good=params(1.5, 0.25),
        best=best,
        best_params=params(-1.0, 2.0),
        restart_losses=[0.75, float("nan")],
    )


def test_checkpoint_written_before_the_shared_protocol(tmp_path: pathlib.Path) -> None:
    """A checkpoint written before the one file protocol (gpchol._base.store) reads back
    whole, and writing the same state gives the same files."""
    cm, want = checkpoint_module, fixture_state()
    old = tmp_path / "old"
    old.mkdir()
    for n in os.listdir(FIXTURES):
        if n.startswith("ck."):
            shutil.copy(FIXTURES / n, old / n)
    like = jax.tree_util.tree_map(jnp.zeros_like, want.params)
    back = cm.load_checkpoint(
        old / "ck", fingerprint=FIXTURE_FINGERPRINT, params_like=like,
        init_opt_state=lambda u: want.opt_state,
    )  # fmt: skip
    for f in ("params", "opt_state", "key", "last_good", "best_params"):
        a, b = getattr(back, f), getattr(want, f)
        assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b), f
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
            x, y = np.asarray(x), np.asarray(y)
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), f
    for f in ("restart", "step", "history", "stall", "done", "stopped", "message", "best"):
        assert getattr(back, f) == getattr(want, f), f
    assert repr(back.restart_losses) == repr(want.restart_losses)
    new = tmp_path / "new"
    cm.save_checkpoint(new / "ck", want, fingerprint=FIXTURE_FINGERPRINT, optimizer="adam")
    assert_same_saved_files(new / "ck.json", old / "ck.json")
    assert sorted(os.listdir(new)) == sorted(os.listdir(old))


def test_arrays_of_another_dtype_are_refused_not_cast() -> None:
    """A checkpoint array whose dtype is not this fit's (an arrays file rewritten with
    float64 parameters for a float32 fit) is refused: it was cast silently."""
    cm = checkpoint_module
    template = {"s": np.zeros(2, np.float32)}
    with pytest.raises(gpchol.CheckpointError, match=r"float64 of shape \(2,\), expected float32"):
        cm._tree_from_arrays(template, [np.zeros(2)], "parameters", "ck.0123456789abcdef.npz")
    back = cm._tree_from_arrays(template, [np.ones(2, np.float32)], "parameters", "ck.npz")
    assert back["s"].dtype == np.float32
