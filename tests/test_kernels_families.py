"""The added kernel families (Cosine, SpectralMixture, ChangePoints, Power) and the input
transforms (Subspace, InputScale, LinearMap, Warp, KumaraswamyWarp): float64 NumPy
references, the peers' values where they have the kernel (tinygp's Cosine,
scikit-learn's ``**``; GPyTorch's spectral mixture and GPflow's ChangePoints formulas),
positive semi-definiteness, diagonals, gradients, jit/vmap, dtypes and errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from gpchol import Positive, means, to_constrained, to_unconstrained
from gpchol import kernels as kern


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


# ------------------------------------------------------------------ NumPy references


def _tau(X1, X2):
    return X1[:, None, :] - X2[None, :, :]


def ref_expsq(X1, X2, ls=1.0):
    return np.exp(-0.5 * np.sum((_tau(X1, X2) / ls) ** 2, axis=-1))


def ref_matern32(X1, X2, ls=1.0):
    s = np.sqrt(3.0 * np.sum((_tau(X1, X2) / ls) ** 2, axis=-1))
    return (1 + s) * np.exp(-s)


def ref_cosine(X1, X2, period):
    return np.cos(2 * np.pi * np.sum(_tau(X1, X2) / period, axis=-1))


def ref_spectral_mixture(X1, X2, w, mu, sigma):
    # Wilson & Adams (2013) eq. 12, as GPyTorch's SpectralMixtureKernel parametrises it
    # (mixture_scales multiply tau inside the exponential)
    tau = _tau(X1, X2)[None]  # (1, n1, n2, d)
    mu, sigma = mu[:, None, None, :], sigma[:, None, None, :]
    terms = np.exp(-2 * np.pi**2 * tau**2 * sigma**2) * np.cos(2 * np.pi * tau * mu)
    return np.einsum("q,qij->ij", w, np.prod(terms, axis=-1))


def ref_gpflow_changepoints(Ks, X1, X2, locations, steepness, dim=0):
    """GPflow's ChangePoints.K written in NumPy (sigmoids of steepness * (x - loc))."""
    order = np.argsort(locations)
    locs, steep = np.asarray(locations)[order], np.asarray(steepness)[order]

    def sig(X):
        return 1.0 / (1.0 + np.exp(-steep[None, :] * (X[:, dim : dim + 1] - locs[None, :])))

    s1, s2 = sig(X1), sig(X2)  # (n, m)
    starters = s1[:, None, :] * s2[None, :, :]
    stoppers = (1 - s1)[:, None, :] * (1 - s2)[None, :, :]
    ones = np.ones(starters.shape[:2] + (1,))
    starters = np.concatenate([ones, starters], axis=2)
    stoppers = np.concatenate([stoppers, ones], axis=2)
    stack = np.stack(Ks, axis=2)
    return np.sum(stack * starters * stoppers, axis=2)


def kumaraswamy(X, a, b):
    return 1 - (1 - X**a) ** b


def _pts(rng, n, d, low=-2.0, high=2.0):
    return rng.uniform(low, high, size=(n, d))


# ------------------------------------------------------------------- value tables

SM_W = np.array([0.7, 0.2, 1.1])
SM_MU = np.array([[0.1, 0.5], [0.9, 0.3], [0.0, 1.3]])
SM_SIGMA = np.array([[0.4, 0.2], [0.1, 0.7], [0.3, 0.3]])


