"""gpchol's L-BFGS (``gpchol._fit.lbfgs``): the two-loop product against the BFGS matrix
recursion, convergence against closed-form and SciPy optima, the line search's guarantees
(monotone decrease, backtracking out of non-finite regions, the cached evaluation), one
copy of the loss in the compiled step, ``vmap``, and the fixed-step variant."""

from __future__ import annotations

import itertools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

from gpchol._internal import lbfgs_module

LBFGS = lbfgs_module.LBFGS
LBFGSState = lbfgs_module.LBFGSState
inverse_hessian_product = lbfgs_module.inverse_hessian_product
search_direction = lbfgs_module.search_direction


def _run(loss: Any, u0: Any, steps: int, opt: LBFGS | None = None) -> tuple[Any, list[float]]:
    """Runs ``steps`` jitted steps; returns the last parameters and the losses seen."""
    opt = LBFGS() if opt is None else opt
    step = jax.jit(opt.make_step(loss))
    u, s, values = u0, opt.init(u0), []
    for _ in range(steps):
        u, s, v, ok = step(u, s)
        assert bool(ok)
        values.append(float(v))
    return u, values


def _state_with_pairs(rng: np.random.Generator, p: int, m: int, k: int) -> LBFGSState:
    """A state after pushing ``k`` random curvature pairs (``s . y > 0``) into memory ``m``."""
    st = LBFGS(memory=m).init(jnp.zeros(p))
    s_mem, y_mem, rho = np.zeros((m, p)), np.zeros((m, p)), np.zeros(m)
    for i in range(k):
        s = rng.standard_normal(p)
        a = rng.standard_normal((p, p))
        y = (a @ a.T / p + np.eye(p)) @ s  # y = B s, B SPD: s . y > 0
        s_mem[i % m], y_mem[i % m], rho[i % m] = s, y, 1.0 / (s @ y)
    return st._replace(
        n_pairs=jnp.asarray(k, jnp.int32),
        s=jnp.asarray(s_mem),
        y=jnp.asarray(y_mem),
        rho=jnp.asarray(rho),
    )


@pytest.mark.parametrize("p, m, k", [(5, 3, 0), (5, 3, 2), (6, 4, 4), (7, 3, 8), (4, 10, 23)])
def test_two_loop_equals_bfgs_matrix_recursion(rng: np.random.Generator, p: int, m: int, k: int):
    # k > m: the ring buffer has wrapped; only the newest m pairs count, oldest first
    st = _state_with_pairs(rng, p, m, k)
    g = rng.standard_normal(p)
    order = [(k - min(k, m) + i) % m for i in range(min(k, m))]  # oldest -> newest
    if order:
        s, y = np.asarray(st.s)[order[-1]], np.asarray(st.y)[order[-1]]
        h = (s @ y) / (y @ y) * np.eye(p)
    else:
        h = min(1.0, 1.0 / np.linalg.norm(g)) * np.eye(p)
    for j in order:
        s, y = np.asarray(st.s)[j], np.asarray(st.y)[j]
        r = 1.0 / (s @ y)
        v = np.eye(p) - r * np.outer(y, s)
        h = v.T @ h @ v + r * np.outer(s, s)
    got = np.asarray(inverse_hessian_product(jnp.asarray(g), st))
    np.testing.assert_allclose(got, h @ g, rtol=1e-10, atol=1e-12)


def test_direction_falls_back_to_steepest_descent(rng: np.random.Generator):
    # a memory whose pair has s . y < 0 makes H indefinite: -H g may point uphill
    st = LBFGS(memory=2).init(jnp.zeros(2))
    st = st._replace(
        n_pairs=jnp.asarray(1, jnp.int32),
        s=jnp.asarray([[1.0, 0.0], [0.0, 0.0]]),
        y=jnp.asarray([[-1.0, 0.0], [0.0, 0.0]]),
        rho=jnp.asarray([-1.0, 0.0]),
    )
    g = jnp.asarray([2.0, 0.0])
    assert float(jnp.vdot(g, -inverse_hessian_product(g, st))) > 0  # uphill
    d, slope, cleared = search_direction(g, st)
    np.testing.assert_allclose(np.asarray(d), [-1.0, 0.0])  # -g / |g|
    assert float(slope) == -2.0 and bool(cleared)


