"""Kernels: values against float64 NumPy references, PSD, tiles, ARD, active_dims,
algebra, pytree behaviour, gradients, transformations and dtypes."""

import dataclasses
import inspect
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import gpchol.kernels
from gpchol import Positive, to_constrained, to_unconstrained
from gpchol import kernels as kern


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


# ------------------------------------------------------------------ NumPy references

D = 3  # input dimension of the reference table


def _diff(X1, X2):
    return X1[:, None, :] - X2[None, :, :]


def _r2(X1, X2, ls):
    return np.sum((_diff(X1, X2) / np.asarray(ls)) ** 2, axis=-1)


def ref_expsq(X1, X2, ls):
    return np.exp(-0.5 * _r2(X1, X2, ls))


def ref_m12(X1, X2, ls):
    return np.exp(-np.sqrt(_r2(X1, X2, ls)))


def ref_m32(X1, X2, ls):
    s = np.sqrt(3.0 * _r2(X1, X2, ls))
    return (1.0 + s) * np.exp(-s)


def ref_m52(X1, X2, ls):
    r2 = _r2(X1, X2, ls)
    s = np.sqrt(5.0 * r2)
    return (1.0 + s + 5.0 * r2 / 3.0) * np.exp(-s)


def ref_rq(X1, X2, ls, alpha):
    return (1.0 + _r2(X1, X2, ls) / (2.0 * alpha)) ** (-alpha)


def ref_periodic(X1, X2, ls, period):
    s = np.sin(np.pi * _diff(X1, X2) / np.asarray(period)) ** 2 / np.asarray(ls) ** 2
    return np.exp(-2.0 * np.sum(s, axis=-1))


def ref_linear(X1, X2, variance, offset):
    return variance * (X1 - offset) @ (X2 - offset).T


def ref_poly(X1, X2, degree, variance, offset):
    return (variance * X1 @ X2.T + offset) ** degree


def ref_constant(X1, X2, value):
    return np.full((X1.shape[0], X2.shape[0]), value)


def ref_white(X1, X2, variance):
    return variance * np.all(X1[:, None, :] == X2[None, :, :], axis=-1)


LS3 = np.array([0.6, 1.3, 2.1])
P3 = np.array([0.9, 1.7, 2.6])
C3 = np.array([0.3, -0.2, 0.5])

# (id, kernel factory, reference); the factory is called inside the test so that the
# parameters are created under the test's dtype settings.
CASES = [
    ("expsq", lambda: kern.ExpSquared(0.7), lambda a, b: ref_expsq(a, b, 0.7)),
    ("expsq_ard", lambda: kern.ExpSquared(jnp.asarray(LS3)), lambda a, b: ref_expsq(a, b, LS3)),
    ("matern12", lambda: kern.Matern12(0.8), lambda a, b: ref_m12(a, b, 0.8)),
    ("matern12_ard", lambda: kern.Matern12(jnp.asarray(LS3)), lambda a, b: ref_m12(a, b, LS3)),
    ("matern32", lambda: kern.Matern32(0.9), lambda a, b: ref_m32(a, b, 0.9)),
    ("matern32_ard", lambda: kern.Matern32(jnp.asarray(LS3)), lambda a, b: ref_m32(a, b, LS3)),
    ("matern52", lambda: kern.Matern52(1.1), lambda a, b: ref_m52(a, b, 1.1)),
    ("matern52_ard", lambda: kern.Matern52(jnp.asarray(LS3)), lambda a, b: ref_m52(a, b, LS3)),
    (
        "rq",
        lambda: kern.RationalQuadratic(0.9, 1.7),
        lambda a, b: ref_rq(a, b, 0.9, 1.7),
    ),
    (
        "rq_ard",
        lambda: kern.RationalQuadratic(jnp.asarray(LS3), 0.4),
        lambda a, b: ref_rq(a, b, LS3, 0.4),
    ),
    (
        "periodic",
        lambda: kern.Periodic(0.8, 1.3),
        lambda a, b: ref_periodic(a, b, 0.8, 1.3),
    ),
    (
        "periodic_ard",
        lambda: kern.Periodic(jnp.asarray(LS3), jnp.asarray(P3)),
        lambda a, b: ref_periodic(a, b, LS3, P3),
    ),
    ("linear", lambda: kern.Linear(1.3, 0.2), lambda a, b: ref_linear(a, b, 1.3, 0.2)),
    (
        "linear_offset_vec",
        lambda: kern.Linear(0.7, jnp.asarray(C3)),
        lambda a, b: ref_linear(a, b, 0.7, C3),
    ),
    ("poly1", lambda: kern.Polynomial(1, 0.5, 0.3), lambda a, b: ref_poly(a, b, 1, 0.5, 0.3)),
    ("poly2", lambda: kern.Polynomial(2, 1.2, 1.0), lambda a, b: ref_poly(a, b, 2, 1.2, 1.0)),
    ("poly3", lambda: kern.Polynomial(3, 0.4, 0.8), lambda a, b: ref_poly(a, b, 3, 0.4, 0.8)),
    ("constant", lambda: kern.Constant(1.7), lambda a, b: ref_constant(a, b, 1.7)),
    ("white", lambda: kern.White(0.3), lambda a, b: ref_white(a, b, 0.3)),
    (
        "scale",
        lambda: 2.5 * kern.Matern52(0.6),
        lambda a, b: 2.5 * ref_m52(a, b, 0.6),
    ),
    (
        "issue_example",
        lambda: 2.0 * kern.ExpSquared(lengthscale=0.5) + kern.White(),
        lambda a, b: 2.0 * ref_expsq(a, b, 0.5) + ref_white(a, b, 1.0),
    ),
    (
        "product",
        lambda: kern.ExpSquared(1.5) * kern.Periodic(1.0, 0.7),
        lambda a, b: ref_expsq(a, b, 1.5) * ref_periodic(a, b, 1.0, 0.7),
    ),
    (
        "active_dims_expsq",
        lambda: kern.ExpSquared(jnp.asarray([0.5, 2.0]), active_dims=(0, 2)),
        lambda a, b: ref_expsq(a[:, [0, 2]], b[:, [0, 2]], [0.5, 2.0]),
    ),
    (
        "active_dims_linear",
        lambda: kern.Linear(0.8, active_dims=(1,)),
        lambda a, b: ref_linear(a[:, [1]], b[:, [1]], 0.8, 0.0),
    ),
    (
        "co2_like",
        lambda: (
            4.0 * kern.ExpSquared(3.0)
            + 0.5 * kern.ExpSquared(2.0) * kern.Periodic(1.2, 1.0)
            + 0.3 * kern.RationalQuadratic(1.0, 0.8)
            + 0.1 * kern.ExpSquared(0.2)
            + kern.White(0.05)
        ),
        lambda a, b: (
            4.0 * ref_expsq(a, b, 3.0)
            + 0.5 * ref_expsq(a, b, 2.0) * ref_periodic(a, b, 1.2, 1.0)
            + 0.3 * ref_rq(a, b, 1.0, 0.8)
            + 0.1 * ref_expsq(a, b, 0.2)
            + ref_white(a, b, 0.05)
        ),
    ),
]
PARAMS = [pytest.param(c[1], c[2], id=c[0]) for c in CASES]
BASE = [c for c in CASES if c[0] not in ("issue_example", "co2_like", "product", "scale")]


