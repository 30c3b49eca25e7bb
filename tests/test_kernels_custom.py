"""User-written kernels: the Kernel base's evaluate/matrix protocol, pytree registration,
hyperparameter transforms, wrapped functions, errors, and an end-to-end fit (likelihood,
gradient, posterior, gpchol.fit, NumPyro) against float64 NumPy references."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import gpchol
from gpchol import GaussianProcess, Identity, Positive, to_constrained, to_unconstrained
from gpchol import kernels as kern


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


# ------------------------------------------------------------------ the user kernels


class ARDLaplace(kern.Kernel):
    """A user kernel: variance * exp(-sum_k |x_k - x'_k| / l_k), an ARD lengthscale."""

    variance: float = 1.0
    lengthscale: jax.Array = kern.parameter(default=np.array([1.0]))

    def evaluate(self, x1, x2):
        return self.variance * jnp.exp(-jnp.sum(jnp.abs(x1 - x2) / self.lengthscale))


class UserRBF(kern.Kernel):
    """exp(-|x - x'|^2 / (2 l^2)) written by hand (equals kern.ExpSquared(l))."""

    lengthscale: float = 1.0

    def evaluate(self, x1, x2):
        return jnp.exp(-0.5 * jnp.sum(jnp.square((x1 - x2) / self.lengthscale)))


class ShiftedDot(kern.Kernel):
    """A matrix-only user kernel with a real (identity-transform) offset and a static
    power: ((X1 - c)(X2 - c)^T)^p, scaled."""

    scale: float = 1.0
    offset: float = kern.parameter(default=0.0, transform=None)
    power: int = kern.static(default=1)

    def matrix(self, X1, X2):
        return self.scale * ((X1 - self.offset) @ (X2 - self.offset).T) ** self.power


class WithChild(kern.Kernel):
    """A user kernel holding another kernel as a field."""

    inner: kern.Kernel
    amplitude: float = 2.0

    def evaluate(self, x1, x2):
        return self.amplitude * self.inner.evaluate(x1, x2)


def ref_laplace(X1, X2, variance, ls):
    return variance * np.exp(-np.sum(np.abs(X1[:, None] - X2[None]) / ls, axis=-1))


def ref_rbf(X1, X2, ls):
    return np.exp(-0.5 * np.sum((X1[:, None] - X2[None]) ** 2, axis=-1) / ls**2)


def _data(rng, n=12, d=2):
    X = rng.uniform(-2, 2, size=(n, d))
    Xs = rng.uniform(-2, 2, size=(5, d))
    return X, Xs


# ------------------------------------------------------------------------- protocol


@pytest.mark.slow
def test_values_match_numpy_in_float64(x64, rng):
    X, Xs = _data(rng)
    ls = np.array([0.7, 1.9])
    k = ARDLaplace(1.3, jnp.asarray(ls))
    np.testing.assert_allclose(k(X, Xs), ref_laplace(X, Xs, 1.3, ls), rtol=1e-13, atol=0)
    np.testing.assert_allclose(k.diag(X), np.full(len(X), 1.3), rtol=1e-15)
    np.testing.assert_allclose(
        float(k.evaluate(jnp.asarray(X[0]), jnp.asarray(Xs[1]))),
        ref_laplace(X[:1], Xs[1:2], 1.3, ls)[0, 0],
        rtol=1e-14,
    )
    sd = ShiftedDot(0.5, 0.3, 2)
    ref = 0.5 * ((X - 0.3) @ (Xs - 0.3).T) ** 2
    np.testing.assert_allclose(sd(X, Xs), ref, rtol=1e-13)
    np.testing.assert_allclose(sd.diag(X), np.diag(0.5 * ((X - 0.3) @ (X - 0.3).T) ** 2))
    np.testing.assert_allclose(float(sd.evaluate(X[0], Xs[0])), ref[0, 0], rtol=1e-13)
    wc = WithChild(UserRBF(0.8))
    np.testing.assert_allclose(wc(X, Xs), 2.0 * ref_rbf(X, Xs, 0.8), rtol=1e-13)


@pytest.mark.slow
def test_user_kernel_equals_built_in_and_composes(x64, rng):
    X, Xs = _data(rng)
    mine, builtin = UserRBF(0.6), kern.ExpSquared(0.6)
    np.testing.assert_allclose(mine(X, Xs), builtin(X, Xs), rtol=1e-14)
    pairs = [
        (2.0 * mine + kern.White(0.1), 2.0 * builtin + kern.White(0.1)),
        (mine * kern.Periodic(1.0, 2.0), builtin * kern.Periodic(1.0, 2.0)),
        (mine**3, builtin**3),
        (kern.Subspace(mine, dims=1), kern.ExpSquared(0.6, active_dims=1)),
        (kern.InputScale(UserRBF(1.0), 0.6), builtin),
    ]
    for a, b in pairs:
        np.testing.assert_allclose(a(X, Xs), b(X, Xs), rtol=1e-13, err_msg=repr(a))
        np.testing.assert_allclose(a.diag(X), b.diag(X), rtol=1e-13, err_msg=repr(a))
    # float32 inputs give float32 blocks even with float64 parameters
    k32 = UserRBF(jnp.float64(0.6))(X.astype(np.float32))
    assert k32.dtype == jnp.float32


def test_subclass_is_a_frozen_pytree_dataclass():
    k = ARDLaplace(2.0, jnp.array([0.5, 1.5]))
    assert dataclasses.is_dataclass(k)
    with pytest.raises(dataclasses.FrozenInstanceError):
        k.variance = 3.0
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(k)[0]]
    assert paths == [".variance", ".lengthscale"]
    sd = ShiftedDot(1.0, 0.0, 3)
    assert jax.tree_util.tree_leaves(sd) == [1.0, 0.0]  # power is static
    assert jax.tree_util.tree_structure(sd) != jax.tree_util.tree_structure(ShiftedDot(1.0, 0.0, 2))
    doubled = jax.tree_util.tree_map(lambda v: 2 * v, k)
    assert type(doubled) is ARDLaplace and doubled.variance == 4.0
    # an array default is copied for each instance
    a, b = ARDLaplace(), ARDLaplace()
    assert a.lengthscale is not b.lengthscale
    g = jax.grad(lambda k: jnp.sum(k(jnp.ones((3, 2)), jnp.zeros((2, 2)))))(k)
    assert type(g) is ARDLaplace and g.lengthscale.shape == (2,)


