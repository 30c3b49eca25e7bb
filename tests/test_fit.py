"""gpchol.fit: optimum on synthetic data, Adam and L-BFGS, checkpoint/resume, failures."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpchol import FitResult, GaussianProcess, Positive, fit, kernels

ScaleProblem = tuple[Callable[[dict[str, Any]], GaussianProcess], np.ndarray, float]


@pytest.fixture(scope="module")
def scale_problem() -> ScaleProblem:
    """y ~ N(0, s K0): the maximum-likelihood scale is s* = y^T K0^-1 y / n (closed form)."""
    rng = np.random.default_rng(3)
    n = 40
    X = np.sort(rng.uniform(0, 5, n))
    K0 = np.exp(-0.5 * (X[:, None] - X[None, :]) ** 2 / 0.7**2) + 0.1 * np.eye(n)
    y = np.linalg.cholesky(2.5 * K0) @ rng.standard_normal(n)
    s_star = float(y @ np.linalg.solve(K0, y) / n)

    def build(p: dict[str, Any]) -> GaussianProcess:
        return GaussianProcess(p["s"] * kernels.ExpSquared(0.7), X, noise=p["s"] * 0.1)

    return build, y, s_star


@pytest.mark.parametrize("optimizer, steps, rtol", [("lbfgs", 100, 1e-7), ("adam", 400, 1e-3)])
def test_reaches_known_optimum(
    scale_problem: ScaleProblem, optimizer: str, steps: int, rtol: float
) -> None:
    build, y, s_star = scale_problem
    res = fit(
        build,
        {"s": 1.0},
        y,
        transforms={"s": Positive()},
        optimizer=optimizer,
        steps=steps,
        learning_rate=0.1 if optimizer == "adam" else None,
        progress=False,
    )
    assert isinstance(res, FitResult) and res.success
    np.testing.assert_allclose(float(res.params["s"]), s_star, rtol=rtol)
    assert res.history.shape == (res.n_steps,)
    np.testing.assert_allclose(res.log_marginal_likelihood, -res.loss)
    lml0 = float(build({"s": 1.0}).log_marginal_likelihood(y))
    assert res.log_marginal_likelihood > lml0
    if optimizer == "lbfgs":
        assert res.converged and "converged" in res.message


def test_plain_loss_and_optax_transform() -> None:
    target = jnp.array([1.0, -2.0, 3.0])
    res = fit(lambda p: jnp.sum((p - target) ** 2), jnp.zeros(3), optimizer="lbfgs", progress=False)
    np.testing.assert_allclose(res.params, target, atol=1e-6)
    assert res.log_marginal_likelihood is None
    import optax

    res2 = fit(
        lambda p: jnp.sum((p - target) ** 2),
        jnp.zeros(3),
        optimizer=optax.sgd(0.1),
        steps=300,
        progress=False,
    )
    np.testing.assert_allclose(res2.params, target, atol=1e-4)


def _interrupt_at(k: int) -> Callable[[int, Any, float], None]:
    def cb(step: int, params: Any, loss: float) -> None:
        if step == k:
            raise KeyboardInterrupt

    return cb


@pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])
def test_checkpoint_resume_equals_uninterrupted(
    scale_problem: ScaleProblem, tmp_path: pathlib.Path, optimizer: str
) -> None:
    build, y, _ = scale_problem
    kw = dict(
        transforms={"s": Positive()},
        optimizer=optimizer,
        steps=25,
        tol=0.0,
        progress=False,
        learning_rate=0.05 if optimizer == "adam" else None,
    )
    ref = fit(build, {"s": 1.0}, y, **kw)
    ck = tmp_path / "ck"
    with pytest.raises(KeyboardInterrupt):
        fit(
            build,
            {"s": 1.0},
            y,
            checkpoint=ck,
            checkpoint_every=4,
            callback=_interrupt_at(11),
            **kw,
        )
    meta = json.loads((tmp_path / "ck.json").read_text())
    assert meta["state"]["step"] == 8 and meta["optimizer"] == optimizer
    with np.load(tmp_path / meta["arrays"], allow_pickle=False) as z:
        assert z["history"].shape == (8,) and "rng_key" in z.files and "s_0" in z.files
    res = fit(build, {"s": 1.0}, y, checkpoint=ck, checkpoint_every=4, resume=True, **kw)
    assert res.n_steps == ref.n_steps
    assert np.array_equal(np.asarray(res.params["s"]), np.asarray(ref.params["s"]))
    assert np.array_equal(res.history, ref.history)
    assert res.loss == ref.loss
    # a finished checkpoint resumes to the same result without stepping
    again = fit(build, {"s": 1.0}, y, checkpoint=ck, resume=True, **kw)
    assert np.array_equal(np.asarray(again.params["s"]), np.asarray(ref.params["s"]))


def test_restarts_resume_and_best(scale_problem: ScaleProblem, tmp_path: pathlib.Path) -> None:
    build, y, s_star = scale_problem
    kw = dict(
        transforms={"s": Positive()},
        steps=15,
        restarts=2,
        key=jax.random.PRNGKey(7),
        progress=False,
        tol=0.0,
    )
    ref = fit(build, {"s": 1.0}, y, **kw)
    assert len(ref.restart_losses) == 3 and ref.loss == min(ref.restart_losses)
    np.testing.assert_allclose(float(ref.params["s"]), s_star, rtol=1e-6)
    with pytest.raises(KeyboardInterrupt):
        calls = {"n": 0}

        def cb(step: int, params: Any, loss: float) -> None:
            calls["n"] += 1
            if calls["n"] == 20:  # inside the second start
                raise KeyboardInterrupt

        fit(build, {"s": 1.0}, y, checkpoint=tmp_path / "r", checkpoint_every=3, callback=cb, **kw)
    res = fit(build, {"s": 1.0}, y, checkpoint=tmp_path / "r", checkpoint_every=3, **kw)
    assert res.restart_losses == ref.restart_losses
    assert np.array_equal(np.asarray(res.params["s"]), np.asarray(ref.params["s"]))


def test_checkpoint_format_is_pinned(scale_problem: ScaleProblem, tmp_path: pathlib.Path) -> None:
    # the on-disk format (version 2): a manifest naming a content-addressed arrays file
    build, y, _ = scale_problem
    kw = dict(transforms={"s": Positive()}, steps=4, restarts=1, tol=0.0, progress=False)
    fit(build, {"s": 1.0}, y, checkpoint=tmp_path / "f", checkpoint_every=2, **kw)
    meta = json.loads((tmp_path / "f.json").read_text())
    assert list(meta) == [
        "format", "version", "arrays", "arrays_sha256", "optimizer", "fingerprint", "state",
    ]  # fmt: skip
    assert meta["format"] == "gpchol fit checkpoint" and meta["version"] == 2
    assert list(meta["fingerprint"]) == [
        "parameters", "initial values", "transforms", "optimizer", "stopping", "restarts",
        "y", "model",
    ]  # fmt: skip
    st = meta["state"]
    assert list(st) == [
        "restart", "step", "stall", "done", "stopped", "message", "restart_losses",
        "n_param_leaves", "n_state_leaves", "has_last_good", "best", "has_best_opt_state",
        "has_last_pairs",
    ]  # fmt: skip
    assert list(st["best"]) == ["loss", "n_steps", "converged", "success", "message", "restart"]
    assert st["restart"] == 2 and st["has_last_good"]
    digest = hashlib.sha256((tmp_path / meta["arrays"]).read_bytes()).hexdigest()
    assert meta["arrays"] == f"f.{digest[:16]}.npz" and meta["arrays_sha256"] == digest
    assert sorted(os.listdir(tmp_path)) == sorted(["f.json", meta["arrays"]])
    n_s = st["n_state_leaves"]
    with np.load(tmp_path / meta["arrays"], allow_pickle=False) as z:
        assert z.files == [
            "history", "rng_key", "u_0", *(f"s_{i}" for i in range(n_s)), "g_0", "b_0",
            "best_history", *(f"o_{i}" for i in range(n_s)), *(f"p_{i}" for i in range(n_s)),
        ]  # fmt: skip
        assert z["best_history"].shape == (st["best"]["n_steps"],)


def test_resume_false_and_mismatch(scale_problem: ScaleProblem, tmp_path: pathlib.Path) -> None:
    build, y, _ = scale_problem
    kw = dict(transforms={"s": Positive()}, steps=3, checkpoint=tmp_path / "m", progress=False)
    fit(build, {"s": 1.0}, y, **kw)
    with pytest.raises(ValueError, match=r"different fit.*optimizer: checkpoint lbfgs"):
        fit(build, {"s": 1.0}, y, optimizer="adam", **kw)
    with pytest.raises(ValueError, match=r"different fit.*parameters: "):
        fit(lambda p: build({"s": p["s"][0]}), {"s": jnp.ones(2)}, y, **kw)
    res = fit(build, {"s": 1.0}, y, optimizer="adam", resume=False, **kw)
    assert res.n_steps == 3


def test_atomic_checkpoint_write(
    scale_problem: ScaleProblem, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build, y, _ = scale_problem
    ck = tmp_path / "a"
    kw = dict(
        transforms={"s": Positive()},
        steps=4,
        checkpoint=ck,
        checkpoint_every=2,
        progress=False,
        tol=0.0,
    )
    fit(build, {"s": 1.0}, y, **kw)
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 2 and files[1] == "a.json" and files[0].startswith("a.")
    before = {p: (tmp_path / p).read_bytes() for p in files}

    from gpchol._internal import io as io_mod

    def boom(*a: Any, **k: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(io_mod.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        fit(build, {"s": 2.0}, y, resume=False, **kw)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == files  # no temporary files left
    after = {p: (tmp_path / p).read_bytes() for p in files}
    assert after == before  # old checkpoint intact


def test_nonfinite_step_keeps_last_good_params() -> None:
    # finite for p < 2 only; Adam with a big step walks into the NaN region
    def loss(p: jax.Array) -> jax.Array:
        return jnp.where(p < 2.0, (p - 5.0) ** 2, jnp.nan)

    seen = []
    res = fit(
        loss,
        0.0,
        optimizer="adam",
        learning_rate=0.7,
        steps=100,
        progress=False,
        callback=lambda k, p, v: seen.append(float(p)),
    )
    assert not res.success and not res.converged
    assert np.isfinite(res.loss) and float(res.params) < 2.0
    assert float(res.params) == seen[-1]
    for word in ("non-finite", "jitter", "float64", "bounds"):
        assert word in res.message


def test_nonfinite_initial_loss_is_an_error() -> None:
    with pytest.raises(ValueError, match="initial parameters"):
        fit(lambda p: jnp.log(p - 10.0), 1.0, progress=False)


def test_progress_line_on_stderr(
    scale_problem: ScaleProblem, capsys: pytest.CaptureFixture[str]
) -> None:
    build, y, _ = scale_problem
    fit(build, {"s": 1.0}, y, transforms={"s": Positive()}, steps=5, progress=True)
    err = capsys.readouterr().err
    assert "loss" in err and "step 5/5" in err


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(optimizer="sgd"), "optimizer"),
        (dict(steps=-1), "steps"),
        (dict(restarts=-2), "restarts"),
        (dict(checkpoint_every=0), "checkpoint_every"),
        (dict(patience=0), "patience must be >= 1"),
        (dict(patience=True), "patience must be a positive int, not a bool"),
        # bools and NaN are refused like any other bad value (fit_batched agrees: one validator)
        (dict(checkpoint_every=True), "checkpoint_every must be a positive int, not a bool"),
        (dict(steps=False), "steps must be an int >= 0"),
        (dict(tol=True), "tol must be a number >= 0"),
        (dict(tol=-1.0), "tol must be a number >= 0"),
        (dict(tol=float("nan")), "tol must be a number >= 0"),
        # learning_rate and restart_scale were not checked: 0 "converged" at the start,
        # a negative one ascended, NaN failed later with a misleading message
        (dict(learning_rate=0.0), "learning_rate must be a finite number > 0"),
        (dict(learning_rate=-0.1, optimizer="adam"), "learning_rate must be a finite number"),
        (dict(learning_rate=float("nan")), "learning_rate must be a finite number > 0"),
        (dict(learning_rate="a"), "learning_rate must be a finite number > 0"),
        (dict(restart_scale=float("nan"), restarts=1), "restart_scale must be a finite"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fit(lambda p: p**2, 1.0, progress=False, **kwargs)


def test_integer_and_bool_parameters() -> None:
    """An int start is a float parameter: the result was truncated back to an int (2 for
    an optimum of 2.7, with the loss of 2.7 reported), and an int leaf among floats was
    silently frozen; a bool is refused."""
    r = fit(lambda p: (p - 2.7) ** 2, 1, progress=False)
    assert float(r.params) == pytest.approx(2.7) and r.loss == pytest.approx(0.0, abs=1e-20)
    r = fit(lambda p: (p["a"] - 2.7) ** 2 + p["b"] ** 2, {"a": 1, "b": 0.5}, progress=False)
    assert float(r.params["a"]) == pytest.approx(2.7)
    r = fit(lambda p: (p - 2.7) ** 2, 1, optimizer="adam", steps=3000, progress=False)
    assert float(r.params) == pytest.approx(2.7, abs=1e-4)
    with pytest.raises(TypeError, match=r"parameter \['flag'\] is a bool"):
        fit(lambda p: p["x"] ** 2, {"x": 1.0, "flag": True}, progress=False)


def test_no_steps_with_a_nonfinite_initial_loss_is_the_same_error() -> None:
    with pytest.raises(ValueError, match="at the initial parameters is not finite"):
        fit(lambda p: jnp.log(p), -1.0, steps=0, progress=False)


def test_a_loss_that_does_not_depend_on_the_parameters() -> None:
    # a constant loss is a literal of the traced program (it crashed with an AttributeError)
    r = fit(lambda p: jnp.asarray(5.0), {"a": 1.0}, progress=False)
    assert r.loss == 5.0 and float(r.params["a"]) == 1.0


def test_line_search_never_accepts_an_increase_of_a_large_loss() -> None:
    """Approximate Wolfe accepted f(t) <= f(0) + 1e-6 |f(0)|: with f(0) = 1e6 a real rise
    of up to 1 passed, and the fit climbed to the local maximum x = 1 of the cubic and
    reported convergence. The tolerance is now at most sqrt(eps) |f(0)| in float64."""
    r = fit(lambda x: 1e6 + (-x + 3.5 * x**2 - 2 * x**3), 0.0, progress=False)
    assert float(r.params) == pytest.approx(1 / 6, rel=1e-6) and r.loss < 1e6


def test_float32_parameters_with_x64_on() -> None:
    """The host-driven line search promoted float32 x + float64 t d to float64 and fed it
    to the loss traced in float32 (a dtype error)."""
    r = fit(lambda x: 1e3 + (-x + 3.5 * x**2 - 2 * x**3), np.float32(0.0), progress=False)
    assert r.params.dtype == np.float32 and float(r.params) == pytest.approx(1 / 6, rel=1e-5)


def test_bucket_padding_skips_models_with_other_per_point_leaves() -> None:
    """A mean with a per-point parameter (n values, not padded with X) made the padded
    likelihood raise 'returned shape (30,); must return shape (32,)': no padding then."""
    from gpchol.means import Function

    rng = np.random.default_rng(0)
    n = 30
    X = jnp.asarray(np.sort(rng.uniform(0, 5, n)))
    off = jnp.asarray(rng.normal(size=n))
    y = jnp.sin(X) + off

    def build(p: dict[str, Any]) -> GaussianProcess:
        mean = Function(lambda X, q: q["c"] + q["off"], {"c": p["c"], "off": off})
        return GaussianProcess(
            p["amp"] * kernels.ExpSquared(p["ls"]), X, noise=p["noise"], mean=mean
        )

    p0 = {"amp": 1.0, "ls": 1.0, "noise": 0.1, "c": 0.0}
    t = {"amp": Positive(), "ls": Positive(), "noise": Positive(), "c": None}
    padded = fit(build, p0, y, transforms=t, progress=False)
    plain = fit(build, p0, y, transforms=t, progress=False, bucket=False)
    assert padded.loss == pytest.approx(plain.loss, rel=1e-10)