def _cases():
    """(id, kernel, reference(X1, X2)) on 2-D inputs in (0, 1)."""
    A = np.array([[0.8, -0.4], [0.3, 1.5], [-1.0, 0.2]])
    e = kern.ExpSquared(0.7)
    return [
        ("cosine", kern.Cosine(1.7), lambda a, b: ref_cosine(a, b, 1.7)),
        (
            "cosine-ard",
            kern.Cosine(np.array([1.3, 2.9])),
            lambda a, b: ref_cosine(a, b, np.array([1.3, 2.9])),
        ),
        (
            "spectral-mixture",
            kern.SpectralMixture(SM_W, SM_MU, SM_SIGMA),
            lambda a, b: ref_spectral_mixture(a, b, SM_W, SM_MU, SM_SIGMA),
        ),
        (
            "spectral-mixture-iso",
            kern.SpectralMixture(SM_W, SM_MU[:, 0], SM_SIGMA[:, 0]),
            lambda a, b: ref_spectral_mixture(
                a, b, SM_W, np.repeat(SM_MU[:, :1], 2, 1), np.repeat(SM_SIGMA[:, :1], 2, 1)
            ),
        ),
        (
            "changepoints-1",
            kern.ChangePoints((e, 2.0 * kern.Matern32(0.4)), locations=0.4, widths=0.1),
            lambda a, b: ref_gpflow_changepoints(
                [ref_expsq(a, b, 0.7), 2.0 * ref_matern32(a, b, 0.4)], a, b, [0.4], [10.0]
            ),
        ),
        (
            "changepoints-3-unsorted-dim1",
            kern.ChangePoints(
                [e, kern.Cosine(0.5), 3.0 * e, kern.Constant(0.5)],
                locations=np.array([0.7, 0.2, 0.5]),
                widths=np.array([0.05, 0.2, 0.1]),
                dim=1,
            ),
            lambda a, b: ref_gpflow_changepoints(
                [
                    ref_expsq(a, b, 0.7),
                    ref_cosine(a, b, 0.5),
                    3 * ref_expsq(a, b, 0.7),
                    np.full((len(a), len(b)), 0.5),
                ],
                a,
                b,
                [0.7, 0.2, 0.5],
                [20.0, 5.0, 10.0],
                dim=1,
            ),
        ),
        (
            "power-int",
            kern.Linear(0.5, offset=0.3) ** 3,
            lambda a, b: (0.5 * (a - 0.3) @ (b - 0.3).T) ** 3,
        ),
        ("power-float", e**2.5, lambda a, b: ref_expsq(a, b, 0.7) ** 2.5),
        ("subspace", kern.Subspace(e, dims=(1,)), lambda a, b: ref_expsq(a[:, 1:], b[:, 1:], 0.7)),
        (
            "input-scale",
            kern.InputScale(kern.Matern32(), np.array([0.3, 2.0])),
            lambda a, b: ref_matern32(a, b, np.array([0.3, 2.0])),
        ),
        ("linear-map", kern.LinearMap(e, A), lambda a, b: ref_expsq(a @ A.T, b @ A.T, 0.7)),
        (
            "warp-fn",
            kern.Warp(e, fn=lambda x: jnp.stack([jnp.log(x[0]), x[0] * x[1]])),
            lambda a, b: ref_expsq(
                np.stack([np.log(a[:, 0]), a[:, 0] * a[:, 1]], 1),
                np.stack([np.log(b[:, 0]), b[:, 0] * b[:, 1]], 1),
                0.7,
            ),
        ),
        (
            "warp-params",
            kern.Warp(e, fn=lambda x, p: jnp.sinh(p * x), params=np.array([1.5, 0.5])),
            lambda a, b: ref_expsq(np.sinh(a * [1.5, 0.5]), np.sinh(b * [1.5, 0.5]), 0.7),
        ),
        (
            "kumaraswamy",
            kern.KumaraswamyWarp(kern.Matern32(0.3), a=np.array([0.6, 2.0]), b=1.7),
            lambda a, b: ref_matern32(
                kumaraswamy(a, np.array([0.6, 2.0]), 1.7),
                kumaraswamy(b, np.array([0.6, 2.0]), 1.7),
                0.3,
            ),
        ),
    ]


CASES = [pytest.param(k, ref, id=name) for name, k, ref in _cases()]


@pytest.mark.slow_cases("changepoints-1", "spectral-mixture")
@pytest.mark.parametrize(("k", "ref"), CASES)
def test_matches_numpy_reference_float64(x64, rng, k, ref):
    X1, X2 = rng.uniform(0.02, 0.98, (9, 2)), rng.uniform(0.02, 0.98, (6, 2))
    K = k(X1, X2)
    assert K.dtype == jnp.float64 and K.shape == (9, 6)
    np.testing.assert_allclose(K, ref(X1, X2), rtol=1e-12, atol=1e-14)
    Kxx = np.asarray(k(X1))
    np.testing.assert_allclose(k.diag(X1), np.diag(Kxx), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(Kxx, Kxx.T, rtol=1e-14, atol=1e-15)
    assert np.linalg.eigvalsh(Kxx).min() > -1e-10 * max(1.0, np.abs(Kxx).max())  # PSD
    np.testing.assert_allclose(float(k.evaluate(X1[2], X2[3])), K[2, 3], rtol=1e-13)


@pytest.mark.parametrize(("k", "ref"), CASES)
def test_float32_in_float32_out(k, ref):
    X = np.random.default_rng(3).uniform(0.05, 0.95, (5, 2)).astype(np.float32)
    K = k(X)
    assert K.dtype == jnp.float32 and k.diag(X).dtype == jnp.float32
    np.testing.assert_allclose(K, ref(X.astype(float), X.astype(float)), rtol=2e-4, atol=2e-5)


# ---------------------------------------------------------------------------- peers


def test_cosine_matches_tinygp(x64, rng):
    tinygp = pytest.importorskip("tinygp")
    x1, x2 = rng.uniform(-3, 3, 11), rng.uniform(-3, 3, 7)
    for period in (0.3, 1.0, 4.5):
        ours = kern.Cosine(period)(x1, x2)
        theirs = tinygp.kernels.Cosine(scale=period)(jnp.asarray(x1), jnp.asarray(x2))
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-10)


