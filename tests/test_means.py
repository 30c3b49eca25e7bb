"""Mean functions: values, shapes, dtypes, pytrees, gradients and ``as_mean``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpchol import means


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


X = np.array([[0.0, 1.0], [2.0, -1.0], [0.5, 0.5]])

CASES = [
    pytest.param(means.Zero(), np.zeros(3), id="zero"),
    pytest.param(means.Constant(2.5), np.full(3, 2.5), id="constant"),
    pytest.param(
        means.Linear(np.array([2.0, -1.0]), 0.5), X @ np.array([2.0, -1.0]) + 0.5, id="linear"
    ),
    pytest.param(means.Linear(3.0), 3.0 * X.sum(1), id="linear_scalar_weight"),
    pytest.param(means.Function(lambda X: X[:, 0] ** 2), X[:, 0] ** 2, id="function"),
    pytest.param(
        means.Function(lambda X, p: p["a"] * X[:, 1] + p["b"], params={"a": 2.0, "b": 1.0}),
        2.0 * X[:, 1] + 1.0,
        id="function_params",
    ),
    pytest.param(means.Function(lambda X: 4.0), np.full(3, 4.0), id="function_scalar"),
]


@pytest.mark.parametrize(("m", "expected"), CASES)
def test_values_and_shape(x64, m, expected):
    out = m(jnp.asarray(X))
    assert out.shape == (3,)
    assert out.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-15)


@pytest.mark.parametrize(("m", "expected"), CASES)
def test_float32_is_kept(x64, m, expected):
    m = jax.tree_util.tree_map(lambda p: jnp.asarray(p, jnp.float64), m)
    out = m(jnp.asarray(X, jnp.float32))
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6)


@pytest.mark.parametrize(("m", "expected"), CASES)
def test_jit_vmap_and_row_subsets(m, expected):
    Xb = jnp.asarray(np.stack([X, 2 * X]), jnp.float32)
    out = jax.jit(jax.vmap(m))(Xb)
    assert out.shape == (2, 3)
    np.testing.assert_allclose(np.asarray(out[0]), expected, rtol=1e-6)
    # a subset of rows gives exactly the entries of those rows
    full = jax.jit(m)(Xb[0])
    np.testing.assert_array_equal(np.asarray(jax.jit(m)(Xb[0, 1:])), np.asarray(full)[1:])


def test_one_dimensional_inputs():
    x = jnp.asarray([0.0, 1.0, 2.0])
    np.testing.assert_allclose(np.asarray(means.Linear(2.0, 1.0)(x)), [1.0, 3.0, 5.0])
    assert means.Zero()(x).shape == (3,)
    np.testing.assert_allclose(
        np.asarray(means.Function(lambda X: X[:, 0] + 1)(x)), [1.0, 2.0, 3.0]
    )


def test_integer_inputs_become_floating():
    out = means.Constant(1.5)(jnp.arange(3))
    assert jnp.issubdtype(out.dtype, jnp.floating)


def test_pytree_leaves_and_gradients(x64):
    m = means.Linear(jnp.asarray([1.0, 2.0]), 0.5)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(m)[0]]
    assert paths == [".weights", ".bias"]
    g = jax.grad(lambda m: jnp.sum(m(X)))(m)
    np.testing.assert_allclose(np.asarray(g.weights), X.sum(0))
    assert float(g.bias) == 3.0
    assert jax.tree_util.tree_leaves(means.Zero()) == []
    f = means.Function(lambda X, p: p * X[:, 0], params=jnp.asarray(2.0))
    assert float(jax.grad(lambda f: jnp.sum(f(X)))(f).params) == X[:, 0].sum()
    # the callable is static: a lambda-only Function has no leaves
    assert jax.tree_util.tree_leaves(means.Function(jnp.sum)) == []
    assert means.Constant(1.0).default_transforms() is None


def test_as_mean():
    assert isinstance(means.as_mean(None), means.Zero)
    c = means.as_mean(1.5)
    assert isinstance(c, means.Constant) and c.value == 1.5
    assert isinstance(means.as_mean(np.float32(2.0)), means.Constant)
    assert isinstance(means.as_mean(jnp.asarray(2.0)), means.Constant)
    lin = means.Linear(1.0)
    assert means.as_mean(lin) is lin
    f = means.as_mean(lambda X: X[:, 0])
    assert isinstance(f, means.Function)
    # traced scalars (a learnable mean inside jit) become Constant means
    out = jax.jit(lambda c: means.as_mean(c)(X))(jnp.asarray(3.0))
    np.testing.assert_allclose(np.asarray(out), 3.0)


@pytest.mark.parametrize(
    "bad",
    [np.ones(3), "zero", True, object(), np.bool_(True), jnp.asarray(True)],  # NumPy's, JAX's
    ids=["vector", "string", "bool", "object", "numpy-bool", "jax-bool"],  # bools were means
)
def test_as_mean_rejects_other_things(bad):
    with pytest.raises(TypeError, match="a mean must be"):
        means.as_mean(bad)


def test_bad_shapes():
    with pytest.raises(ValueError, match=r"returned shape \(3, 2\)"):
        means.Function(lambda X: X)(X)
    with pytest.raises(ValueError, match=r"weights must be a scalar or have shape \(2,\)"):
        means.Linear(np.ones(3))(X)
    with pytest.raises(ValueError, match=r"shape \(n, d\) or \(n,\)"):
        means.Zero()(np.zeros((2, 2, 2)))
    with pytest.raises(TypeError, match="callable"):
        means.Function(3.0)