@pytest.mark.slow_cases("40")
@pytest.mark.parametrize("p", [3, 12, 40])
def test_quadratic_reaches_closed_form_minimum(rng: np.random.Generator, p: int):
    a = rng.standard_normal((p, p))
    h = a @ a.T / p + 0.5 * np.eye(p)
    b = rng.standard_normal(p)
    want = np.linalg.solve(h, b)
    hj, bj = jnp.asarray(h), jnp.asarray(b)

    def loss(u: dict[str, jax.Array]) -> jax.Array:
        x = u["x"]
        return 0.5 * x @ hj @ x - bj @ x

    u, values = _run(loss, {"x": jnp.zeros(p)}, 3 * p + 10)
    np.testing.assert_allclose(np.asarray(u["x"]), want, rtol=1e-7, atol=1e-8)
    # monotone, up to the approximate Wolfe condition's allowance of 1e-6 |f(0)|
    assert all(b <= a + 1e-6 * abs(a) for a, b in itertools.pairwise(values))


@pytest.mark.parametrize("dim", [2, 6])
def test_rosenbrock_matches_scipy(dim: int):
    x0 = np.tile([-1.2, 1.0], dim // 2)

    def rosen(u: Any) -> jax.Array:
        x = u[0]
        return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)

    ref = scipy.optimize.minimize(
        scipy.optimize.rosen, x0, jac=scipy.optimize.rosen_der, method="L-BFGS-B"
    )
    u, values = _run(rosen, [jnp.asarray(x0)], 200)
    np.testing.assert_allclose(np.asarray(u[0]), np.ones(dim), atol=1e-6)
    np.testing.assert_allclose(ref.x, np.ones(dim), atol=1e-4)  # the reference agrees
    # no more steps than SciPy's L-BFGS-B needed iterations, with room for their line
    # searches' differences: a broken curvature pair or line search takes far longer
    steps_to_converge = next(i for i, v in enumerate(values) if v < 1e-12)
    assert steps_to_converge <= 2 * ref.nit + 10, (steps_to_converge, ref.nit)


@pytest.mark.slow
def test_cached_value_is_the_loss_at_the_new_point(rng: np.random.Generator):
    w = jnp.asarray(rng.standard_normal((30, 4)))
    t = jnp.asarray(rng.integers(0, 2, 30).astype(float))

    def logistic(u: jax.Array) -> jax.Array:
        z = w @ u
        return jnp.sum(jnp.logaddexp(0.0, z) - t * z) + 0.05 * u @ u

    opt = LBFGS()
    step = jax.jit(opt.make_step(logistic))
    u, s = jnp.zeros(4), opt.init(jnp.zeros(4))
    for _ in range(6):
        u2, s2, v, _ = step(u, s)
        assert bool(s2.known)
        np.testing.assert_array_equal(np.asarray(s2.x), np.asarray(u2))
        np.testing.assert_allclose(float(s2.value), float(logistic(u2)), rtol=1e-14)
        np.testing.assert_allclose(
            np.asarray(s2.grad), np.asarray(jax.grad(logistic)(u2)), rtol=1e-12, atol=1e-14
        )
        assert float(s2.value) <= float(v)
        u, s = u2, s2


def test_one_evaluation_per_step_when_the_first_trial_is_accepted():
    # the accepted point's value and gradient are kept in the state: a step whose first
    # trial is accepted evaluates the loss once (re-evaluating the start would double it)
    calls = []

    def rosen(x: jax.Array) -> jax.Array:
        jax.debug.callback(lambda: calls.append(1))
        return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)

    steps = 30
    _run(rosen, jnp.asarray([-1.2, 1.0]), steps)
    jax.effects_barrier()
    assert steps < len(calls) <= 1.5 * steps, len(calls)


