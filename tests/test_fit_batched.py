"""fit_batched: many GPs in one compiled loop, and ``gpchol fit --group``.

* each problem of a batch ends where :func:`gpchol.fit` ends on it alone (equal sizes,
  vectorized or not; unequal sizes padded with masks);
* padded rows change neither the likelihood nor its gradient;
* problems that diverge (or cannot be evaluated at all) are marked failed, keep their last
  finite parameters, and the others finish as they would alone;
* a checkpointed batch interrupted and resumed ends exactly as an uninterrupted one; a
  checkpoint of another batch is refused;
* bad input (datasets that disagree in dimension, shapes, masks, settings) is refused
  with a message naming the argument;
* ``gpchol fit --csv --group COL`` writes one model per group (each as the single fit of
  that group's rows would) and refuses a group column with one row per group.
"""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gpchol
from gpchol import CheckpointError, GaussianProcess, Positive, fit_batched, kernels
from gpchol._internal import fit_batched_module as batched_module
from gpchol._internal import fit_session_module
from gpchol.cli import main
from gpchol.cli.model import Model

FAILED = batched_module.FAILED
padded_log_marginal_likelihood = batched_module.padded_log_marginal_likelihood

T = {"amp": Positive(), "ls": Positive(), "noise": Positive()}
P0 = {"amp": 1.0, "ls": 1.0, "noise": 0.1}


def build(p, x):
    return GaussianProcess(p["amp"] * kernels.ExpSquared(p["ls"]), x, noise=p["noise"])


def data(rng, sizes, d=1):
    X = [np.sort(rng.uniform(0.0, 5.0, (n, d)), axis=0) for n in sizes]
    y = [np.sin(x[:, 0]) + 0.2 * rng.standard_normal(x.shape[0]) for x in X]
    return X, y


def alone(x, y, **kw):
    return gpchol.fit(lambda p: build(p, jnp.asarray(x)), P0, jnp.asarray(y), progress=False, **kw)


# ------------------------------------------------------------------ same as gpchol.fit


@pytest.mark.slow
def test_equal_sizes_match_fit_per_problem(rng):
    """Groups of 2 vmapped problems (and a remainder of 1); unequal sizes and the other
    tests run the default, one problem per group."""
    vectorize = 2
    X, y = data(rng, [12, 12, 12])
    res = fit_batched(
        build,
        P0,
        np.stack(X),
        np.stack(y),
        transforms=T,
        steps=60,
        progress=False,
        vectorize=vectorize,
    )
    assert res.params["ls"].shape == (3,) and not res.failed.any() and res.converged.all()
    for b in range(3):
        ref = alone(X[b], y[b], transforms=T, steps=60)
        assert ref.converged and int(res.n_steps[b]) == ref.n_steps
        np.testing.assert_allclose(res.loss[b], ref.loss, rtol=1e-10)
        for k in P0:
            np.testing.assert_allclose(res.params[k][b], ref.params[k], rtol=1e-7)
        np.testing.assert_allclose(res.log_marginal_likelihood[b], -ref.loss, rtol=1e-10)


