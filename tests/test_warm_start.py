"""gpchol.fit's ``warm_start``: a refit begins with an earlier fit's optimiser state.

The refits of a Bayesian-optimisation loop (one more point each time) reach the optimum
of a cold fit in fewer steps; the state travels through restarts and a
finished checkpoint; a state that does not fit is refused with a message naming what to
change.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
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
        assert int(lbfgs_module.LBFGSState(*warm.optimizer_state).n_pairs) > 0
        res = warm
    # measured: 67 against 114 steps over the six refits (seed 0)
    assert sum(warm_steps) < 0.8 * sum(cold_steps), (warm_steps, cold_steps)


def test_optimizer_state_is_the_best_starts_and_survives_a_finished_checkpoint(tmp_path):
    # a double well, minima near -1 (lower) and +1; from 0.9 the first start ends at +1,
    # and with this key the first restart finds -1, the last +1 again: the best start
    # (the first to reach the lowest loss) is neither the first nor the last
    def loss(p: jnp.ndarray) -> jnp.ndarray:
        return jnp.sum((p**2 - 1.0) ** 2 + 0.3 * p)

    ck = tmp_path / "ck"
    kw = {"restarts": 3, "key": jax.random.PRNGKey(1), "checkpoint": ck, "progress": False}
    res = fit(loss, np.asarray([0.9]), **kw)
    ends = [round(x, 3) for x in res.restart_losses]
    best = int(np.argmin(res.restart_losses))
    assert 0 < best < len(ends) - 1 and len(set(ends)) > 1, ends
    st = lbfgs_module.LBFGSState(*res.optimizer_state)
    # the state's last evaluated point is that start's, near its minimum (not +1's)
    assert int(st.n_pairs) > 0 and abs(float(st.x[0]) - float(res.params[0])) < 1e-3
    again = fit(loss, np.asarray([0.9]), **kw)  # resumes the finished checkpoint: no step
    assert again.n_steps == res.n_steps and again.loss == res.loss
    for a, b in zip(res.optimizer_state, again.optimizer_state, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


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


def test_bad_warm_start_is_refused_saying_what_differs(rng: np.random.Generator):
    X, y = _data(rng, 20)
    res = fit(_build(X), P0, y, steps=3, progress=False)
    with pytest.raises(TypeError, match=r"FitResult of an earlier gpchol\.fit"):
        fit(_build(X), P0, y, warm_start=res.params, progress=False)
    with pytest.raises(ValueError, match=r"another optimiser \(its state is .*LBFGSState"):
        fit(_build(X), P0, y, optimizer="adam", warm_start=res, progress=False)
    no_state = dataclasses.replace(res, optimizer_state=None)
    with pytest.raises(ValueError, match="holds no optimiser state"):
        fit(_build(X), P0, y, warm_start=no_state, progress=False)

    def shared(q: dict[str, Any]) -> GaussianProcess:  # one lengthscale for both inputs
        return _build(X)({**q, "log_ls": jnp.full(2, q["log_ls"])})

    with pytest.raises(ValueError, match=r"\['log_ls'\] is float64 of shape \(2,\) there"):
        fit(shared, {**P0, "log_ls": 0.0}, y, warm_start=res, progress=False)
    renamed = {"amp": P0["log_amp"], "log_ls": P0["log_ls"], "log_noise": P0["log_noise"]}

    def build_renamed(q: dict[str, Any]) -> GaussianProcess:
        return _build(X)({"log_amp": q["amp"], "log_ls": q["log_ls"], "log_noise": q["log_noise"]})

    with pytest.raises(ValueError, match="another tree"):
        fit(build_renamed, renamed, y, warm_start=res, progress=False)
    # float32 parameters there, float64 here: the message points at JAX's 64-bit mode
    p32 = jax.tree_util.tree_map(lambda v: np.asarray(v, np.float32), P0)
    res32 = fit(_build(X), p32, y, steps=2, progress=False)
    with pytest.raises(ValueError, match=r"float32 of shape .* there.*jax_enable_x64"):
        fit(_build(X), P0, y, warm_start=res32, progress=False)


def test_optax_optimizers_are_told_apart_by_their_states(rng: np.random.Generator):
    """Every optax optimiser has one name (its class's); the state's structure tells them
    apart even where the leaves agree (SGD's momentum and RMSprop's squares: one array per
    parameter each), and gpchol's ``"adam"`` is optax's Adam."""
    X, y = _data(rng, 20)
    sgd = fit(_build(X), P0, y, optimizer=optax.sgd(0.01, momentum=0.9), steps=3, progress=False)
    assert len(sgd.optimizer_state) == len(jax.tree_util.tree_leaves(P0))
    with pytest.raises(ValueError, match=r"another optimiser .*TraceState.*ScaleByRmsState"):
        fit(_build(X), P0, y, optimizer=optax.rmsprop(0.01), warm_start=sgd, progress=False)
    with pytest.raises(ValueError, match=r"another optimiser .*TraceState.*ScaleByAdamState"):
        fit(_build(X), P0, y, optimizer=optax.adam(0.01), warm_start=sgd, progress=False)
    again = fit(
        _build(X),
        P0,
        y,
        optimizer=optax.sgd(0.01, momentum=0.9),
        steps=2,
        tol=0.0,
        warm_start=sgd,
        progress=False,
    )
    assert again.success and again.n_steps == 2
    named = fit(_build(X), P0, y, optimizer="adam", steps=3, tol=0.0, progress=False)
    by_optax = fit(
        _build(X),
        P0,
        y,
        optimizer=optax.adam(0.05),
        steps=2,
        tol=0.0,
        warm_start=named,
        progress=False,
    )
    assert int(np.asarray(by_optax.optimizer_state[0])) == 5  # Adam's step count went on


def test_a_result_without_the_state_structure(rng: np.random.Generator):
    """A result saved before the structure was recorded warm-starts gpchol's own
    optimiser of its name, and nothing it cannot be checked against."""
    X, y = _data(rng, 20)
    old = dataclasses.replace(
        fit(_build(X), P0, y, steps=3, progress=False), optimizer_state_tree=None
    )
    assert fit(_build(X), P0, y, steps=2, warm_start=old, progress=False).success
    with pytest.raises(ValueError, match="saved without its optimiser state's structure"):
        fit(_build(X), P0, y, optimizer="adam", warm_start=old, progress=False)
    sgd = fit(_build(X), P0, y, optimizer=optax.sgd(0.01), steps=2, progress=False)
    sgd = dataclasses.replace(sgd, optimizer_state_tree=None)
    with pytest.raises(ValueError, match="saved without its optimiser state's structure"):
        fit(_build(X), P0, y, optimizer=optax.sgd(0.01), warm_start=sgd, progress=False)


def test_a_saved_result_warm_starts_the_same(rng: np.random.Generator, tmp_path):
    X, y = _data(rng, 25)
    res = fit(_build(X[:24]), P0, y[:24], progress=False)
    save(res, tmp_path / "res.json")
    back = load(tmp_path / "res.json")
    for a, b in zip(res.optimizer_state, back.optimizer_state, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    a = fit(_build(X), res.params, y, warm_start=res, progress=False)
    b = fit(_build(X), res.params, y, warm_start=back, progress=False)
    cold = fit(_build(X), res.params, y, progress=False)
    np.testing.assert_array_equal(a.history, b.history)
    # the state was used: the steps differ from a cold start's (fewer or more in one fit;
    # fewer over a loop, above)
    assert len(a.history) != len(cold.history) or not np.array_equal(a.history, cold.history)


@pytest.mark.parametrize("stop_at", [(1, 2), (2, 1)], ids=["in-the-next-start", "in-the-best"])
def test_a_resumed_fit_ends_with_the_uninterrupted_state(tmp_path, stop_at):
    """Interrupted after the best start ended (the checkpoint then holds that start's
    final state) or inside it (its last state with curvature pairs), the resumed fit hands
    a warm start the same optimiser state as an uninterrupted one."""
    step, visit = stop_at

    def loss(p: jnp.ndarray) -> jnp.ndarray:  # double well; with this key start 1 is best
        return jnp.sum((p**2 - 1.0) ** 2 + 0.3 * p)

    kw = {"restarts": 1, "key": jax.random.PRNGKey(1), "progress": False}
    whole = fit(loss, np.asarray([-0.9]), **kw)
    seen: list[int] = []

    def interrupt(k: int, p: Any, v: float) -> None:
        seen.append(k)
        if k == step and seen.count(k) == visit:
            raise KeyboardInterrupt

    ck = tmp_path / "ck"
    with pytest.raises(KeyboardInterrupt):
        fit(loss, np.asarray([-0.9]), checkpoint=ck, checkpoint_every=1, callback=interrupt, **kw)
    resumed = fit(loss, np.asarray([-0.9]), checkpoint=ck, **kw)
    assert resumed.loss == whole.loss and resumed.restart_losses == whole.restart_losses
    assert int(lbfgs_module.LBFGSState(*whole.optimizer_state).n_pairs) > 0
    assert len(resumed.optimizer_state) == len(whole.optimizer_state)
    for a, b in zip(whole.optimizer_state, resumed.optimizer_state, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