@pytest.mark.parametrize("exponent", [2, 3.7])
def test_power_matches_scikit_learn_exponentiation(x64, rng, exponent):
    skk = pytest.importorskip("sklearn.gaussian_process.kernels")
    X1, X2 = rng.normal(size=(8, 3)), rng.normal(size=(5, 3))
    pairs = [
        (kern.ExpSquared(0.8), skk.RBF(0.8)),
        (kern.RationalQuadratic(1.3, 0.7), skk.RationalQuadratic(1.3, 0.7)),
        (2.0 * kern.Matern52(1.1) + 0.5, skk.ConstantKernel(2.0) * skk.Matern(1.1, nu=2.5) + 0.5),
    ]
    for ours, theirs in pairs:
        np.testing.assert_allclose(
            (ours**exponent)(X1, X2), (theirs**exponent)(X1, X2), rtol=0, atol=1e-10
        )
        np.testing.assert_allclose(
            (ours**exponent).diag(X1), (theirs**exponent).diag(X1), rtol=0, atol=1e-10
        )


# ------------------------------------------------------------------------ gradients


def _grad_cases():
    e = kern.ExpSquared
    return [
        ("cosine", lambda p: kern.Cosine(p), np.array([1.3, 2.9])),
        (
            "spectral-mixture",
            lambda p: kern.SpectralMixture(p[0], p[1], p[2]),
            (SM_W, SM_MU, SM_SIGMA),
        ),
        (
            "changepoints",
            lambda p: kern.ChangePoints(
                (e(p[0]), kern.Matern52(0.5)), locations=p[1], widths=p[2], dim=1
            ),
            (0.6, 0.45, 0.2),
        ),
        ("power", lambda p: kern.RationalQuadratic(p[0], p[1]) ** 1.5, (0.9, 2.0)),
        ("input-scale", lambda p: kern.InputScale(kern.Matern52(), p), np.array([0.4, 1.2])),
        (
            "linear-map",
            lambda p: kern.LinearMap(e(), p),
            np.array([[0.8, -0.4], [0.3, 1.5]]),
        ),
        (
            "warp-params",
            lambda p: kern.Warp(e(0.5), fn=lambda x, q: jnp.tanh(q * x), params=p),
            np.array([1.5, 0.5]),
        ),
        ("kumaraswamy", lambda p: kern.KumaraswamyWarp(e(0.4), p[0], p[1]), (0.7, 2.5)),
    ]


@pytest.mark.slow_cases("changepoints")
@pytest.mark.parametrize(
    ("make", "params"), [pytest.param(m, p, id=n) for n, m, p in _grad_cases()]
)
def test_gradients_wrt_parameters_and_inputs(x64, rng, make, params):
    X1, X2 = rng.uniform(0.05, 0.95, (5, 2)), rng.uniform(0.05, 0.95, (4, 2))

    def block(p, X1):
        return make(p)(X1, X2)

    def diag(p, X1):
        return make(p).diag(X1)

    args = (jax.tree_util.tree_map(jnp.asarray, params), jnp.asarray(X1))
    # central differences with a step of 1e-5: JAX's default 1e-4 leaves a truncation
    # error (~ eps^2 times the third derivative) of 1e-6 relative for the spectral
    # mixture's fast cosines; rounding stays ~1e-11 at this step
    tol = dict(atol=1e-6, rtol=1e-6, eps=1e-5)
    check_grads(jax.jit(block), args, order=1, modes=["fwd", "rev"], **tol)
    check_grads(jax.jit(diag), args, order=1, modes=["rev"], **tol)