# (a, f(a), f'(a), b, f(b), f'(b), noise) -> the zoom's next trial
_ZOOM_CASES = {
    # a quadratic is its own cubic: its minimiser, inside the bracket
    "cubic": ((0.0, 0.09, -0.6, 1.0, 0.49, 1.4, 1e-12), 0.3),
    # the cubic's minimiser (0.02) near an end: clamped to the inner 80 %, not bisected
    "clamped": ((0.0, 4e-4, -0.04, 1.0, 0.9604, 1.96, 1e-12), 0.1),
    "clamped, reversed": ((1.0, 0.9604, 1.96, 0.0, 4e-4, -0.04, 1e-12), 0.1),
    # values within the noise (a GP fit's last steps): the slopes' secant zero
    "secant": ((1.0, -5.9e-11, 2.4e-17, 0.0, 0.0, -8e-18, 3.7e-5), 0.25),
    # the secant's zero outside the bracket: clamped
    "secant, clamped": ((0.0, 1.0, -1.0, 1.0, 1.0, -0.5, 1e-3), 0.9),
    # flat values and equal slopes (the secant 0 / 0), or slopes falling across the
    # bracket (the secant's zero a maximum): bisection
    "secant undefined": ((0.0, 1.0, 2.0, 1.0, 1.0, 2.0, 1e-3), 0.5),
    "secant at a maximum": ((0.0, 1.0, 1.0, 1.0, 1.0, -3.0, 1e-3), 0.5),
    "not finite": ((0.0, 1.0, -1.0, 1.0, np.inf, 1.0, 1e-12), 0.5),
}


@pytest.mark.parametrize("xp", [np, jnp], ids=["host", "compiled"])
@pytest.mark.parametrize("case", _ZOOM_CASES, ids=list(_ZOOM_CASES))
def test_zoom_trial(case: str, xp: Any):
    args, want = _ZOOM_CASES[case]
    a, b = (xp.asarray(v, xp.float32 if xp is jnp else float) for v in (args[:3], args[3:6]))
    with np.errstate(all="ignore"):  # as the host search runs it (0 / 0 in some cases)
        t = lbfgs_module._zoom_step(tuple(a), tuple(b), args[6])
    np.testing.assert_allclose(float(t), want, rtol=1e-5)


@pytest.mark.parametrize("amplitude", [1e-12, 1e-11, 3e-11])
def test_search_at_the_rounding_floor_takes_the_secant(amplitude: float):
    # near a minimum the loss's values are rounding noise (here a 1e-11 wiggle on 37, as in
    # a GP fit's last steps) while its gradient still points: the first trial overshoots,
    # and the zoom goes to the slopes' zero. A cubic through the noisy values flailed there
    # (21 evaluations at 3e-11, checked), a cost each step of a converged fit paid again.
    calls = []

    def value_and_grad(x: np.ndarray, _: Any) -> tuple[np.ndarray, np.ndarray]:
        calls.append(1)
        wiggle = amplitude * np.sin(1e7 * x[0])
        return 37.0 + 2.0 * np.sum((x - 1.0) ** 2) + wiggle, 4.0 * (x - 1.0)

    opt = LBFGS()
    u = np.asarray([1.0 + 1e-6])
    u, *_ = opt.host_step(value_and_grad)(u, opt.init(u), None)
    assert len(calls) == 3, len(calls)  # the start, t = 1, the secant's zero
    np.testing.assert_allclose(u, [1.0], atol=1e-12)


def test_loss_is_traced_once_per_compiled_step():
    traces = []

    def loss(u: jax.Array) -> jax.Array:
        traces.append(1)
        return jnp.sum((u - 1.0) ** 2)

    opt = LBFGS()
    jax.jit(opt.make_step(loss)).lower(jnp.zeros(3), opt.init(jnp.zeros(3)))
    assert len(traces) == 1