def make_everything():
    """Every base kernel of the table, each scaled by an amplitude that is not a power
    of two (so that multiply-adds are not exact): one kernel that exercises all code."""
    return sum(((0.3 + 0.1 * i) * make() for i, (_, make, _) in enumerate(BASE)), 0)


def ref_everything(X1, X2):
    return sum((0.3 + 0.1 * i) * ref(X1, X2) for i, (_, _, ref) in enumerate(BASE))


EVERYTHING = [pytest.param(make_everything, ref_everything, id="everything")]
# kernels that are smooth functions of their inputs away from coincident points
# one case per family of kernels that are smooth in their inputs away from coincident points
SMOOTH_IDS = (
    "expsq_ard",
    "matern12_ard",
    "matern32_ard",
    "matern52",
    "rq_ard",
    "periodic_ard",
    "linear_offset_vec",
    "poly3",
    "product",
    "active_dims_expsq",
)
SMOOTH = [p for p in PARAMS if p.id in SMOOTH_IDS]


def _inputs(seed, n1=7, n2=5, d=D, shared=2):
    """Random inputs; the first ``shared`` rows of X2 are rows of X1 (exercises White and
    zero distances)."""
    rng = np.random.default_rng(seed)
    X1 = rng.normal(size=(n1, d))
    X2 = rng.normal(size=(n2, d))
    X2[:shared] = X1[[3, 1][:shared]]
    return X1, X2


# ----------------------------------------------------------------------------- values


@pytest.mark.parametrize(("make", "ref"), PARAMS + EVERYTHING)
def test_matches_numpy_reference_float64(x64, make, ref):
    X1, X2 = _inputs(0)
    k = make()
    K = k(jnp.asarray(X1), jnp.asarray(X2))
    assert K.shape == (7, 5)
    assert K.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(K), ref(X1, X2), rtol=1e-12, atol=1e-13)
    # the same inputs on both sides: symmetric (exactly), positive semi-definite, and
    # the cheap diagonal is the diagonal of the matrix
    S = np.asarray(k(X1, X1))
    np.testing.assert_array_equal(S, S.T)
    eig = np.linalg.eigvalsh(S)
    assert eig.min() >= -1e-10 * max(1.0, eig.max())
    d = k.diag(X1)
    assert d.shape == (7,)
    np.testing.assert_allclose(np.asarray(d), np.diag(S), rtol=1e-14)


def test_positive_semidefinite_on_more_points(x64):
    X = np.random.default_rng(3).normal(size=(40, D))
    eig = np.linalg.eigvalsh(np.asarray(make_everything()(X, X)))
    assert eig.min() >= -1e-10 * eig.max()


