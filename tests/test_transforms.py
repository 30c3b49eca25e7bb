"""Parameter transforms: round trips, ranges, stability, pytree prefixes and errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpchol import (
    Bounded,
    Identity,
    Positive,
    Transform,
    to_constrained,
    to_unconstrained,
)
from gpchol._internal import Below, LogPositive


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


TRANSFORMS = [
    pytest.param(Identity(), np.array([-3.0, 0.0, 2.5]), id="identity"),
    pytest.param(Positive(), np.array([1e-6, 0.3, 1.0, 50.0, 1e6]), id="positive"),
    pytest.param(Positive(lower=0.5), np.array([0.5 + 1e-6, 0.6, 3.0, 1e4]), id="positive_lower"),
    pytest.param(Bounded(-1.0, 3.0), np.array([-0.999, -0.5, 1.0, 2.999]), id="bounded"),
    pytest.param(Below(2.0), np.array([-1e4, -3.0, 1.9, 2.0 - 1e-6]), id="below"),
]


@pytest.mark.parametrize(("t", "values"), TRANSFORMS)
def test_round_trip_constrained(x64, t, values):
    u = t.inverse(values)
    assert u.dtype == jnp.float64
    assert np.all(np.isfinite(np.asarray(u)))
    np.testing.assert_allclose(np.asarray(t.forward(u)), values, rtol=1e-12)


@pytest.mark.parametrize(("t", "values"), TRANSFORMS)
def test_round_trip_unconstrained(x64, t, values):
    u = np.array([-20.0, -3.0, 0.0, 2.0, 15.0])
    np.testing.assert_allclose(np.asarray(t.inverse(t.forward(u))), u, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize(("t", "values"), TRANSFORMS)
def test_float32_is_kept(t, values):
    c = jnp.asarray(values, jnp.float32)
    u = t.inverse(c)
    assert u.dtype == jnp.float32
    assert t.forward(u).dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(t.forward(u)), values, rtol=1e-5)


def test_positive_forward_is_softplus_and_stays_in_range(x64):
    u = jnp.asarray([-800.0, -30.0, 0.0, 30.0, 800.0])
    c = Positive().forward(u)
    assert np.all(np.asarray(c) >= 0) and np.all(np.isfinite(np.asarray(c)))
    np.testing.assert_allclose(np.asarray(c)[1:4], np.log1p(np.exp([-30.0, 0.0, 30.0])))
    assert float(c[-1]) == 800.0  # no overflow for large u
    # mathematically > lower; in floating point it may round to lower for very negative u
    assert float(Positive(lower=2.0).forward(-10.0)) > 2.0
    assert float(Positive(lower=2.0).forward(-50.0)) >= 2.0
    np.testing.assert_allclose(float(Positive(lower=2.0).forward(0.0)), 2.0 + np.log(2.0))


def test_positive_inverse_is_accurate_at_both_ends(x64):
    t = Positive()
    # softplus^-1(c) = log(expm1(c)): ~log(c) for tiny c, ~c for large c
    np.testing.assert_allclose(float(t.inverse(1e-30)), np.log(1e-30), rtol=1e-12)
    np.testing.assert_allclose(float(t.inverse(1e4)), 1e4, rtol=1e-15)
    np.testing.assert_allclose(float(t.inverse(1.0)), np.log(np.expm1(1.0)), rtol=1e-14)


def test_bounded_forward_stays_inside(x64):
    t = Bounded(2.0, 5.0)
    c = np.asarray(t.forward(jnp.asarray([-30.0, 0.0, 30.0])))
    assert np.all((c > 2.0) & (c < 5.0))
    assert c[1] == 3.5
    np.testing.assert_allclose(float(t.inverse(4.999999)), np.log(2.999999 / 1e-6), rtol=1e-6)


def test_gradients_are_finite(x64):
    for t in (Positive(), Positive(lower=1.0), Bounded(0.0, 2.0), Identity()):
        g = jax.grad(lambda u, t=t: jnp.sum(t.forward(u)))(jnp.asarray([-5.0, 0.0, 5.0]))
        assert np.all(np.isfinite(np.asarray(g)))


def test_inverse_works_under_jit_without_checks():
    # traced values cannot be checked; the transforms still work inside jit
    u = jax.jit(Positive().inverse)(jnp.asarray(2.0))
    np.testing.assert_allclose(float(Positive().forward(u)), 2.0, rtol=1e-6)


@pytest.mark.parametrize(
    ("t", "bad", "pattern"),
    [
        (Positive(), -1.0, r"value -1\.0 is outside the domain of Positive\(lower=0\.0\)"),
        (Positive(), 0.0, r"value 0\.0 .* must be > 0\.0"),
        (Positive(), float("nan"), r"value nan"),
        (Positive(lower=1.0), 0.5, r"value 0\.5 .* must be > 1\.0"),
        (Bounded(0.0, 1.0), 1.0, r"value 1\.0 .* strictly between 0\.0 and 1\.0"),
        (Bounded(0.0, 1.0), -2.0, r"value -2\.0"),
        (Below(2.0), 2.5, r"value 2\.5 .* must be < 2\.0"),
    ],
)
def test_values_outside_the_domain_raise(t, bad, pattern):
    with pytest.raises(ValueError, match=pattern):
        t.inverse(bad)


@pytest.mark.parametrize(
    ("t", "value"),
    [
        (Bounded(0.0, 1.0), 0.99999999),
        (Bounded(0.1, 0.3), 0.10000000001),
        (Positive(), 1e-50),
        (LogPositive(), 1e-46),
        (Below(1.0), 0.99999999),
    ],
)
def test_values_inside_that_round_onto_the_boundary_in_float32_raise(t, value):
    # Inside the domain in float64, on its boundary in float32: the inverse was +-inf and a
    # fit started there could not move. In float64 the same value is fine.
    with jax.enable_x64(False):
        with pytest.raises(ValueError, match=r"too close to the boundary .* for float32"):
            t.inverse(value)
        with pytest.raises(ValueError, match=r"parameter \['p'\]: value"):
            to_unconstrained({"p": value}, {"p": t})
    with jax.enable_x64(True):
        u = t.inverse(value)
        assert u.dtype == jnp.float64 and np.isfinite(u)
        np.testing.assert_allclose(t.forward(u), value, rtol=1e-6)


def test_infinite_and_overflowing_values_are_refused_as_such():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy overflow warning before the error
        with jax.enable_x64(False):
            with pytest.raises(ValueError, match=r"value 1e\+39 of Positive.* overflows float32"):
                Positive().inverse(1e39)
        with pytest.raises(ValueError, match=r"value inf of LogPositive\(\) is not finite"):
            LogPositive().inverse(float("inf"))
        with pytest.raises(ValueError, match=r"\[1\]=inf .* is not finite"):
            Positive().inverse(np.array([1.0, np.inf]))


def test_array_error_names_the_offending_entries():
    with pytest.raises(ValueError, match=r"\[1\]=-2\.0.*shape \(3,\)"):
        Positive().inverse(np.array([1.0, -2.0, 3.0]))


def test_bad_construction():
    with pytest.raises(ValueError, match="low < high"):
        Bounded(1.0, 1.0)
    with pytest.raises(ValueError, match="finite"):
        Bounded(0.0, float("inf"))
    with pytest.raises(ValueError, match="finite"):
        Positive(lower=float("nan"))
    with pytest.raises(TypeError, match="real number"):
        Positive(lower="a")


def test_transforms_are_hashable_values_not_pytrees():
    assert Positive() == Positive() and hash(Positive()) == hash(Positive())
    assert Bounded(0.0, 1.0) != Bounded(0.0, 2.0)
    assert jax.tree_util.tree_leaves([Positive(), Bounded(0.0, 1.0)]) == [
        Positive(),
        Bounded(0.0, 1.0),
    ]
    assert isinstance(Identity(), Transform)
    assert float(Positive()(0.0)) == pytest.approx(np.log(2.0))


# ------------------------------------------------------------------- pytree helpers


def test_prefix_transforms_map_subtrees(x64):
    params = {
        "kernel": {"lengthscale": jnp.asarray([0.5, 2.0]), "amplitude": 3.0},
        "mean": -1.5,
        "noise": 0.1,
        "period": 1.0,
    }
    transforms = {
        "kernel": Positive(),
        "mean": None,
        "noise": Positive(lower=1e-6),
        "period": Bounded(0.5, 2.0),
    }
    u = to_unconstrained(params, transforms)
    assert jax.tree_util.tree_structure(u) == jax.tree_util.tree_structure(params)
    assert u["mean"] == -1.5  # untouched, not even converted
    np.testing.assert_allclose(float(u["kernel"]["amplitude"]), np.log(np.expm1(3.0)))
    np.testing.assert_allclose(float(u["period"]), np.log(0.5 / 1.0), rtol=1e-15)
    back = to_constrained(u, transforms)
    for a, b in zip(
        jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(params), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12)


def test_none_and_single_transform(x64):
    params = {"a": 1.0, "b": [2.0, 3.0]}
    assert to_unconstrained(params, None) is params
    u = to_unconstrained(params, Positive())
    np.testing.assert_allclose(float(u["b"][1]), np.log(np.expm1(3.0)))


def test_constrained_is_differentiable(x64):
    transforms = {"ls": Positive(), "c": None}

    def loss(u):
        p = to_constrained(u, transforms)
        return p["ls"] ** 2 + p["c"]

    u = to_unconstrained({"ls": 2.0, "c": 1.0}, transforms)
    g = jax.jit(jax.grad(loss))(u)
    sigmoid = 1.0 / (1.0 + np.exp(-float(u["ls"])))
    np.testing.assert_allclose(float(g["ls"]), 2.0 * 2.0 * sigmoid, rtol=1e-12)
    assert float(g["c"]) == 1.0


def test_error_names_the_parameter_path():
    with pytest.raises(ValueError, match=r"parameter \['kernel'\]\['lengthscale'\]\[1\].*-0\.5"):
        to_unconstrained({"kernel": {"lengthscale": [1.0, -0.5]}}, {"kernel": Positive()})


def test_structure_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="prefix of params"):
        to_unconstrained({"a": 1.0}, {"b": Positive()})
    with pytest.raises(ValueError, match="prefix of params"):
        to_unconstrained([1.0, 2.0], [Positive()])