def test_default_transforms_of_user_fields():
    t = ShiftedDot().default_transforms()
    assert t.scale == Positive() and t.offset is None and t.power == 1
    t = WithChild(ARDLaplace()).default_transforms()
    assert t.amplitude == Positive()
    assert t.inner.variance == Positive() and t.inner.lengthscale == Positive()

    class Bounded(kern.Kernel):
        shift: float = kern.parameter(default=0.5, transform=Identity())

        def evaluate(self, x1, x2):
            return jnp.sum((x1 - self.shift) * (x2 - self.shift))

    assert Bounded().default_transforms().shift == Identity()
    k = WithChild(ARDLaplace(0.5, np.array([2.0, 3.0])), 1.5)
    back = to_constrained(to_unconstrained(k, k.default_transforms()), k.default_transforms())
    for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(k), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)

    # a subclass of a built-in keeps the built-in's rules for inherited fields
    class MyLinear(kern.Linear):
        extra: float = 2.0

        def evaluate(self, x1, x2):
            return self.extra * jnp.sum((x1 - self.offset) * (x2 - self.offset))

    t = MyLinear().default_transforms()
    assert t.offset is None and t.variance == Positive() and t.extra == Positive()


def test_jit_vmap_and_no_retrace(x64, rng):
    X, Xs = _data(rng)
    traces = []

    @jax.jit
    def f(k):
        traces.append(1)
        return k(X, Xs)

    f(ARDLaplace(jnp.asarray(1.0), jnp.asarray([1.0, 2.0])))
    out = f(ARDLaplace(jnp.asarray(0.5), jnp.asarray([1.0, 2.0])))
    assert len(traces) == 1
    np.testing.assert_allclose(out, ref_laplace(X, Xs, 0.5, np.array([1.0, 2.0])), rtol=1e-13)
    batch = ARDLaplace(jnp.array([1.0, 2.0]), jnp.ones((2, 2)))
    Ks = jax.vmap(lambda k: k(X, Xs))(batch)
    np.testing.assert_allclose(Ks[1], ref_laplace(X, Xs, 2.0, np.ones(2)), rtol=1e-13)


def test_parameter_and_input_gradients(x64, rng):
    X, Xs = _data(rng, n=5)

    def block(variance, ls, X):
        return ARDLaplace(variance, ls)(X, Xs)

    args = (1.3, jnp.array([0.7, 1.9]), jnp.asarray(X))
    check_grads(jax.jit(block), args, order=1, modes=["fwd", "rev"])
    check_grads(jax.jit(lambda s, c: ShiftedDot(s, c, 2)(X, Xs)), (0.7, 0.2), order=1)