@pytest.mark.parametrize(
    ("make", "ref"), EVERYTHING + [p for p in PARAMS if p.id == "issue_example"]
)
def test_float32_in_float32_out(make, ref):
    X1, X2 = _inputs(1)
    k = make()
    K, d = jax.jit(lambda k, a, b: (k(a, b), k.diag(a)))(
        k, jnp.asarray(X1, jnp.float32), jnp.asarray(X2, jnp.float32)
    )
    assert K.dtype == jnp.float32 and d.dtype == jnp.float32
    expected = ref(X1.astype(np.float32).astype(np.float64), X2.astype(np.float32))
    np.testing.assert_allclose(np.asarray(K), expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(("make", "ref"), EVERYTHING)
def test_float32_kept_with_float64_parameters(x64, make, ref):
    k = jax.tree_util.tree_map(lambda p: jnp.asarray(p, jnp.float64), make())
    X1, X2 = _inputs(2)
    X1 = jnp.asarray(X1, jnp.float32)
    shapes = jax.eval_shape(lambda k: (k(X1, X2.astype(np.float32)), k.diag(X1), k(X1)), k)
    assert [s.dtype for s in shapes] == [jnp.float32] * 3
    assert jax.eval_shape(lambda k: k(X1.astype(jnp.float64)), k).dtype == jnp.float64


def _tiles_and_full(k, X, bounds):
    """The off-diagonal tiles for row/column boundaries ``bounds`` (uneven sizes, and the
    two orientations), and the full matrix."""
    pairs = list(itertools.pairwise(bounds))
    tiles = {
        (i0, j0): k(X[i0:i1], X[j0:j1])
        for (i0, i1), (j0, j1) in itertools.product(pairs, pairs)
        if i0 != j0
    }
    return tiles, k(X, X)


def _check_tiles(tiles, full, bounds, **tol):
    full = np.asarray(full)
    for (i0, j0), tile in tiles.items():
        i1, j1 = bounds[bounds.index(i0) + 1], bounds[bounds.index(j0) + 1]
        if tol:
            np.testing.assert_allclose(np.asarray(tile), full[i0:i1, j0:j1], **tol)
        else:
            np.testing.assert_array_equal(np.asarray(tile), full[i0:i1, j0:j1])


def test_tiles_equal_blocks_of_full_matrix_bit_for_bit():
    # Each base kernel computes an entry from its two rows only, elementwise, in a fixed
    # order: a tile is exactly the block of the full matrix (checked on CPU under jit).
    X = jnp.asarray(np.random.default_rng(5).normal(size=(23, D)), jnp.float32)
    X = X.at[17].set(X[4])  # a duplicated row
    bounds = (0, 7, 23)  # uneven tiles
    ks = {name: make() for name, make, _ in BASE}
    results = jax.jit(
        lambda ks, X: {name: _tiles_and_full(k, X, bounds) for name, k in ks.items()}
    )(ks, X)
    for name, (tiles, full) in results.items():
        try:
            _check_tiles(tiles, full, bounds)
        except AssertionError as err:
            raise AssertionError(f"kernel {name}: {err}") from None


@pytest.mark.slow
def test_tiles_equal_blocks_of_full_matrix_bit_for_bit_op_by_op():
    # without jit nothing is fused: sums of scaled kernels are exact too
    X = jnp.asarray(np.random.default_rng(5).normal(size=(11, D)), jnp.float32)
    X = X.at[9].set(X[1])
    k = next(p for p in PARAMS if p.id == "co2_like").values[0]()
    bounds = (0, 4, 11)
    tiles, full = _tiles_and_full(k, X, bounds)
    _check_tiles(tiles, full, bounds)


@pytest.mark.parametrize("dtype", [jnp.float32])
@pytest.mark.parametrize(("make", "ref"), EVERYTHING)
def test_tiles_equal_blocks_of_full_matrix_to_rounding(make, ref, dtype):
    # Sums of scaled kernels: under jit XLA may contract a multiply and an add into an
    # FMA differently for different shapes, so a tile may differ in the last bit.
    with jax.enable_x64(dtype == jnp.float64):
        X = jnp.asarray(np.random.default_rng(5).normal(size=(23, D)), dtype)
        X = X.at[17].set(X[4])
        bounds = (0, 7, 23)
        tiles, full = jax.jit(_tiles_and_full, static_argnums=2)(make(), X, bounds)
        eps = float(jnp.finfo(dtype).eps)
        _check_tiles(tiles, full, bounds, rtol=4 * eps, atol=4 * eps)


def test_many_columns_use_the_reduction_path(x64):
    rng = np.random.default_rng(6)
    X1, X2 = rng.normal(size=(6, 70)), rng.normal(size=(4, 70))
    ls = rng.uniform(3.0, 9.0, size=70)
    np.testing.assert_allclose(
        np.asarray(kern.ExpSquared(jnp.asarray(ls))(X1, X2)), ref_expsq(X1, X2, ls), rtol=1e-12
    )
    np.testing.assert_allclose(
        np.asarray(kern.Linear(0.5)(X1, X2)), ref_linear(X1, X2, 0.5, 0.0), rtol=1e-12
    )
    k = kern.Periodic(2.0, jnp.asarray(ls))
    np.testing.assert_allclose(np.asarray(k(X1, X2)), ref_periodic(X1, X2, 2.0, ls), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(kern.Linear(0.5).diag(X1)), 0.5 * np.sum(X1**2, 1))


# ------------------------------------------------------------------ inputs and shapes


@pytest.mark.parametrize(
    ("make", "ref"), [p for p in PARAMS if p.id in ("expsq", "matern12", "periodic", "linear")]
)
def test_one_dimensional_inputs_are_one_column(make, ref):
    x1 = np.linspace(0.0, 2.0, 6)
    x2 = np.linspace(-1.0, 1.0, 4)
    k = make()
    a = k(jnp.asarray(x1), jnp.asarray(x2))
    b = k(jnp.asarray(x1)[:, None], jnp.asarray(x2)[:, None])
    assert a.shape == (6, 4)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(k.diag(x1)), np.asarray(k.diag(x1[:, None])))


def test_second_argument_defaults_to_first():
    X = jnp.asarray(np.random.default_rng(7).normal(size=(5, 2)), jnp.float32)
    k = kern.Matern32(0.5)
    np.testing.assert_array_equal(np.asarray(k(X)), np.asarray(k(X, X)))


def test_integer_inputs_become_floating():
    K = kern.ExpSquared()(jnp.arange(3), jnp.arange(2))
    assert jnp.issubdtype(K.dtype, jnp.floating)
    np.testing.assert_allclose(np.asarray(K)[1], [np.exp(-0.5), 1.0], rtol=1e-6)


def test_bad_shapes_raise_value_error():
    k = kern.ExpSquared()
    with pytest.raises(ValueError, match=r"shape \(n, d\) or \(n,\)"):
        k(jnp.zeros((2, 3, 4)), jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match="same number of columns"):
        k(jnp.zeros((2, 3)), jnp.zeros((2, 2)))
    with pytest.raises(ValueError, match="at least one column"):
        k(jnp.zeros((2, 0)))
    with pytest.raises(ValueError, match=r"lengthscale must be a scalar or have shape \(3,\)"):
        kern.ExpSquared(jnp.ones(2))(jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"period must be a scalar or have shape \(2,\)"):
        kern.Periodic(1.0, jnp.ones(3))(jnp.zeros((2, 2)))
    with pytest.raises(ValueError, match="does not have"):
        kern.Matern12(active_dims=(0, 5))(jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match="Polynomial degree must be >= 1"):
        kern.Polynomial(degree=0)
    with pytest.raises(ValueError, match="Polynomial degree must be a positive int"):
        kern.Polynomial(degree=1.5)
    with pytest.raises(TypeError, match="active_dims"):
        kern.ExpSquared(active_dims="ab")


# --------------------------------------------------------------------- ARD, active_dims


def test_ard_with_equal_lengthscales_equals_isotropic(x64):
    X1, X2 = _inputs(8)
    iso = kern.Matern52(0.7)(X1, X2)
    ard = kern.Matern52(jnp.full(D, 0.7))(X1, X2)
    np.testing.assert_allclose(np.asarray(ard), np.asarray(iso), rtol=1e-15)


def test_ard_huge_lengthscale_switches_a_column_off(x64):
    X1, X2 = _inputs(9)
    k = kern.ExpSquared(jnp.asarray([0.5, 1e12, 2.0]))
    np.testing.assert_allclose(
        np.asarray(k(X1, X2)), ref_expsq(X1[:, [0, 2]], X2[:, [0, 2]], [0.5, 2.0]), rtol=1e-12
    )