def test_gradients_finite_at_coincident_points_and_interval_ends(x64):
    X = jnp.array([[0.0, 0.5], [0.0, 0.5], [1.0, 1.0]])
    for k in (
        kern.SpectralMixture(SM_W, SM_MU, SM_SIGMA),
        kern.Cosine(0.7),
        kern.KumaraswamyWarp(kern.Matern32(), 0.5, 3.0),
    ):
        g = jax.jit(jax.grad(lambda k, X: jnp.sum(k(X)), argnums=(0, 1)))(k, X)
        assert all(np.all(np.isfinite(v)) for v in jax.tree_util.tree_leaves(g)), k


# ------------------------------------------------------------------------ structure


def test_default_transforms_and_round_trip():
    cp = kern.ChangePoints((kern.ExpSquared(), 2.0 * kern.Cosine()), 0.0, 0.3)
    t = cp.default_transforms()
    assert t.locations is None and t.widths == Positive() and t.dim == 0
    assert t.kernels[0].lengthscale == Positive() and t.kernels[1].amplitude == Positive()
    sm = kern.SpectralMixture(SM_W, SM_MU, SM_SIGMA).default_transforms()
    assert sm.weights == sm.scales == Positive()
    # a mean frequency of 0 (an ExpSquared component, as documented) can be learned
    assert sm.means is None
    zero = kern.SpectralMixture(np.ones(2), np.array([0.0, 0.5]), np.array([0.1, 0.2]))
    u = to_unconstrained(zero, zero.default_transforms())
    np.testing.assert_allclose(to_constrained(u, zero.default_transforms()).means, [0.0, 0.5])
    assert kern.LinearMap(kern.ExpSquared(), np.eye(2)).default_transforms().matrix is None
    assert kern.Warp(kern.ExpSquared(), jnp.tanh, params=1.0).default_transforms().params is None
    kw = kern.KumaraswamyWarp(kern.Matern12(), 0.5, 2.0)
    assert kw.default_transforms().a == Positive() and kw.default_transforms().kernel.lengthscale
    k = kern.InputScale(kern.ExpSquared() ** 2, np.array([0.5, 2.0]))
    u = to_unconstrained(k, k.default_transforms())
    back = to_constrained(u, k.default_transforms())
    assert type(back) is kern.InputScale and back.kernel.exponent == 2
    np.testing.assert_allclose(back.lengthscale, [0.5, 2.0], rtol=1e-6)


def test_static_settings_and_leaves():
    cp = kern.ChangePoints([kern.ExpSquared(), kern.White()], 0.0, dim=np.int64(1))
    assert isinstance(cp.kernels, tuple) and cp.dim == 1 and type(cp.dim) is int
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(cp)[0]]
    assert paths == [
        ".kernels[0].lengthscale",
        ".kernels[1].variance",
        ".locations",
        ".widths",
    ]
    assert (kern.ExpSquared() ** 2.0).exponent == 2 and type(
        (kern.ExpSquared() ** 2.0).exponent
    ) is int
    assert jax.tree_util.tree_leaves(kern.Subspace(kern.Cosine(), dims=[0, 2])) == [1.0]
    assert kern.Subspace(kern.Cosine(), dims=1).dims == (1,)