def test_backtracks_out_of_nonfinite_region():
    # -log(1 - x) is NaN beyond x = 1, where the first trials land (minimum near 0.618)
    def loss(u: jax.Array) -> jax.Array:
        return jnp.sum(-jnp.log(1.0 - u) + 2.0 * u**2 - 3.0 * u)

    x, values = _run(loss, jnp.asarray([-3.0]), 30)
    want = scipy.optimize.brentq(lambda x: 1.0 / (1.0 - x) + 4.0 * x - 3.0, -5.0, 0.999)
    np.testing.assert_allclose(float(x[0]), want, rtol=1e-8)
    assert all(np.isfinite(values))


def test_trial_with_finite_value_but_nonfinite_gradient_is_backtracked():
    # beyond x = 0.98 the value is finite (and lower) but the gradient is NaN (the branch
    # jnp.where does not take has sqrt's NaN derivative there): such a trial counts as
    # failed, not as a decrease to accept (checked: accepting it fails this test)
    def loss(u: jax.Array) -> jax.Array:
        return jnp.sum(jnp.where(u < 0.98, (u - 0.95) ** 2 + 0.0 * jnp.sqrt(0.98 - u), -1.0))

    x, _ = _run(loss, jnp.asarray([0.0]), 5)  # _run asserts every gradient finite
    np.testing.assert_allclose(float(x[0]), 0.95, atol=1e-10)


def test_nonfinite_start_is_reported_and_does_not_move():
    opt = LBFGS()
    step = jax.jit(opt.make_step(lambda u: jnp.sum(jnp.log(u))))
    u0 = jnp.asarray([-1.0, 2.0])
    u, s, v, _ok = step(u0, opt.init(u0))
    assert not np.isfinite(float(v))
    np.testing.assert_array_equal(np.asarray(u), np.asarray(u0))
    assert not bool(s.known)


@pytest.mark.slow
def test_vmap_equals_one_problem_at_a_time(rng: np.random.Generator):
    c = jnp.asarray(rng.uniform(0.5, 3.0, (3, 2)))

    def loss(u: jax.Array, ci: jax.Array) -> jax.Array:
        return jnp.sum(jnp.cosh(u - ci)) + 0.1 * jnp.sum(u**4)

    opt = LBFGS()
    u0 = jnp.zeros((3, 2))
    batched = jax.jit(jax.vmap(lambda u, s, ci: opt.make_step(lambda v: loss(v, ci))(u, s)))
    ub, sb = u0, jax.vmap(opt.init)(u0)
    for _ in range(8):
        ub, sb, _, _ = batched(ub, sb, c)
    for i in range(3):
        ui, _ = _run(lambda v, i=i: loss(v, c[i]), u0[i], 8, opt)
        np.testing.assert_allclose(np.asarray(ub[i]), np.asarray(ui), rtol=1e-12, atol=1e-14)


def test_fixed_learning_rate_converges(rng: np.random.Generator):
    a = rng.standard_normal((5, 5))
    h = jnp.asarray(a @ a.T / 5 + np.eye(5))
    b = jnp.asarray(rng.standard_normal(5))
    u, _ = _run(lambda x: 0.5 * x @ h @ x - b @ x, jnp.zeros(5), 60, LBFGS(learning_rate=1.0))
    np.testing.assert_allclose(np.asarray(u), np.linalg.solve(h, b), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"memory": 0}, "memory"), ({"max_evaluations": 0}, "max_evaluations")],
)
def test_bad_settings(kwargs: dict[str, int], match: str):
    with pytest.raises(ValueError, match=match):
        LBFGS(**kwargs)


# ------------------------------------------------------------------ host-driven search


def _rosenbrock(u: jax.Array) -> jax.Array:
    return jnp.sum(100.0 * (u[1:] - u[:-1] ** 2) ** 2 + (1.0 - u[:-1]) ** 2)


def _log_barrier(u: jax.Array) -> jax.Array:
    return jnp.sum(-jnp.log(1.0 - u) + 2.0 * u**2 - 3.0 * u)


def _nan_gradient(u: jax.Array) -> jax.Array:
    return jnp.sum(jnp.where(u < 0.98, (u - 0.95) ** 2 + 0.0 * jnp.sqrt(0.98 - u), -1.0))