@pytest.mark.parametrize(
    "cls", [kern.ExpSquared, kern.Matern12, kern.Matern32, kern.Matern52, kern.Periodic]
)
def test_active_dims_select_columns(cls):
    X1, X2 = _inputs(10)
    X1, X2 = jnp.asarray(X1, jnp.float32), jnp.asarray(X2, jnp.float32)
    k_sel = cls(active_dims=(2, 0))
    k_sub = cls()
    np.testing.assert_array_equal(
        np.asarray(k_sel(X1, X2)), np.asarray(k_sub(X1[:, [2, 0]], X2[:, [2, 0]]))
    )
    np.testing.assert_array_equal(np.asarray(k_sel.diag(X1)), np.ones(7, np.float32))
    # negative indices and a single int
    np.testing.assert_array_equal(
        np.asarray(cls(active_dims=-1)(X1, X2)), np.asarray(k_sub(X1[:, 2:], X2[:, 2:]))
    )


def test_active_dims_is_static_aux_data():
    a = kern.ExpSquared(0.5, active_dims=[0, 1])
    assert a.active_dims == (0, 1)
    leaves, treedef = jax.tree_util.tree_flatten(a)
    assert len(leaves) == 1
    other = jax.tree_util.tree_structure(kern.ExpSquared(0.5, active_dims=(1,)))
    assert treedef != other
    # and under jit the selection is static
    X = jnp.ones((3, 2))
    assert jax.jit(lambda k: k(X, X))(a).shape == (3, 3)


def _default_instances() -> dict[str, object]:
    """An instance of each built-in kernel and mean class constructible without
    arguments."""
    import gpchol.means

    out: dict[str, object] = {}
    for module in (gpchol.kernels, gpchol.means):
        for name in module.__all__:
            cls = getattr(module, name)
            if inspect.isclass(cls) and dataclasses.is_dataclass(cls):
                try:
                    out[f"{module.__name__}.{name}"] = cls()
                except TypeError:
                    continue
    return out


def test_structures_of_different_classes_never_compare_equal():
    """Programs are cached by pytree structure (jit's signatures, traced jaxprs). Kernels
    of one field layout (Matern32, Matern52, ExpSquared: one lengthscale) must have
    structures that compare unequal, or a cache hit hands one kernel's program to the
    other: jaxlib 0.10.2's register_dataclass nodes compare equal across classes, which
    gave a wrong log marginal likelihood now and then (gpchol/_base/pytrees.py)."""
    import gpchol

    instances = _default_instances()
    assert len(instances) >= 15, sorted(instances)
    structures = {n: jax.tree_util.tree_structure(k) for n, k in instances.items()}
    names = sorted(structures)
    for a, b in itertools.combinations(names, 2):
        if type(instances[a]) is not type(instances[b]):
            assert structures[a] != structures[b], (a, b)
    # the same through a model that holds them
    X = np.zeros((4, 1))
    same_layout = [kern.ExpSquared(), kern.Matern12(), kern.Matern32(), kern.Matern52()]
    gps = [
        jax.tree_util.tree_structure(gpchol.GaussianProcess(k, X, noise=0.1)) for k in same_layout
    ]
    for i, j in itertools.combinations(range(len(gps)), 2):
        assert gps[i] != gps[j], (same_layout[i], same_layout[j])


def test_kernels_of_one_layout_each_get_their_own_program(x64, rng):
    """One jitted function called with each kernel of one field layout, twice over: each
    call gives that kernel's own covariance (against the class's NumPy reference)."""
    X = rng.normal(size=(7, 2))
    f = jax.jit(lambda k, x: k(x))
    ks = [kern.ExpSquared(0.7), kern.Matern12(0.7), kern.Matern32(0.7), kern.Matern52(0.7)]
    first = [np.asarray(f(k, X)) for k in ks]
    for k, K in zip(ks, first, strict=True):
        np.testing.assert_allclose(np.asarray(f(k, X)), K, rtol=0, atol=0)
        np.testing.assert_allclose(K, np.asarray(k(X)), rtol=1e-13, atol=1e-13)
    for a, b in itertools.combinations(range(len(ks)), 2):
        assert not np.allclose(first[a], first[b])


# -------------------------------------------------------------------------- algebra


def test_operator_algebra_builds_the_right_trees():
    base = kern.ExpSquared(lengthscale=0.5)
    k = 2.0 * base + kern.White()
    assert isinstance(k, kern.Sum)
    assert isinstance(k.kernel1, kern.Scale) and k.kernel1.amplitude == 2.0
    assert isinstance(k.kernel2, kern.White)
    assert isinstance(base * 3.0, kern.Scale) and (base * 3.0).amplitude == 3.0
    assert isinstance(base * kern.Matern12(), kern.Product)
    assert isinstance(np.float64(2.0) * base, kern.Scale)
    assert isinstance(jnp.asarray(2.0) * base, kern.Scale)
    assert isinstance(base * np.float32(2.0), kern.Scale)
    plus = base + 1.5
    assert isinstance(plus, kern.Sum) and isinstance(plus.kernel2, kern.Constant)
    plus = 1.5 + base
    assert isinstance(plus, kern.Sum) and isinstance(plus.kernel1, kern.Constant)
    assert sum([base]) is base
    with pytest.raises(TypeError, match="scalar amplitude"):
        base * jnp.ones(3)
    with pytest.raises(TypeError, match="scalar amplitude"):
        np.ones(2) * base
    with pytest.raises(TypeError):
        base + "a"
    with pytest.raises(TypeError):
        base * None


def test_algebra_values(x64):
    X1, X2 = _inputs(11)
    a, b = kern.ExpSquared(0.6), kern.Matern32(1.2)
    Ka, Kb = np.asarray(a(X1, X2)), np.asarray(b(X1, X2))
    np.testing.assert_allclose(np.asarray((a + b)(X1, X2)), Ka + Kb, rtol=1e-15)
    np.testing.assert_allclose(np.asarray((a * b)(X1, X2)), Ka * Kb, rtol=1e-15)
    np.testing.assert_allclose(np.asarray((a * 3.0)(X1, X2)), 3.0 * Ka, rtol=1e-15)
    np.testing.assert_allclose(np.asarray((3.0 * a)(X1, X2)), 3.0 * Ka, rtol=1e-15)
    np.testing.assert_allclose(np.asarray((a + 0.5)(X1, X2)), Ka + 0.5, rtol=1e-15)
    np.testing.assert_allclose(np.asarray(sum([a, b, a])(X1, X2)), Ka + Kb + Ka, rtol=1e-15)
    np.testing.assert_allclose(
        np.asarray((2.0 * (a + b)).diag(X1)), 2.0 * (np.ones(7) + np.ones(7)), rtol=1e-15
    )