def test_jit_and_vmap():
    X = jnp.linspace(0.1, 0.9, 6)[:, None] * jnp.ones((1, 2))
    k = kern.InputScale(kern.SpectralMixture(SM_W, SM_MU, SM_SIGMA), jnp.array([1.0, 2.0]))
    np.testing.assert_allclose(jax.jit(lambda k: k(X))(k), k(X), rtol=1e-5, atol=1e-6)
    batch = kern.Cosine(jnp.array([0.5, 1.0, 2.0]))
    Ks = jax.vmap(lambda k: k(X))(batch)
    np.testing.assert_allclose(Ks[2], kern.Cosine(2.0)(X), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_input_transforms_compose_with_every_kernel(x64, rng):
    """``InputScale(k, l)`` on ``X`` is ``k`` on ``X / l``; ``Subspace`` equals the
    built-in ``active_dims``, for each built-in kernel."""
    X1, X2 = rng.uniform(0.1, 0.9, (6, 3)), rng.uniform(0.1, 0.9, (4, 3))
    l = np.array([0.5, 2.0, 1.5])
    makers = [
        kern.ExpSquared,
        kern.Matern12,
        kern.Matern32,
        kern.Matern52,
        kern.RationalQuadratic,
        kern.Periodic,
        kern.Linear,
        kern.Polynomial,
        kern.White,
    ]
    for make in makers:
        np.testing.assert_allclose(
            kern.InputScale(make(), l)(X1, X2), make()(X1 / l, X2 / l), rtol=1e-13
        )
        np.testing.assert_allclose(
            kern.Subspace(make(), dims=(2, 0))(X1, X2), make(active_dims=(2, 0))(X1, X2), rtol=0
        )
    for k in (kern.Cosine(0.8), kern.SpectralMixture(SM_W[:1], SM_MU[:1, :1], SM_SIGMA[:1, :1])):
        np.testing.assert_allclose(
            kern.Subspace(k, dims=1)(X1, X2), k(X1[:, 1:2], X2[:, 1:2]), rtol=1e-14
        )
    np.testing.assert_allclose(
        kern.Cosine(0.8, active_dims=(1,))(X1, X2), kern.Cosine(0.8)(X1[:, 1:2], X2[:, 1:2])
    )


# --------------------------------------------------------------------------- errors


def test_bad_arguments_are_named():
    X = np.ones((4, 2))
    sm = kern.SpectralMixture(np.ones(2), np.ones((3, 2)), np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"means must have shape \(2, 2\).*got shape \(3, 2\)"):
        sm(X)
    with pytest.raises(ValueError, match=r"weights must have shape \(Q,\)"):
        kern.SpectralMixture(np.ones((2, 1)), np.ones(2), np.ones(2))(X)
    cp = kern.ChangePoints([kern.ExpSquared()] * 3, locations=0.0)
    assert cp(X).shape == (4, 4)  # a scalar location is used for both change points
    with pytest.raises(ValueError, match=r"locations must be a scalar or have shape \(2,\)"):
        kern.ChangePoints([kern.ExpSquared()] * 3, locations=np.zeros(3))(X)
    with pytest.raises(ValueError, match="dim=2 names a column"):
        kern.ChangePoints([kern.ExpSquared()] * 2, 0.0, dim=2)(X)
    with pytest.raises(ValueError, match="at least two kernels"):
        kern.ChangePoints([kern.ExpSquared()], 0.0)
    with pytest.raises(TypeError, match="sequence of at least two kernels"):
        kern.ChangePoints(kern.ExpSquared(), 0.0)
    for bad, err in ((0, ValueError), (-1.5, ValueError), (np.nan, ValueError), ("2", TypeError)):
        with pytest.raises(err, match="exponent of a kernel power"):
            kern.ExpSquared() ** bad
    with pytest.raises(TypeError, match="pass a Python number"):
        kern.ExpSquared() ** jnp.asarray(2.0)
    with pytest.raises(ValueError, match=r"LinearMap: matrix must have shape \(p, 2\)"):
        kern.LinearMap(kern.ExpSquared(), np.ones((2, 3)))(X)
    with pytest.raises(ValueError, match="does not have"):
        kern.Subspace(kern.ExpSquared(), dims=5)(X)
    with pytest.raises(TypeError, match="Subspace: dims must name"):
        kern.Subspace(kern.ExpSquared())
    with pytest.raises(TypeError, match="Warp: fn must be callable"):
        kern.Warp(kern.ExpSquared(), fn=3.0)
    with pytest.raises(ValueError, match=r"Warp: fn must map one point .* returned shape"):
        kern.Warp(kern.ExpSquared(), fn=lambda x: jnp.outer(x, x))(X)
    with pytest.raises(ValueError, match=r"period must be a scalar or have shape \(2,\)"):
        kern.Cosine(np.ones(3))(X)


def test_scalar_parameters_refuse_vectors_and_combinators_refuse_functions():
    """A vector given for a one-number parameter broadcast against the block's columns
    (a wrong, even non-symmetric K); a function given for a kernel failed later with an
    AttributeError."""
    X = jnp.ones((2, 2))  # two columns: a (2,) vector broadcast silently
    for make, name in (
        (lambda v: kern.Linear(variance=v), "Linear variance"),
        (lambda v: kern.Polynomial(variance=v), "Polynomial variance"),
        (lambda v: kern.Polynomial(offset=v), "Polynomial offset"),
        (lambda v: kern.RationalQuadratic(alpha=v), "RationalQuadratic alpha"),
        (lambda v: kern.Constant(v), "Constant value"),
        (lambda v: kern.White(v), "White variance"),
        (lambda v: kern.Scale(v, kern.ExpSquared()), "Scale amplitude"),
    ):
        assert make(np.array([2.0]))(X).shape == (2, 2)  # one number of shape (1,) is fine
        with pytest.raises(ValueError, match=rf"{name} must be a scalar .*shape \(2,\)"):
            make(np.array([1.0, 2.0]))(X)
    with pytest.raises(ValueError, match=r"Constant mean value must be a scalar"):
        means.Constant(np.array([1.0, 2.0]))(X)
    with pytest.raises(ValueError, match=r"Linear mean bias must be a scalar"):
        means.Linear(bias=np.array([1.0, 2.0]))(X)

    def fn(a, b):
        return jnp.sum(a * b)

    for make, owner in (
        (lambda: kern.ChangePoints((kern.Constant(), fn)), "ChangePoints"),
        (lambda: kern.Sum(kern.Constant(), fn), "Sum"),
        (lambda: kern.Product(fn, kern.Constant()), "Product"),
        (lambda: kern.Scale(2.0, fn), "Scale"),
        (lambda: kern.Power(fn, 2), "Power"),
    ):
        with pytest.raises(TypeError, match=rf"{owner}: kernel must be a gpchol kernel"):
            make()
    cp = kern.ChangePoints(k for k in (kern.Constant(1.0), kern.Constant(4.0)))  # a generator
    np.testing.assert_allclose(cp.diag(jnp.array([-50.0, 50.0])), [1.0, 4.0], rtol=1e-6)


def test_power_gradient_where_the_base_kernel_underflows(x64):
    """``k^p`` for a non-integer p where k is exactly 0 (distant points): the gradient was
    inf * 0 = NaN; ExpSquared(l)^(1/2) is ExpSquared(l sqrt 2), whose gradient is 0."""
    X = jnp.linspace(0.0, 10.0, 6)
    # l = 0.25: neighbours (2 apart) give exp(-32), the pairs 10 apart underflow to 0
    # eager: XLA's simplifications hid the NaN under jit; the references are jitted (one
    # compiled program each: eager derivatives compile one per operation)
    g = jax.grad(lambda k: jnp.sum(k(X)))(kern.ExpSquared(0.25) ** 0.5)
    want = jax.jit(jax.grad(lambda l: jnp.sum(kern.ExpSquared(l * np.sqrt(2.0))(X))))(0.25)
    assert np.isfinite(g.kernel.lengthscale)
    np.testing.assert_allclose(g.kernel.lengthscale, want, rtol=1e-12, atol=1e-300)
    check_grads(jax.jit(lambda l: jnp.sum((kern.ExpSquared(l) ** 0.5)(X))), (1.5,), order=2)


@pytest.mark.parametrize("a", [0.1, 0.3, 2.0])
def test_kumaraswamy_warp_at_the_ends_of_the_interval(a):
    """Inputs at 0 and 1 (min-max scaled data has both): w(0) = 0 and w(1) = 1 exactly,
    finite gradients in a and b (NaN at 1 for a <= 0.3: 1 - u^a rounded to 0), and float32
    agreeing with float64 (w(0) was 0.365 in float32 for a = 0.1, b = 2)."""
    X = np.linspace(0.0, 1.0, 5)[:, None]
    grads = {}
    for dtype in (np.float32, np.float64):
        with jax.enable_x64(dtype == np.float64):
            k = kern.KumaraswamyWarp(kern.ExpSquared(0.5), a=dtype(a), b=dtype(2.0))
            Xd = jnp.asarray(X, dtype)
            w = np.asarray(jax.jit(lambda k, x: k._map(x))(k, Xd)).ravel()
            assert w[0] == 0.0 and w[-1] == 1.0, w
            want = 1.0 - (1.0 - X.ravel()[1:-1] ** a) ** 2.0
            np.testing.assert_allclose(w[1:-1], want, rtol=1e-6 if dtype == np.float32 else 1e-14)
            g = jax.jit(jax.grad(lambda k, x: jnp.sum(k(x))))(k, Xd)
            grads[dtype] = np.array([g.a, g.b], np.float64)
            assert np.all(np.isfinite(grads[dtype])), (dtype, grads[dtype])
    np.testing.assert_allclose(grads[np.float32], grads[np.float64], rtol=1e-4)