@pytest.mark.slow
def test_unequal_sizes_padded_match_separate_fits(rng):
    X, y = data(rng, [14, 6, 10])
    res = fit_batched(build, P0, X, y, transforms=T, steps=80, progress=False)
    assert not res.failed.any()
    for b in range(3):
        ref = alone(X[b], y[b], transforms=T, steps=80)
        # same optimum (padding changes rounding only, so the paths may differ slightly)
        np.testing.assert_allclose(res.loss[b], ref.loss, rtol=1e-7, atol=1e-7)
        for k in P0:
            np.testing.assert_allclose(res.params[k][b], ref.params[k], rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize(("n", "n_real"), [(5, 5), (9, 4), (16, 1), (30, 17)])
def test_padded_likelihood_is_the_unpadded_one(rng, n, n_real):
    x = rng.uniform(-2.0, 2.0, (n, 2))
    y = rng.standard_normal(n)
    mask = np.zeros(n, bool)
    mask[rng.permutation(n)[:n_real]] = True  # padded rows anywhere, not only at the end
    y_pad = np.where(mask, y, np.nan)  # whatever the padded rows hold (finite inputs)

    def padded(theta):
        gp = GaussianProcess(theta[0] * kernels.Matern52(theta[1]), x, noise=theta[2])
        return padded_log_marginal_likelihood(gp, jnp.where(mask, y_pad, 0.0), mask)

    def real(theta):
        gp = GaussianProcess(theta[0] * kernels.Matern52(theta[1]), x[mask], noise=theta[2])
        return gp.log_marginal_likelihood(y[mask])

    theta = jnp.array([1.3, 0.7, 0.05])
    np.testing.assert_allclose(jax.jit(padded)(theta), real(theta), rtol=1e-12)
    # rtol per entry, plus rounding of the gradient's size: with one real point the
    # lengthscale's derivative is 0, exactly in the unpadded model (its one row is its
    # inputs' mean) and to rounding in the padded one (the distance rule's expanded
    # terms cancel to eps at coincident points, gpchol/kernels/_library.py)
    g_real = jax.grad(real)(theta)
    np.testing.assert_allclose(
        jax.grad(padded)(theta), g_real, rtol=1e-9, atol=1e-13 * float(jnp.max(jnp.abs(g_real)))
    )
    # the residual of a padded row never enters, NaN included
    gp = GaussianProcess(kernels.Matern52(0.7), x, noise=0.05)
    assert np.isfinite(float(padded_log_marginal_likelihood(gp, y_pad, mask)))


# -------------------------------------------------------------------------- divergence


@pytest.mark.slow
def test_diverging_problems_are_marked_failed_and_the_others_finish(rng):
    """Adam with a step of 1 on an unconstrained noise: the noise-free problem drives its
    noise below zero (non-finite loss); the NaN problem fails at once; the noisy one finishes."""
    x = np.linspace(0.0, 5.0, 12)[:, None]
    noisy = np.sin(x[:, 0]) + 1.0 * rng.standard_normal(12)
    smooth = np.sin(x[:, 0])
    bad = smooth.copy()
    bad[3] = np.nan
    t = {"amp": Positive(), "ls": Positive(), "noise": None}
    kw = {"transforms": t, "optimizer": "adam", "learning_rate": 1.0, "steps": 40}
    res = fit_batched(
        build, P0, np.stack([x, x, x]), np.stack([noisy, smooth, bad]), progress=False, **kw
    )
    assert res.failed.tolist() == [False, True, True]
    assert res.status[2] == FAILED and res.n_steps[2] == 0  # failed at the start
    np.testing.assert_allclose(res.params["noise"][2], P0["noise"])  # kept its initial values
    assert np.isnan(res.loss[2])
    for b, target in ((0, noisy), (1, smooth)):
        ref = alone(x, target, **kw)
        assert ref.success == (b == 0)
        assert int(res.n_steps[b]) == ref.n_steps
        np.testing.assert_allclose(res.loss[b], ref.loss, rtol=1e-10)
        np.testing.assert_allclose(res.params["noise"][b], ref.params["noise"], rtol=1e-8)
    assert np.isfinite(res.loss[1])  # the last finite step's loss
    assert "failed" in res.message and "1, 2" in res.message


# ------------------------------------------------------------------ checkpoint / resume


@pytest.mark.slow
def test_checkpoint_resume_gives_the_uninterrupted_result(rng, tmp_path, monkeypatch):
    X, y = data(rng, [10, 7])
    kw = {"transforms": T, "optimizer": "adam", "learning_rate": 0.1, "steps": 12}
    whole = fit_batched(build, P0, X, y, progress=False, **kw)
    ck = tmp_path / "batch"
    real_save = fit_session_module.save_checkpoint
    commits = []

    def save_then_stop(*a, **k):
        out = real_save(*a, **k)
        commits.append(a[1].step)
        if len(commits) == 2:
            raise KeyboardInterrupt("simulated kill after the second commit")
        return out

    monkeypatch.setattr(fit_session_module, "save_checkpoint", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        fit_batched(build, P0, X, y, progress=False, checkpoint=ck, checkpoint_every=4, **kw)
    assert commits == [4, 8]
    monkeypatch.setattr(fit_session_module, "save_checkpoint", real_save)
    resumed = fit_batched(build, P0, X, y, progress=False, checkpoint=ck, checkpoint_every=4, **kw)
    np.testing.assert_array_equal(resumed.n_steps, whole.n_steps)
    np.testing.assert_array_equal(resumed.loss, whole.loss)
    for k in P0:
        np.testing.assert_array_equal(resumed.params[k], whole.params[k])
    # another batch (other data) is refused, naming the difference
    y2 = [v + 1.0 for v in y]
    with pytest.raises(CheckpointError, match="different fit"):
        fit_batched(build, P0, X, y2, progress=False, checkpoint=ck, checkpoint_every=4, **kw)


@pytest.mark.slow
def test_resuming_a_finished_checkpoint_returns_its_result(rng, tmp_path):
    X, y = data(rng, [9, 9])
    kw = {"transforms": T, "steps": 30, "progress": False, "checkpoint": tmp_path / "b"}
    first = fit_batched(build, P0, np.stack(X), np.stack(y), **kw)
    again = fit_batched(build, P0, np.stack(X), np.stack(y), **kw)  # nothing left to run
    np.testing.assert_array_equal(again.n_steps, first.n_steps)
    np.testing.assert_array_equal(again.loss, first.loss)
    np.testing.assert_array_equal(again.status, first.status)
    for k in P0:
        np.testing.assert_array_equal(again.params[k], first.params[k])


@pytest.mark.slow
def test_float32_problems_keep_float32_losses(rng):
    X, y = data(rng, [10, 10])
    Xs, ys = np.stack(X).astype(np.float32), np.stack(y).astype(np.float32)
    p0 = {k: np.float32(v) for k, v in P0.items()}
    res = fit_batched(build, p0, Xs, ys, transforms=T, steps=40, progress=False)
    assert res.loss.dtype == np.float32 and res.params["ls"].dtype == np.float32
    for b in range(2):
        ref = gpchol.fit(
            lambda p, b=b: build(p, jnp.asarray(Xs[b])),
            p0,
            jnp.asarray(ys[b]),
            transforms=T,
            steps=40,
            progress=False,
            bucket=False,  # unpadded, as the batch: the same float32 sums, step by step
        )
        # the same algorithm from the same start, in float32 throughout; the batch's line
        # search is compiled and gpchol.fit's runs in NumPy, and their float32 rounding
        # differs (so do their paths after a few steps, and the steps to converge): both
        # reach the same optimum, to float32's resolution of the loss
        assert bool(res.converged[b]) and ref.converged
        np.testing.assert_allclose(res.loss[b], ref.loss, rtol=1e-5)


def test_an_initial_value_outside_its_domain_names_the_parameter():
    with pytest.raises(ValueError, match=r"parameter \['noise'\]"):
        fit_batched(
            build,
            dict(P0, noise=-1.0),
            np.zeros((2, 5)),
            np.zeros((2, 5)),
            transforms=T,
            progress=False,
        )


# --------------------------------------------------------------------------- bad input


def _bad_cases():
    x1, y1 = np.zeros((5, 1)), np.zeros(5)
    return [
        ({"X": [x1, np.zeros((4, 2))], "y": [y1, np.zeros(4)]}, "disagree in dimension"),
        ({"X": [x1, np.zeros(4)], "y": [y1, np.zeros(4)]}, "disagree in dimension"),
        ({"X": [x1], "y": [y1, y1]}, "same number of datasets"),
        ({"X": [x1], "y": [np.zeros(4)]}, r"y\[0\] must have shape \(5,\)"),
        ({"X": [x1], "y": y1[None]}, "both be sequences"),
        ({"X": np.zeros((2, 5, 1)), "y": np.zeros((2, 4))}, r"y must have shape \(2, 5\)"),
        ({"X": np.zeros(5), "y": y1}, "X must have shape"),
        ({"X": np.zeros((2, 5)), "y": np.zeros((2, 5)), "mask": np.ones((2, 4), bool)}, "mask"),
        (
            {"X": np.zeros((2, 5)), "y": np.zeros((2, 5)), "mask": np.eye(2, 5, dtype=bool) * 0},
            "mask",
        ),
        (
            {
                "X": np.zeros((2, 5)),
                "y": np.zeros((2, 5)),
                "mask": np.eye(2, 5, dtype=bool) & False,
            },
            "without any point",
        ),
        ({"X": [np.zeros((0, 1))], "y": [np.zeros(0)]}, "no rows"),
        ({"X": [], "y": []}, "no dataset"),
        ({"X": np.zeros((2, 5)), "y": np.zeros((2, 5)), "steps": -1}, "steps"),
        ({"X": np.zeros((2, 5)), "y": np.zeros((2, 5)), "vectorize": 0}, "vectorize"),
        (
            {"X": np.zeros((2, 5)), "y": np.zeros((2, 5)), "vectorize": True},
            "vectorize must be a positive int, not a bool",
        ),
        ({"X": np.zeros((2, 5)), "y": np.zeros((2, 5)), "patience": 0}, "patience"),
        (
            {"X": np.zeros((2, 5)), "y": np.zeros((2, 5)), "patience": True},
            "patience must be a positive int, not a bool",
        ),
        ({"X": np.zeros((2, 5)), "y": np.zeros((2, 5)), "steps": False}, "steps must be an int"),
        (
            {"X": np.zeros((2, 5)), "y": np.zeros((2, 5)), "checkpoint_every": True},
            "checkpoint_every must be a positive int, not a bool",
        ),
        ({"X": np.zeros((2, 5)), "y": np.zeros((2, 5)), "tol": True}, "tol must be a number"),
        ({"X": np.zeros((2, 5)), "y": np.zeros((2, 5)), "tol": float("nan")}, "tol must be"),
        ({"X": np.zeros((2, 5)), "y": np.zeros((2, 5)), "params_batched": True}, "leading axis"),
    ]


@pytest.mark.parametrize(("kw", "match"), _bad_cases())
def test_bad_input_is_refused_with_a_clear_error(kw, match):
    with pytest.raises(ValueError, match=match):
        fit_batched(build, P0, transforms=T, progress=False, **kw)


# -------------------------------------------------------------------- gpchol fit --group


def cli(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.slow
def test_cli_group_fits_one_model_per_group(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(1)
    rows = ["star,t,flux"]
    for name, n in (("a", 9), ("b", 12), ("c", 7)):
        t = np.sort(rng.uniform(0, 6, n))
        for v, f in zip(t, np.sin(t) + 0.2 * rng.standard_normal(n), strict=True):
            rows.append(f"{name},{v},{f}")
    pathlib.Path("d.csv").write_text("\n".join(rows) + "\n")
    common = ("--x", "t", "--y", "flux", "--steps", "40", "--no-plot", "--quiet")
    rc, _, err = cli(capsys, "fit", "--csv", "d.csv", "--group", "star", *common, "--out", "g.json")
    assert rc == 0, err
    doc = json.loads(pathlib.Path("g.json").read_text())
    assert doc["format"] == "gpchol-fit-groups" and doc["group_column"] == "star"
    assert list(doc["groups"]) == ["a", "b", "c"]
    assert [m["data"]["n"] for m in doc["groups"].values()] == [9, 12, 7]
    # group b alone, through the single-model command: the same model
    pathlib.Path("b.csv").write_text("\n".join([rows[0]] + [r for r in rows if r[0] == "b"]) + "\n")
    rc, _, err = cli(capsys, "fit", "--csv", "b.csv", *common, "--out", "b.json")
    assert rc == 0, err
    _, single = Model.from_json("b.json")
    grouped = doc["groups"]["b"]
    assert grouped["format"] == "gpchol-fit"  # a complete single-JSON model of its group
    pathlib.Path("gb.json").write_text(json.dumps(grouped))
    model_b, params_b = Model.from_json("gb.json")  # readable as a model file of its own
    assert model_b.X.shape == (12, 1)
    for k, v in single.items():
        np.testing.assert_allclose(params_b[k], v, rtol=1e-3)


def test_cli_predict_reads_a_file_of_group_models(tmp_path, monkeypatch, capsys):
    """``gpchol predict`` on a ``fit --group`` file: each row by its group's model (the
    same numbers as that model's own file gives), rows in the CSV's order, the group column
    first; a group without a model, a CSV without the column, and an empty group cell are
    clear errors, and ``--dropna`` drops such a row (in ``fit --group`` as well)."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(2)
    rows = ["star,t,flux"]
    for name in ("a", "b"):
        t = rng.uniform(0, 6, 10)
        rows += [f"{name},{v},{f}" for v, f in zip(t, np.sin(t) + 0.1 * t, strict=True)]
    rows.append(",3.0,0.5")  # no group, finite data
    pathlib.Path("d.csv").write_text("\n".join(rows) + "\n")
    common = ("--csv", "d.csv", "--x", "t", "--y", "flux", "--group", "star", "--steps", "5")
    rc, _, err = cli(capsys, "fit", *common, "--no-plot", "--quiet", "--out", "g.json")
    assert rc == 2 and "is empty at data row 21" in err and "--dropna" in err, err
    rc, _, err = cli(capsys, "fit", *common, "--no-plot", "--quiet", "--dropna", "--out", "g.json")
    assert rc == 0, err
    doc = json.loads(pathlib.Path("g.json").read_text())
    assert [m["data"]["n"] for m in doc["groups"].values()] == [10, 10]
    pathlib.Path("gb.json").write_text(json.dumps(doc["groups"]["b"]))
    with pytest.raises(gpchol.cli.CLIError, match="one model per group"):
        Model.from_json("g.json")

    test = ["star,t", "b,0.5", "a,0.5", "b,2.0", ",1.0", "a,5.5"]
    pathlib.Path("t.csv").write_text("\n".join(test) + "\n")
    rc, out, err = cli(capsys, "predict", "--model", "g.json", "--csv", "t.csv")
    assert rc == 2 and "'star' is empty at data row 4" in err, err
    rc, out, err = cli(capsys, "predict", "--model", "g.json", "--csv", "t.csv", "--dropna")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == "star,t,mean,std,std_y"
    assert [r.split(",")[:2] for r in lines[1:]] == [
        ["b", "0.5"],
        ["a", "0.5"],
        ["b", "2.0"],
        ["a", "5.5"],
    ]
    got = np.array([[float(v) for v in r.split(",")[1:]] for r in lines[1:]])
    assert got[0, 1] != got[1, 1]  # the two groups' models differ
    pathlib.Path("tb.csv").write_text("t\n0.5\n2.0\n")
    rc, out_b, err = cli(capsys, "predict", "--model", "gb.json", "--csv", "tb.csv")
    assert rc == 0, err
    single = np.array([[float(v) for v in r.split(",")] for r in out_b.splitlines()[1:]])
    np.testing.assert_array_equal(got[[0, 2]], single)

    pathlib.Path("u.csv").write_text("star,t\na,1.0\nzz,2.0\n")
    rc, _, err = cli(capsys, "predict", "--model", "g.json", "--csv", "u.csv")
    assert rc == 2 and "('zz')" in err and "'a', 'b'" in err, err
    pathlib.Path("v.csv").write_text("t\n1.0\n")
    rc, _, err = cli(capsys, "predict", "--model", "g.json", "--csv", "v.csv")
    assert rc == 2 and "'star' not found in v.csv" in err, err


def test_cli_group_with_one_row_per_group_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rows = ["id,t,flux"] + [f"r{i},{i},{np.sin(i)}" for i in range(6)]
    pathlib.Path("d.csv").write_text("\n".join(rows) + "\n")
    rc, _, err = cli(
        capsys, "fit", "--csv", "d.csv", "--x", "t", "--y", "flux", "--group", "id", "--no-plot"
    )
    assert rc == 2
    assert "row identifier" in err and "Traceback" not in err
    rc, _, err = cli(
        capsys, "fit", "--csv", "d.csv", "--x", "t", "--y", "flux", "--group", "nope", "--no-plot"
    )
    assert rc == 2 and "'nope' not found" in err