# --------------------------------------------------------------------- White semantics


def test_white_is_nonzero_exactly_where_rows_are_equal():
    X = jnp.asarray([[0.0, 1.0], [1.0, 1.0], [0.0, 1.0], [2.0, 0.0]])
    w = kern.White(0.5)
    expected = 0.5 * np.array(
        [[1, 0, 1, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]], dtype=np.float32
    )
    np.testing.assert_array_equal(np.asarray(w(X, X)), expected)  # duplicates correlate
    # equality of values, not identity of the arrays (so tiles and jit agree)
    np.testing.assert_array_equal(np.asarray(w(X, jnp.array(np.asarray(X)))), expected)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda a, b: w(a, b))(X, X)), expected)
    # distinct rows: sigma^2 I
    Xd = jnp.asarray(np.random.default_rng(12).normal(size=(6, 2)))
    np.testing.assert_array_equal(np.asarray(w(Xd, Xd)), 0.5 * np.eye(6, dtype=np.float32))
    # a test point equal to a training point picks it up
    Xs = jnp.asarray([[1.0, 1.0], [5.0, 5.0]])
    np.testing.assert_array_equal(np.asarray(w(X, Xs))[:, 0], [0.0, 0.5, 0.0, 0.0])
    # active_dims: only the named columns are compared
    w0 = kern.White(1.0, active_dims=(1,))
    assert float(w0(X[:1], X[1:2])[0, 0]) == 1.0
    np.testing.assert_array_equal(np.asarray(w.diag(X)), np.full(4, 0.5, np.float32))


# ---------------------------------------------------------------------- construction

# Every kernel class with parameters: its constructor fields in order with their
# defaults, and positional arguments for all of them (``active_dims`` as an int, list or
# tuple, normalised to a tuple). The fields named in STATIC are static pytree data.
SIGNATURES = [
    (kern.ExpSquared, {"lengthscale": 1.0, "active_dims": None}, (2.0, 1)),
    (kern.Matern12, {"lengthscale": 1.0, "active_dims": None}, (0.5, [0, 2])),
    (kern.Matern32, {"lengthscale": 1.0, "active_dims": None}, (0.7, (2, 0))),
    (kern.Matern52, {"lengthscale": 1.0, "active_dims": None}, (1.1, -1)),
    (
        kern.RationalQuadratic,
        {"lengthscale": 1.0, "alpha": 1.0, "active_dims": None},
        (0.9, 1.7, [2]),
    ),
    (kern.Periodic, {"lengthscale": 1.0, "period": 1.0, "active_dims": None}, (0.8, 1.3, 0)),
    (kern.Linear, {"variance": 1.0, "offset": 0.0, "active_dims": None}, (1.3, 0.2, (1,))),
    (
        kern.Polynomial,
        {"degree": 2, "variance": 1.0, "offset": 1.0, "active_dims": None},
        (3, 0.4, 0.8, [0, 1]),
    ),
    (kern.White, {"variance": 1.0, "active_dims": None}, (0.3, 2)),
    (kern.Constant, {"value": 1.0}, (2.5,)),
]
SIGNATURE_PARAMS = [pytest.param(*c, id=c[0].__name__) for c in SIGNATURES]
STATIC = {"active_dims", "degree"}
WITH_ACTIVE_DIMS = [c[0] for c in SIGNATURES if "active_dims" in c[1]]


def _normalized(name, value):
    if name != "active_dims":
        return value
    return (value,) if isinstance(value, int) else tuple(value)


@pytest.mark.parametrize(("cls", "defaults", "args"), SIGNATURE_PARAMS)
def test_constructor_signature_and_positional_construction(cls, defaults, args):
    params = inspect.signature(cls).parameters
    assert list(params) == list(defaults)
    assert {n: p.default for n, p in params.items()} == defaults
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params.values())
    assert [f.name for f in dataclasses.fields(cls)] == list(defaults)
    # defaults, then every field given positionally, in declaration order
    k = cls()
    assert {n: getattr(k, n) for n in defaults} == defaults
    k = cls(*args)
    expected = {n: _normalized(n, v) for n, v in zip(defaults, args, strict=True)}
    assert {n: getattr(k, n) for n in defaults} == expected
    assert (
        repr(k) == f"{cls.__name__}(" + ", ".join(f"{n}={v!r}" for n, v in expected.items()) + ")"
    )


def test_repr_is_the_dataclass_repr():
    assert repr(kern.ExpSquared(2.0)) == "ExpSquared(lengthscale=2.0, active_dims=None)"
    assert (
        repr(kern.RationalQuadratic(0.5, active_dims=[1]))
        == "RationalQuadratic(lengthscale=0.5, alpha=1.0, active_dims=(1,))"
    )
    assert (
        repr(kern.Polynomial(3, active_dims=0))
        == "Polynomial(degree=3, variance=1.0, offset=1.0, active_dims=(0,))"
    )
    assert repr(2.0 * kern.White()) == (
        "Scale(amplitude=2.0, kernel=White(variance=1.0, active_dims=None))"
    )


@pytest.mark.parametrize(("cls", "defaults", "args"), SIGNATURE_PARAMS)
def test_parameters_are_leaves_and_settings_are_static(cls, defaults, args):
    k = cls(*args)
    flat, treedef = jax.tree_util.tree_flatten_with_path(k)
    data = [n for n in defaults if n not in STATIC]
    assert [jax.tree_util.keystr(p) for p, _ in flat] == [f".{n}" for n in data]
    assert [v for _, v in flat] == [getattr(k, n) for n in data]
    back = jax.tree_util.tree_unflatten(treedef, [v for _, v in flat])
    assert type(back) is cls
    assert {n: getattr(back, n) for n in defaults} == {n: getattr(k, n) for n in defaults}
    # the static fields are part of the tree structure, the leaves are not
    assert jax.tree_util.tree_structure(cls(*args)) == treedef
    if "active_dims" in defaults:
        other = dataclasses.replace(k, active_dims=(5,))
        assert jax.tree_util.tree_structure(other) != treedef
    if data:
        changed = dataclasses.replace(k, **{data[0]: 123.0})
        assert jax.tree_util.tree_structure(changed) == treedef