def test_as_kernel_wraps_functions(x64, rng):
    X, Xs = _data(rng)
    k = kern.as_kernel(lambda a, b, ls: jnp.exp(-0.5 * jnp.sum((a - b) ** 2) / ls**2), ls=0.8)
    assert isinstance(k, kern.FunctionKernel)
    np.testing.assert_allclose(k(X, Xs), ref_rbf(X, Xs, 0.8), rtol=1e-14)
    np.testing.assert_allclose(k.diag(X), np.ones(len(X)))
    assert jax.tree_util.tree_leaves(k) == [0.8]
    assert k.default_transforms().params == Positive()
    g = jax.grad(lambda k: jnp.sum(k(X, Xs)))(k)
    assert isinstance(g, kern.FunctionKernel) and np.isfinite(g.params["ls"])
    plain = kern.as_kernel(lambda a, b: jnp.dot(a, b))
    np.testing.assert_allclose(plain(X, Xs), X @ Xs.T, rtol=1e-14)
    assert jax.tree_util.tree_leaves(plain) == []
    same = kern.ExpSquared()
    assert kern.as_kernel(same) is same


# --------------------------------------------------------------------------- errors


class ReturnsVector(kern.Kernel):
    def evaluate(self, x1, x2):
        return jnp.exp(-((x1 - x2) ** 2))  # forgot the sum: shape (d,)


class WrongMatrix(kern.Kernel):
    def matrix(self, X1, X2):
        return X1 @ X1.T


class SqrtAtZero(kern.Kernel):
    lengthscale: float = 1.0

    def evaluate(self, x1, x2):
        return jnp.log(jnp.sum(jnp.abs(x1 - x2))) / self.lengthscale


def test_wrong_shape_is_a_clear_error_eager_and_under_jit():
    X = jnp.linspace(0.0, 1.0, 4)
    message = r"ReturnsVector\.evaluate\(x1, x2\) must return a scalar.*returned shape \(1,\)"
    for call in (lambda: ReturnsVector()(X), lambda: jax.jit(ReturnsVector())(X)):
        with pytest.raises(ValueError, match=message):
            call()
    with pytest.raises(ValueError, match=r"must return a scalar"):
        ReturnsVector().diag(X)
    with pytest.raises(ValueError, match=r"WrongMatrix\.matrix\(X1, X2\) must return the block"):
        WrongMatrix()(X, X[:2])
    with pytest.raises(ValueError, match="must return a scalar"):
        _lml(GaussianProcess(lambda a, b: a - b, X, noise=0.1), X)


def test_non_finite_values_are_reported_eagerly(x64):
    X = jnp.array([0.0, 1.0, 3.0])
    message = (
        r"kernel SqrtAtZero returned a non-finite value \(-inf\) at k\(X1\[0\], X2\[0\]\), "
        r"x1 = \[0\.\], x2 = \[0\.\]; kernel SqrtAtZero\(lengthscale=1\.0\)\. .*"
        r"make SqrtAtZero\.evaluate finite there"
    )
    with pytest.raises(ValueError, match=message):
        SqrtAtZero()(X)
    with pytest.raises(ValueError, match=r"diagonal entry k\(X\[0\], X\[0\]\)"):
        SqrtAtZero().diag(X)
    with pytest.raises(ValueError, match="SqrtAtZero returned a non-finite"):
        (kern.ExpSquared() + SqrtAtZero())(X)
    # under jit the values pass through (no host check inside compiled code)
    assert np.isnan(np.asarray(jax.jit(lambda k: k(X))(SqrtAtZero()))).sum() == 0
    assert np.isinf(np.asarray(jax.jit(lambda k: k(X))(SqrtAtZero()))).any()


def test_other_mistakes_are_named():
    class Nothing(kern.Kernel):
        pass

    with pytest.raises(NotImplementedError, match=r"Nothing must implement evaluate\(self"):
        Nothing()(jnp.ones(2))
    with pytest.raises(TypeError, match=r"kernel must be a gpchol kernel .* or a function"):
        GaussianProcess("rbf", jnp.ones(2), noise=0.1)
    with pytest.raises(TypeError, match=r"hyperparameters \['ls'\] can only be given"):
        kern.as_kernel(kern.ExpSquared(), ls=1.0)
    with pytest.raises(TypeError, match=r"kernel class Bad: .*kernels\.parameter"):

        class Bad(kern.Kernel):
            ls: np.ndarray = np.ones(2)

    with pytest.raises(TypeError, match="transform must be a gpchol Transform"):
        kern.parameter(default=1.0, transform="positive")
    with pytest.raises(TypeError, match=r"use gpchol\.kernels\.as_kernel for a function"):
        kern.InputScale(lambda a, b: 1.0)


# ----------------------------------------------------------------- end to end (GP fit)