@pytest.mark.parametrize(
    "loss, u0, steps",
    [
        (_rosenbrock, [-1.2, 1.0, -0.5, 0.3], 60),
        (_log_barrier, [-3.0], 30),  # trials into the NaN region are backtracked
        (_nan_gradient, [0.0], 8),  # a finite value with a NaN gradient is no decrease
        (lambda u: jnp.sum(jnp.log(u)), [-1.0, 2.0], 2),  # a non-finite start
    ],
)
def test_host_driven_step_takes_the_compiled_steps(loss: Any, u0: list, steps: int):
    # The same functions cut at the evaluations, the search's bookkeeping in NumPy on the
    # host: the same trials, stages and memory; the numbers agree to rounding (XLA fuses
    # and contracts where NumPy does not, a last-bit difference per operation). Each step
    # starts both from the compiled step's state: left to run apart, Rosenbrock's valley
    # compounds those last bits (60 steps drifted to 2e-9 of the iterates on one of this
    # project's CPU machines and stayed below 1e-11 on another).
    opt = LBFGS()
    compiled = jax.jit(opt.make_step(loss))
    host = opt.host_step(jax.jit(lambda x, data: jax.value_and_grad(loss)(x)))
    u = v = jnp.asarray(u0)
    s = t = opt.init(u)
    for _ in range(steps):
        u, s, fu, oku = compiled(u, s)
        v, t, fv, okv = host(v, t, None)
        assert isinstance(t.s, np.ndarray)  # the host search's state is NumPy's
        assert [np.asarray(b).dtype for b in t] == [np.asarray(a).dtype for a in s]
        np.testing.assert_allclose(np.asarray(v), np.asarray(u), rtol=1e-10, atol=1e-300)
        # near the minimum (Rosenbrock's is 0) the loss is compared on the start's scale
        scale = max(1.0, abs(float(loss(jnp.asarray(u0)))))
        np.testing.assert_allclose(float(fv), float(fu), rtol=1e-10, atol=1e-12 * scale)
        assert bool(oku) == bool(okv)
        assert int(s.n_pairs) == int(t.n_pairs) and bool(s.known) == bool(t.known)
        for a, b in ((s.x, t.x), (s.value, t.value), (s.grad, t.grad)):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-9, atol=1e-12)
        v, t = u, jax.tree_util.tree_map(np.asarray, s)


def test_host_driven_search_keeps_float32():
    # the host's selections hand back either operand as it is (Python scalars included):
    # the state and the parameters stay in the parameters' dtype
    opt = LBFGS()

    def loss(u: jax.Array) -> jax.Array:
        return jnp.sum((u - jnp.asarray([1.0, -2.0], u.dtype)) ** 2 * jnp.arange(1, 3))

    step = opt.host_step(jax.jit(lambda x, data: jax.value_and_grad(loss)(x)))
    u = jnp.zeros(2, jnp.float32)
    s = opt.init(u)
    for _ in range(6):
        u, s, f, ok = step(u, s, None)
        assert np.asarray(f).dtype == np.float32
        assert np.asarray(u).dtype == np.float32 and bool(ok)
        assert s.x.dtype == s.grad.dtype == s.s.dtype == s.rho.dtype == np.float32
        assert s.value.dtype == np.float32 and s.n_pairs.dtype == np.int32
    np.testing.assert_allclose(np.asarray(u), [1.0, -2.0], rtol=1e-6)


def test_host_driven_search_compiles_only_the_loss():
    from tests.helpers import backend_compiles

    opt = LBFGS()
    u0 = jnp.linspace(-1.0, 1.0, 5)

    def run(loss: Any) -> None:
        step = opt.host_step(jax.jit(lambda x, data: jax.value_and_grad(loss)(x)))
        u, s = u0, opt.init(u0)
        for _ in range(5):
            u, s, _, _ = step(u, s, None)

    run(lambda u: jnp.sum((u - 0.3) ** 2))  # the eager operations of init, once
    # the search is NumPy's on the host: a loss's value and gradient is all that compiles
    names = backend_compiles(lambda: run(lambda u: jnp.sum(jnp.cosh(u - 0.1))))
    assert len(names) == 1 and "lambda" in names[0], names
