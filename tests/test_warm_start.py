"""gpchol.fit's ``warm_start``: a refit begins with an earlier fit's optimiser state.

The refits of a Bayesian-optimisation loop (one more point each time) reach the optimum
of a cold fit in fewer steps; with the curvature pairs of the same loss the first step is
Newton's; the state travels through restarts and a
finished checkpoint; a state that does not fit is refused with a message naming what to
change.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

from gpchol import GaussianProcess, fit, kernels, load, save
from gpchol._internal import lbfgs_module


def _data(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    X = rng.uniform(0.0, 1.0, (n, 2))
    y = np.sin(6.0 * X[:, 0]) * np.cos(4.0 * X[:, 1]) + 0.1 * rng.standard_normal(n)
    return X, (y - y.mean()) / y.std()


def _build(X: np.ndarray):
    def build(q: dict[str, Any]) -> GaussianProcess:
        kernel = jnp.exp(q["log_amp"]) * kernels.ExpSquared(jnp.exp(q["log_ls"]))
        return GaussianProcess(kernel, X, noise=jnp.exp(q["log_noise"]))

    return build


P0 = {"log_amp": 0.0, "log_ls": np.log(np.full(2, 0.5)), "log_noise": np.log(0.1)}


def test_refit_loop_takes_fewer_steps_to_the_same_optimum(rng: np.random.Generator):
    X, y = _data(rng, 46)
    res = fit(_build(X[:40]), P0, y[:40], progress=False)
    cold_steps, warm_steps = [], []
    for n in range(41, 47):
        cold = fit(_build(X[:n]), res.params, y[:n], progress=False)
        warm = fit(_build(X[:n]), res.params, y[:n], warm_start=res, progress=False)
        assert cold.converged and warm.converged, (cold.message, warm.message)
        np.testing.assert_allclose(warm.loss, cold.loss, rtol=1e-8, atol=1e-8)
        cold_steps.append(cold.n_steps)
        warm_steps.append(warm.n_steps)
        res = warm
    # measured: 67 against 114 steps over the six refits (seed 0)
    assert sum(warm_steps) < 0.8 * sum(cold_steps), (warm_steps, cold_steps)


def test_curvature_pairs_of_the_same_loss_give_a_newton_step(rng: np.random.Generator):
    # a badly scaled quadratic (plus 1 and a small quartic term, so that the last steps
    # still move: L-BFGS clears its pairs after a step that finds no decrease): with the
    # pairs of an earlier fit of the same loss, the first step from the same start is
    # close to Newton's and lands near the minimum; without them it is scaled steepest
    # descent
    A = np.diag([1.0, 30.0, 900.0]) + 0.1
    c = rng.standard_normal(3)

    def loss(p: jnp.ndarray) -> jnp.ndarray:
        return 1.0 + (p - c) @ A @ (p - c) + 1e-3 * jnp.sum((p - c) ** 4)

    first = fit(loss, np.zeros(3), progress=False)
    st = lbfgs_module.LBFGSState(*first.optimizer_state)  # its leaves, in field order
    assert int(st.n_pairs) > 0
    warm = fit(loss, np.zeros(3), steps=1, warm_start=first, progress=False)
    cold = fit(loss, np.zeros(3), steps=1, progress=False)
    warm_err = np.linalg.norm(np.asarray(warm.params) - c)
    cold_err = np.linalg.norm(np.asarray(cold.params) - c)
    assert warm_err < 1e-2 * np.linalg.norm(c) < cold_err, (warm_err, cold_err)


def test_optimizer_state_is_the_best_starts_and_survives_a_finished_checkpoint(
    rng: np.random.Generator, tmp_path
):
    X, y = _data(rng, 30)
    ck = tmp_path / "ck"
    kw = {"restarts": 2, "checkpoint": ck, "progress": False}
    res = fit(_build(X), P0, y, **kw)
    again = fit(_build(X), P0, y, **kw)  # resumes the finished checkpoint: no step
    assert again.n_steps == res.n_steps and again.loss == res.loss
    for a, b in zip(res.optimizer_state, again.optimizer_state, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(lbfgs_module.LBFGSState(*res.optimizer_state).n_pairs) > 0


def test_adam_state_carries_over(rng: np.random.Generator):
    X, y = _data(rng, 20)
    first = fit(_build(X), P0, y, optimizer="adam", steps=15, tol=0.0, progress=False)
    again = fit(
        _build(X),
        first.params,
        y,
        optimizer="adam",
        steps=5,
        tol=0.0,
        warm_start=first,
        progress=False,
    )
    # optax's Adam counts its steps in its state (its first leaf): 15 before, 20 after
    assert int(np.asarray(again.optimizer_state[0])) == 20


def test_bad_warm_start_is_refused(rng: np.random.Generator):
    X, y = _data(rng, 20)
    res = fit(_build(X), P0, y, steps=3, progress=False)
    with pytest.raises(TypeError, match=r"FitResult of an earlier gpchol\.fit"):
        fit(_build(X), P0, y, warm_start=res.params, progress=False)
    with pytest.raises(ValueError, match="optimizer='lbfgs'"):
        fit(_build(X), P0, y, optimizer="adam", warm_start=res, progress=False)
    other = {**P0, "log_ls": 0.0}  # one lengthscale: 3 parameters, not 4

    def build(q: dict[str, Any]) -> GaussianProcess:
        return _build(X)({**q, "log_ls": jnp.full(2, q["log_ls"])})

    with pytest.raises(ValueError, match="does not fit this fit's parameters"):
        fit(build, other, y, warm_start=res, progress=False)


def test_a_saved_result_warm_starts_the_same(rng: np.random.Generator, tmp_path):
    X, y = _data(rng, 25)
    res = fit(_build(X[:24]), P0, y[:24], progress=False)
    save(res, tmp_path / "res.json")
    back = load(tmp_path / "res.json")
    a = fit(_build(X), res.params, y, warm_start=res, progress=False)
    b = fit(_build(X), res.params, y, warm_start=back, progress=False)
    assert a.n_steps == b.n_steps and a.loss == b.loss