def _gp_reference(K, Ks, kss_diag, y, noise):
    C = K + noise * np.eye(len(y))
    L = np.linalg.cholesky(C)
    alpha = np.linalg.solve(C, y)
    lml = -0.5 * y @ alpha - np.sum(np.log(np.diag(L))) - 0.5 * len(y) * np.log(2 * np.pi)
    mean = Ks.T @ alpha
    var = kss_diag - np.sum(Ks * np.linalg.solve(C, Ks), axis=0)
    return lml, mean, var


@jax.jit
def _lml(gp, y):
    # jitted: op-by-op (eager) likelihoods are slow on a loaded CI machine
    return gp.log_marginal_likelihood(y)


def test_gaussian_process_with_a_user_kernel_end_to_end(x64, rng):
    X, Xs = _data(rng, n=20)
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(20)
    ls = np.array([0.9, 1.6])
    k = ARDLaplace(1.2, jnp.asarray(ls))
    gp = GaussianProcess(k, X, noise=0.05)
    lml, mean, var = _gp_reference(
        ref_laplace(X, X, 1.2, ls), ref_laplace(X, Xs, 1.2, ls), np.full(5, 1.2), y, 0.05
    )
    np.testing.assert_allclose(float(_lml(gp, y)), lml, rtol=1e-12)
    post = gp.condition(y)
    np.testing.assert_allclose(post.mean(Xs), mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(post.variance(Xs), var, rtol=1e-9, atol=1e-12)

    def lml_of(variance, ls, noise):
        return GaussianProcess(ARDLaplace(variance, ls), X, noise=noise).log_marginal_likelihood(y)

    check_grads(jax.jit(lml_of), (1.2, jnp.asarray(ls), 0.05), order=1, modes=["rev"])

    # a plain function is wrapped where a kernel is expected
    fgp = GaussianProcess(
        lambda a, b: 1.2 * jnp.exp(-jnp.sum(jnp.abs(a - b) / jnp.asarray(ls))), X, noise=0.05
    )
    assert isinstance(fgp.kernel, kern.FunctionKernel)
    np.testing.assert_allclose(float(_lml(fgp, y)), lml, rtol=1e-12)


@pytest.mark.slow
def test_fit_a_user_kernel_reaches_the_built_in_optimum(x64, rng):
    X = np.sort(rng.uniform(0, 5, 25))
    y = np.sin(X) + 0.1 * rng.standard_normal(25)

    def build(p):
        return GaussianProcess(p["k"], X, noise=p["noise"])

    # the user kernel itself in the parameter pytree, with its default transforms
    p0 = {"k": 1.0 * UserRBF(1.0), "noise": 0.1}
    t = {"k": p0["k"].default_transforms(), "noise": Positive()}
    res = gpchol.fit(build, p0, y, transforms=t, steps=40, progress=False)
    k = res.params["k"]
    assert isinstance(k, kern.Scale) and isinstance(k.kernel, UserRBF)
    assert res.log_marginal_likelihood > float(_lml(build(p0), y)) + 1.0
    # the same model with the built-in kernel: same likelihood, and stationary there
    amp, ls, noise = k.amplitude, k.kernel.lengthscale, res.params["noise"]

    def builtin_lml(u):
        a, l, s = jax.nn.softplus(u)
        return GaussianProcess(a * kern.ExpSquared(l), X, noise=s).log_marginal_likelihood(y)

    u = Positive().inverse(jnp.stack([amp, ls, noise]))
    np.testing.assert_allclose(float(builtin_lml(u)), res.log_marginal_likelihood, rtol=1e-12)
    assert float(jnp.max(jnp.abs(jax.jit(jax.grad(builtin_lml))(u)))) < 1e-3


@pytest.mark.slow
def test_numpyro_marginal_with_a_user_kernel(x64, rng):
    pytest.importorskip("numpyro")
    import gpchol.numpyro as gnp

    X, _ = _data(rng, n=15)
    y = rng.standard_normal(15)
    ls = np.array([0.8, 1.1])
    k = ARDLaplace(0.9, jnp.asarray(ls))
    lml, _, _ = _gp_reference(ref_laplace(X, X, 0.9, ls), np.zeros((15, 0)), np.zeros(0), y, 0.1)
    d = gnp.GaussianProcessMarginal(k, X, noise=0.1, jitter=None)
    np.testing.assert_allclose(float(d.log_prob(y)), lml, rtol=1e-12)
    g = jax.jit(jax.grad(lambda k: gnp.GaussianProcessMarginal(k, X, noise=0.1).log_prob(y)))(k)
    assert type(g) is ARDLaplace and np.all(np.isfinite(g.lengthscale))