@pytest.mark.parametrize(("cls", "defaults", "args"), SIGNATURE_PARAMS)
def test_kernels_are_frozen_and_compare_by_identity(cls, defaults, args):
    k = cls(*args)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(k, next(iter(defaults)), 9.0)
    # eq=False: identity equality and hashing, so kernels with array leaves are hashable
    assert k == k and k != cls(*args)
    assert hash(k) == hash(k)
    assert hash(jax.tree_util.tree_map(jnp.asarray, k)) is not None


@pytest.mark.parametrize("cls", WITH_ACTIVE_DIMS, ids=lambda c: c.__name__)
def test_active_dims_are_validated_on_construction(cls):
    assert cls(active_dims=[1, -1]).active_dims == (1, -1)
    assert cls(active_dims=np.int64(2)).active_dims == (2,)
    assert cls(active_dims=np.arange(2)).active_dims == (0, 1)
    for bad in ("ab", 1.5, [0, True], True, [0.0]):
        message = f"active_dims must be None or a sequence of column indices; got {bad!r}"
        with pytest.raises(TypeError) as err:
            cls(active_dims=bad)
        assert str(err.value) == message
    with pytest.raises(ValueError, match=r"at least one column \(or be None for all\)"):
        cls(active_dims=[])


def test_polynomial_checks_its_degree_before_active_dims():
    with pytest.raises(ValueError, match="Polynomial degree must be >= 1; got 0"):
        kern.Polynomial(0, active_dims="ab")
    assert type(kern.Polynomial(np.int64(2)).degree) is int


@pytest.mark.parametrize(
    "cls",
    [
        kern.ExpSquared,
        kern.Matern12,
        kern.Matern32,
        kern.Matern52,
        kern.RationalQuadratic,
        kern.Periodic,
    ],
)
def test_stationary_kernels_have_unit_diagonal_and_positive_parameters(cls):
    X = jnp.asarray(np.random.default_rng(23).normal(size=(4, 3)), jnp.float32)
    k = cls(active_dims=(2,))
    d = k.diag(X)
    assert d.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(d), np.ones(4, np.float32))
    np.testing.assert_array_equal(np.asarray(d), np.diag(np.asarray(k(X, X))))
    with pytest.raises(ValueError, match="does not have"):
        cls(active_dims=(5,)).diag(X)
    t = k.default_transforms()
    assert type(t) is cls and t.active_dims == (2,)
    leaves = jax.tree_util.tree_leaves(t, is_leaf=lambda x: isinstance(x, Positive))
    assert len(leaves) == len(jax.tree_util.tree_leaves(k))
    assert all(leaf == Positive() for leaf in leaves)


# --------------------------------------------------------------------------- pytrees


def test_kernels_are_flat_pytrees_with_named_leaves():
    k = 2.0 * kern.ExpSquared(lengthscale=0.5) + kern.White(0.1)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(k)[0]]
    assert paths == [".kernel1.amplitude", ".kernel1.kernel.lengthscale", ".kernel2.variance"]
    doubled = jax.tree_util.tree_map(lambda v: 2 * v, k)
    assert isinstance(doubled, kern.Sum) and doubled.kernel2.variance == 0.2
    poly = kern.Polynomial(degree=3)
    assert jax.tree_util.tree_leaves(poly) == [1.0, 1.0]
    assert len(jax.tree_util.tree_leaves(kern.Periodic(active_dims=(0,)))) == 2


def test_jit_does_not_retrace_for_new_parameter_values():
    traces = []

    @jax.jit
    def f(k, X):
        traces.append(1)
        return k(X, X)

    X = jnp.ones((4, 2))
    f(kern.ExpSquared(jnp.asarray(0.5)), X)
    f(kern.ExpSquared(jnp.asarray(0.7)), X)
    assert len(traces) == 1


def test_grad_with_respect_to_a_kernel_is_a_kernel():
    X = jnp.asarray(np.random.default_rng(13).normal(size=(5, 2)), jnp.float32)
    k = 2.0 * kern.ExpSquared(jnp.asarray([0.5, 1.5]))
    g = jax.grad(lambda k: jnp.sum(k(X, X)))(k)
    assert isinstance(g, kern.Scale) and isinstance(g.kernel, kern.ExpSquared)
    assert g.kernel.lengthscale.shape == (2,)
    assert jnp.all(jnp.isfinite(g.kernel.lengthscale))


def test_default_transforms_round_trip():
    k = (
        2.0 * kern.ExpSquared(jnp.asarray([0.5, 1.5]))
        + kern.Linear(0.3, offset=-1.0) * kern.Periodic(1.0, 2.0)
        + kern.White(0.01)
    )
    t = k.default_transforms()
    scaled, product = t.kernel1.kernel1, t.kernel1.kernel2
    assert scaled.amplitude == Positive() and scaled.kernel.lengthscale == Positive()
    assert product.kernel1.variance == Positive() and product.kernel1.offset is None
    assert product.kernel2.period == Positive() and t.kernel2.variance == Positive()
    u = to_unconstrained(k, t)
    assert isinstance(u, kern.Sum)
    back = to_constrained(u, t)
    for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(k), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5)
    with pytest.raises(ValueError, match=r"kernel2\.variance.*-1\.0"):
        bad = kern.ExpSquared() + kern.White(-1.0)
        to_unconstrained(bad, bad.default_transforms())


def test_default_transforms_of_an_active_dims_kernel_keeps_structure():
    k = kern.Matern32(0.5, active_dims=(1,))
    t = k.default_transforms()
    assert t.active_dims == (1,)
    assert jax.tree_util.tree_structure(k) == jax.tree_util.tree_structure(
        jax.tree_util.tree_map(lambda _: 0.0, t, is_leaf=lambda x: isinstance(x, Positive))
    )


# ------------------------------------------------------------------------ gradients


@pytest.mark.parametrize(("make", "ref"), PARAMS)
def test_parameter_gradients_match_finite_differences(x64, make, ref):
    X1, X2 = _inputs(14)
    W = np.random.default_rng(15).normal(size=(7, 5))
    k = jax.tree_util.tree_map(lambda p: jnp.asarray(p, jnp.float64), make())

    def f(k):
        return jnp.sum(W * k(X1, X2)) + jnp.sum(k.diag(X1))

    # reverse mode is what fitting uses; it is checked against finite differences
    check_grads(jax.jit(f), (k,), order=1, modes=("rev",), eps=1e-5, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(("make", "ref"), SMOOTH)
def test_input_gradients_match_finite_differences(x64, make, ref):
    X1, X2 = _inputs(16, shared=0)
    W = np.random.default_rng(17).normal(size=(7, 5))
    k = make()
    f = lambda a: jnp.sum(W * k(a, X2))  # noqa: E731
    check_grads(jax.jit(f), (jnp.asarray(X1),), order=1, modes=("fwd", "rev"), eps=1e-5)


@pytest.mark.parametrize(
    "cls", [kern.Matern12, kern.Matern32, kern.Matern52, kern.ExpSquared, kern.RationalQuadratic]
)
def test_gradients_finite_at_zero_distance(x64, cls):
    X = jnp.asarray(np.random.default_rng(18).normal(size=(6, 2)))
    k = cls(jnp.asarray([0.7, 1.3]))

    def f(k, A, B):
        return jnp.sum(k(A, B))

    @jax.jit
    def derivatives(k):
        # X1 == X2: every diagonal entry sits at zero distance
        grads = jax.grad(f, argnums=(0, 1, 2))(k, X, X)
        jac = jax.jacfwd(lambda A: k(A, X))(X)
        # the value at zero distance has zero slope in the first argument
        one = jax.grad(lambda a: k(a[None], X[:1])[0, 0])(X[0])
        return grads, jac, one

    (g_k, g_a, g_b), jac, one = derivatives(k)
    assert np.all(np.isfinite(np.asarray(g_k.lengthscale)))
    assert np.all(np.isfinite(np.asarray(g_a))) and np.all(np.isfinite(np.asarray(g_b)))
    assert np.all(np.isfinite(np.asarray(jac)))
    np.testing.assert_array_equal(np.asarray(one), np.zeros(2))


@pytest.mark.parametrize("cls", [kern.Matern12, kern.Matern32, kern.Matern52])
def test_matern_gradients_at_coincident_points_match_central_differences(x64, cls):
    # k(X, X0) evaluated at X = X0: the derivative through the zero distances is 0,
    # which is also what symmetric finite differences give (the cusp of Matern12 too)
    X0 = jnp.asarray(np.random.default_rng(19).normal(size=(5, 2)))
    W = jnp.asarray(np.random.default_rng(20).normal(size=(5, 5)))
    k = cls(0.8)
    check_grads(jax.jit(lambda a: jnp.sum(W * k(a, X0))), (X0,), order=1, modes=("rev",))


def _sqdist_grads_reference(X1, X2, ls, G, kind):
    """float64 NumPy gradients of ``sum(G * k(X1, X2))`` in ``(ls, X1, X2)`` from the
    difference form: ``dk/dr2`` times ``dr2`` of each coordinate."""
    D = (X1[:, None, :] - X2[None, :, :]) / ls
    r2 = np.sum(D**2, axis=-1)
    if kind == "expsq":
        dk = -0.5 * np.exp(-0.5 * r2)
    elif kind == "m52":
        s = np.sqrt(5.0 * r2)
        dk = -(5.0 / 6.0) * (1.0 + s) * np.exp(-s)
    else:  # rational quadratic, alpha = 1.5
        dk = -0.5 * (1.0 + r2 / 3.0) ** (-2.5)
    M = G * dk
    g_ls = np.einsum("ij,ijk->k", M, -2.0 * D**2 / ls)
    g_x1 = np.einsum("ij,ijk->ik", M, 2.0 * D / ls)
    g_x2 = -np.einsum("ij,ijk->jk", M, 2.0 * D / ls)
    return g_ls, g_x1, g_x2


@pytest.mark.parametrize("kind", ["expsq", "m52", "rq"])
@pytest.mark.parametrize(("dtype", "rtol"), [(np.float64, 1e-10), (np.float32, 2e-4)])
def test_distance_rule_gradients_match_difference_form_far_from_zero(rng, kind, dtype, rtol):
    # The stationary kernels' r^2 is differentiated through an expanded (matrix-product)
    # rule; inputs near 1990 (years) with spreads of a few units check that its centring
    # keeps it as accurate as the difference form, in every argument.
    d = 4
    X1 = 1990.0 + 5.0 * rng.normal(size=(9, d))
    X2 = 1990.0 + 5.0 * rng.normal(size=(6, d))
    X2[:2] = X1[[4, 0]]  # zero distances
    ls = rng.uniform(2.0, 6.0, size=d)
    G = rng.normal(size=(9, 6))
    make = {
        "expsq": lambda l: kern.ExpSquared(l),
        "m52": lambda l: kern.Matern52(l),
        "rq": lambda l: kern.RationalQuadratic(l, alpha=1.5),
    }[kind]
    with jax.enable_x64(dtype == np.float64):

        def f(l, a, b):
            return jnp.sum(jnp.asarray(G, dtype) * make(l)(a, b))

        args = [jnp.asarray(v, dtype) for v in (ls, X1, X2)]
        got = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(*args)
    want = _sqdist_grads_reference(X1, X2, ls, G, kind)
    for g, w, name in zip(got, want, ("lengthscale", "X1", "X2"), strict=True):
        scale = np.max(np.abs(w))
        np.testing.assert_allclose(
            np.asarray(g, np.float64), w, rtol=0, atol=rtol * scale, err_msg=name
        )


@pytest.mark.parametrize("kind", ["expsq", "m52", "rq"])
@pytest.mark.parametrize("d", [1, 2], ids=["isotropic", "ard"])
def test_float32_lengthscale_gradients_with_a_likelihoods_cotangent(rng, kind, d):
    """A likelihood's cotangent has a diagonal of about 1 / noise: in float32 the expanded
    rule's rounding on the diagonal (eps u^2, u = spread / lengthscale) made lengthscale
    gradients 15-25% wrong (inputs over 0..2000, lengthscale 3). Against float64."""
    n = 60
    X = rng.uniform(0.0, 2000.0, size=(n, d))
    ls = np.full(d, 3.0) if d > 1 else np.array(3.0)
    G = np.diag(np.full(n, 1e4)) + rng.normal(size=(n, n))  # K^-1-like: big diagonal
    make = {
        "expsq": lambda l: kern.ExpSquared(l),
        "m52": lambda l: kern.Matern52(l),
        "rq": lambda l: kern.RationalQuadratic(l, alpha=1.5),
    }[kind]

    def f(l, a):
        return jnp.sum(jnp.asarray(G, jnp.float32) * make(l)(a))

    got = jax.jit(jax.grad(f, argnums=(0, 1)))(
        jnp.asarray(ls, jnp.float32), jnp.asarray(X, jnp.float32)
    )
    g_ls, g_x1, g_x2 = _sqdist_grads_reference(X, X, np.broadcast_to(ls, (d,)), G, kind)
    want = (np.sum(g_ls) if d == 1 else g_ls, g_x1 + g_x2)
    for g, w, name in zip(got, want, ("lengthscale", "X"), strict=True):
        np.testing.assert_allclose(
            np.asarray(g, np.float64), w, rtol=0, atol=1e-3 * np.max(np.abs(w)), err_msg=name
        )


@pytest.mark.slow
def test_distance_rule_second_derivatives_match_finite_differences(x64, rng):
    # Hessian-vector products (e.g. a Laplace approximation) differentiate the rule itself
    X1 = rng.normal(size=(6, 3))
    X2 = rng.normal(size=(4, 3))
    W = rng.normal(size=(6, 4))

    def f(ls, a):
        return jnp.sum(W * kern.ExpSquared(ls)(a, X2))

    args = (jnp.asarray([0.8, 1.1, 1.7]), jnp.asarray(X1))
    check_grads(jax.jit(f), args, order=2, modes=("fwd", "rev"))


# ---------------------------------------------------------------- jit, vmap, dtypes


@pytest.mark.parametrize(("make", "ref"), EVERYTHING)
def test_jit_and_vmap(make, ref):
    rng = np.random.default_rng(21)
    Xb = jnp.asarray(rng.normal(size=(3, 6, D)), jnp.float32)
    k = make()
    batched, diag = jax.jit(jax.vmap(lambda X: (k(X, X[:4]), k.diag(X))))(Xb)
    assert batched.shape == (3, 6, 4) and diag.shape == (3, 6)
    for b in range(3):
        X = np.asarray(Xb[b], np.float64)
        np.testing.assert_allclose(np.asarray(batched[b]), ref(X, X[:4]), rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(np.asarray(diag[b]), np.diag(ref(X, X)), rtol=2e-5)


@pytest.mark.slow
def test_vmap_over_a_batch_of_kernels():
    X = jnp.asarray(np.random.default_rng(22).normal(size=(5, 2)), jnp.float32)
    lengthscales = jnp.asarray([[0.5, 1.0], [1.0, 2.0], [3.0, 0.2]], jnp.float32)
    amplitudes = jnp.asarray([1.0, 2.0, 0.5], jnp.float32)
    ks = kern.Scale(amplitudes, kern.Matern52(lengthscales)) + kern.White(0.1)
    ks = jax.tree_util.tree_map(jnp.asarray, ks)
    in_axes = jax.tree_util.tree_map(lambda leaf: 0 if jnp.ndim(leaf) > 0 else None, ks)
    Ks = jax.vmap(lambda k: k(X, X), in_axes=(in_axes,))(ks)
    assert Ks.shape == (3, 5, 5)
    for i in range(3):
        k = amplitudes[i] * kern.Matern52(lengthscales[i]) + kern.White(0.1)
        np.testing.assert_allclose(np.asarray(Ks[i]), np.asarray(k(X, X)), rtol=1e-6)


def test_mixed_input_dtypes_promote(x64):
    a = jnp.ones((2, 1), jnp.float32)
    b = jnp.ones((3, 1), jnp.float64)
    assert kern.ExpSquared()(a, b).dtype == jnp.float64


# ---------------------------------------------------------------------------- docs


def test_public_names():
    assert len(set(gpchol.kernels.__all__)) == len(gpchol.kernels.__all__)
    assert kern.RBF is kern.ExpSquared and kern.ExpSineSquared is kern.Periodic
    for name in gpchol.kernels.__all__:
        assert getattr(gpchol.kernels, name).__doc__


@pytest.mark.parametrize(
    "make, c",
    [(gpchol.kernels.Matern32, 1.5), (gpchol.kernels.Matern52, 5.0 / 6.0)],
    ids=["m32", "m52"],
)
def test_matern_second_derivatives_at_equal_points(make, c):
    """At equal inputs the Matérn 3/2 and 5/2 kernels' input Hessians are the exact
    ``-2 c diag(1 / l^2)`` (``k = 1 - c r^2 + O(r^3)``), and the mixed ones ``+2 c / l^2``:
    they were 0 for 3/2 and of the wrong sign for 5/2 (through sqrt's zeroed derivative).
    Nearby (r > 0) they agree with central differences of the first derivative."""
    ls = jnp.asarray([0.7, 1.9])
    k = make(ls)

    def f(a, b):
        return k(a[None], b[None])[0, 0]

    x = jnp.asarray([0.3, -1.2])
    want = 2.0 * c * np.diag(1.0 / np.asarray(ls) ** 2)
    np.testing.assert_allclose(jax.hessian(f, 0)(x, x), -want, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(jax.jacfwd(jax.grad(f, 0), 1)(x, x), want, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(jax.grad(f, 0)(x, x), np.zeros(2))
    y = x + jnp.asarray([0.05, -0.02])
    h = 1e-6
    fd = np.stack(
        [
            (jax.grad(f, 0)(x, y + h * e) - jax.grad(f, 0)(x, y - h * e)) / (2 * h)
            for e in np.eye(2)
        ],
        axis=1,
    )
    np.testing.assert_allclose(jax.jacfwd(jax.grad(f, 0), 1)(x, y), fd, rtol=1e-6, atol=1e-8)
