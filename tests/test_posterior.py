"""Posterior: the lean conditioning, blocked predictions under jit, one additive component,
observation noise at the test points, and bad input.

References are float64 NumPy (R&W 2006, Alg. 2.1 on the dense matrices); the posterior of
one component ``f_j`` of ``f = sum_j f_j`` given ``y`` is ``k_j(Xs, X) K^-1 r`` and
``k_j(Xs, Xs) - k_j(Xs, X) K^-1 k_j(X, Xs)`` (R&W 2006, Sec. 5.4.3).
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from gpchol import GaussianProcess, NotPositiveDefiniteError, Posterior, additive_terms, kernels
from gpchol._internal import posterior_module

default_block_size = posterior_module.default_block_size

# ------------------------------------------------------------------ NumPy references


def np_se(A, B, amp, ls):
    d = (A[:, None, :] - B[None, :, :]) / ls
    return amp * np.exp(-0.5 * np.sum(d**2, -1))


def np_per(A, B, amp, ls, period):
    s = np.sum(np.sin(np.pi * (A[:, None, :] - B[None, :, :]) / period) ** 2, -1)
    return amp * np.exp(-2.0 * s / ls**2)


P = dict(a1=1.3, ls1=0.8, a2=0.5, ls2=1.1, period=1.7, mean=0.3)


def np_parts(A, B):
    return [np_se(A, B, P["a1"], P["ls1"]), np_per(A, B, P["a2"], P["ls2"], P["period"])]


def model_kernel():
    return P["a1"] * kernels.ExpSquared(P["ls1"]) + P["a2"] * kernels.Periodic(
        lengthscale=P["ls2"], period=P["period"]
    )


def np_posterior(X, y, noise, Xs, part=None):
    """Dense R&W Alg. 2.1: ``(mean, cov)`` of ``f`` (or of the component ``part``)."""
    K = sum(np_parts(X, X)) + np.diag(np.broadcast_to(noise, (X.shape[0],)))
    L = np.linalg.cholesky(K)
    alpha = np.linalg.solve(L.T, np.linalg.solve(L, y - P["mean"]))
    if part is None:
        Ks, Kss, m0 = sum(np_parts(X, Xs)), sum(np_parts(Xs, Xs)), P["mean"]
    else:
        Ks, Kss, m0 = np_parts(X, Xs)[part], np_parts(Xs, Xs)[part], 0.0
    V = np.linalg.solve(L, Ks)
    return m0 + Ks.T @ alpha, Kss - V.T @ V


@pytest.fixture
def problem(rng):
    n, m = 30, 23
    X = rng.uniform(-2, 2, (n, 2))
    y = np.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.standard_normal(n)
    Xs = rng.uniform(-2.5, 2.5, (m, 2))
    return X, y, Xs


def gp_of(X, noise=0.1, **kw):
    return GaussianProcess(model_kernel(), X, noise=noise, mean=P["mean"], **kw)


# ---------------------------------------------------------------------- references


@pytest.mark.parametrize("block_size", [None, 1, 5, 23, 100])
@pytest.mark.parametrize("part", [None, 0, 1], ids=["whole", "trend", "periodic"])
def test_predictions_match_dense_reference(problem, block_size, part):
    X, y, Xs = problem
    post = gp_of(X).condition(y)
    kern = None if part is None else additive_terms(post.gp.kernel)[part]
    mean, cov = np_posterior(X, y, 0.1, Xs, part)
    kw = dict(kernel=kern, block_size=block_size)
    np.testing.assert_allclose(post.mean(Xs, **kw), mean, rtol=1e-10, atol=1e-11)
    np.testing.assert_allclose(post.variance(Xs, **kw), np.diag(cov), rtol=1e-8, atol=1e-11)
    mu, var = post.mean_and_variance(Xs, **kw)
    np.testing.assert_allclose(mu, mean, rtol=1e-10, atol=1e-11)
    np.testing.assert_allclose(var, np.diag(cov), rtol=1e-8, atol=1e-11)
    np.testing.assert_allclose(post.covariance(Xs, **kw), cov, rtol=1e-8, atol=1e-11)


def test_components_add_up_to_the_whole(problem):
    X, y, Xs = problem
    post = gp_of(X).condition(y)
    parts = additive_terms(post.gp.kernel)
    total = sum(post.mean(Xs, kernel=k) for k in parts) + P["mean"]
    np.testing.assert_allclose(total, post.mean(Xs), rtol=1e-12, atol=1e-12)
    # a kernel built separately with the same parameters is recognised as that term
    same = P["a1"] * kernels.ExpSquared(P["ls1"])
    np.testing.assert_array_equal(post.mean(Xs, kernel=same), post.mean(Xs, kernel=parts[0]))
    # the whole kernel is the whole model (prior mean included)
    np.testing.assert_array_equal(post.mean(Xs, kernel=post.gp.kernel), post.mean(Xs))


def test_lean_condition_matches_dense_factor(problem):
    X, y, _ = problem
    gp = gp_of(X)
    post = gp.condition(y)
    K = np.asarray(gp.covariance_matrix())
    np.testing.assert_allclose(post.L, np.linalg.cholesky(K), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(post.alpha, np.linalg.solve(K, y - P["mean"]), rtol=1e-9)
    np.testing.assert_allclose(post.log_marginal_likelihood, gp.log_marginal_likelihood(y))
    assert int(post.status) == 0 and float(post.jitter_used) == 0.0


@pytest.mark.slow
def test_host_lapack_size(rng):
    """n >= 128 takes the in-place host factorization on the CPU; same numbers."""
    n = 140
    X = rng.uniform(-3, 3, (n, 1))
    y = np.cos(X[:, 0])
    gp = GaussianProcess(kernels.Matern32(0.7), X, noise=0.05)
    post = gp.condition(y)
    K = np.asarray(gp.covariance_matrix())
    L = np.linalg.cholesky(K)
    np.testing.assert_allclose(post.L, L, rtol=1e-11, atol=1e-12)
    Xs = rng.uniform(-3, 3, (9, 1))
    Ks = np.asarray(kernels.Matern32(0.7)(X, Xs))
    V = np.linalg.solve(L, Ks)
    np.testing.assert_allclose(post.variance(Xs, block_size=4), 1.0 - np.sum(V * V, 0), atol=1e-11)


# ------------------------------------------------------------------ noise at test points


def test_observation_noise_at_test_points(problem, rng):
    X, y, Xs = problem
    post = gp_of(X).condition(y)
    var = np.asarray(post.variance(Xs))
    np.testing.assert_allclose(post.variance(Xs, include_noise=True), var + 0.1, rtol=1e-12)
    tn = rng.uniform(0.0, 0.5, Xs.shape[0])
    np.testing.assert_allclose(post.variance(Xs, noise=tn, block_size=4), var + tn, rtol=1e-12)
    np.testing.assert_allclose(post.variance(Xs, noise=0.2), var + 0.2, rtol=1e-12)
    C = np.asarray(post.covariance(Xs))
    np.testing.assert_allclose(post.covariance(Xs, noise=tn), C + np.diag(tn), rtol=1e-12)
    # heteroscedastic training noise: the test points' noise must be given
    hp = gp_of(X, noise=rng.uniform(0.05, 0.2, X.shape[0])).condition(y)
    with pytest.raises(ValueError, match="noise="):
        hp.variance(Xs, include_noise=True)
    np.testing.assert_allclose(
        hp.variance(include_noise=True), hp.variance() + hp.gp.noise, rtol=1e-12
    )


@pytest.mark.parametrize("include_noise", [False, True], ids=["f", "y"])
def test_samples_of_f_and_y(problem, include_noise):
    X, y, Xs = problem
    Xs = Xs[:4]
    post = gp_of(X).condition(y)
    tn = np.array([0.0, 0.1, 0.4, 0.02])
    kw = dict(noise=tn) if include_noise else {}
    s = post.sample(jax.random.PRNGKey(3), Xs, 20000, block_size=3, **kw)
    assert s.shape == (20000, 4)
    C = np.asarray(post.covariance(Xs, **kw))
    sd = np.sqrt(np.diag(C))
    np.testing.assert_allclose(s.mean(0), post.mean(Xs), atol=5 * sd.max() / np.sqrt(20000))
    np.testing.assert_allclose(np.cov(np.asarray(s).T), C, atol=0.05 * C.max())


def near_singular_posterior():
    """Posterior at 200 close points: in float32 its covariance's smallest eigenvalues are
    about -1e-3 of the largest (rounding); 100 training points."""
    X = jnp.linspace(0.0, 1.0, 100)
    return GaussianProcess(kernels.ExpSquared(0.5), X, noise=1e-2).condition(jnp.sin(X))


def test_float32_samples_of_a_covariance_singular_to_rounding():
    # The default jitters were (1e-10, 1e-8, 1e-6), under float32's rounding: every sample
    # was NaN, without a word. Now 1e-6, 1e-5, 1e-4, then the eigendecomposition.
    Xs = jnp.linspace(0.0, 1.0, 200)
    key = jax.random.PRNGKey(0)
    C64 = np.asarray(near_singular_posterior().covariance(Xs))  # float64 (the session's)
    with jax.enable_x64(False):
        post = near_singular_posterior()
        s = post.sample(key, Xs, 20000)
        assert s.dtype == jnp.float32 and np.all(np.isfinite(s))
        np.testing.assert_allclose(np.cov(np.asarray(s, np.float64).T), C64, atol=0.05 * C64.max())
        with pytest.warns(RuntimeWarning, match=r"even with a jitter of 0\.0001 ") as w:
            s = post.sample(key, Xs, 2, jitter=(1e-6, 1e-5, 1e-4))  # the ladder alone fails
        assert np.all(np.isnan(s)) and w[0].filename == __file__  # names the caller's line
        with pytest.warns(RuntimeWarning, match="without jitter"):
            post.sample(key, Xs, 2, jitter=None)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # traced: no warning, NaN
            traced = jax.jit(lambda p: p.sample(key, Xs, 2, jitter=None))(post)
        assert np.all(np.isnan(traced))


def test_eigendecomposition_clips_rounding_only():
    # The last resort of jitter="auto" sets negative eigenvalues to 0: rounding's. An
    # indefinite covariance (a kernel that is not positive definite) was sampled silently.
    core = posterior_module.core
    rel, eigen = core.relative_jitters("auto", jnp.float64)
    assert rel == (1e-10, 1e-8, 1e-6) and eigen
    C = jnp.array([[1.0, 2.0], [2.0, 1.0]])  # eigenvalues 3 and -1
    L, status = core.relative_factor(C, rel, eigen)
    assert np.all(np.isnan(L)) and int(status) != 0
    with pytest.warns(RuntimeWarning, match="nor by its eigendecomposition"):
        core.warn_if_failed(status, rel, eigen, "sample", stacklevel=1)
    # what rounding leaves is clipped (test_float32_samples_of_a_covariance_singular_to_rounding:
    # eigenvalues down to -1e-3 of the largest at m = 200 in float32)


def test_float64_default_sample_jitters_are_unchanged(problem):
    X, y, Xs = problem
    post = gp_of(X).condition(y)
    key = jax.random.PRNGKey(1)
    np.testing.assert_allclose(
        post.sample(key, Xs, 3), post.sample(key, Xs, 3, jitter=(1e-10, 1e-8, 1e-6)), rtol=1e-12
    )


# ------------------------------------------------------------------ transformations


def test_jit_once_per_shape(problem):
    program = posterior_module.core.predict_program  # the posterior core's jitted program

    X, y, Xs = problem
    post = gp_of(X).condition(y)
    post.mean_and_variance(Xs, block_size=7)
    before = program._cache_size()
    post2 = gp_of(X).condition(y + 1.0)  # new values, same shapes: no new trace
    post2.mean_and_variance(Xs + 0.5, block_size=7)
    assert program._cache_size() == before


def test_vmap_and_jit_of_predictions(problem):
    X, y, Xs = problem
    noises = jnp.array([0.05, 0.1, 0.3])

    def pred(nz):
        return gp_of(X, nz).condition(y).mean_and_variance(Xs, block_size=6)

    mu, var = jax.jit(jax.vmap(pred))(noises)
    for i, nz in enumerate(np.asarray(noises)):
        mean, cov = np_posterior(X, y, nz, Xs)
        np.testing.assert_allclose(mu[i], mean, rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(var[i], np.diag(cov), rtol=1e-8, atol=1e-11)


@pytest.mark.slow_cases("device")
@pytest.mark.parametrize("n", [12, 130], ids=["device", "host-lapack"])
def test_grad_of_predictions(rng, n):
    X = rng.uniform(-2, 2, (n, 1))
    y = np.sin(2 * X[:, 0])
    Xs = rng.uniform(-2, 2, (5, 1))

    def f(ls, amp, nz, yy):
        k = amp * kernels.ExpSquared(ls) + kernels.Linear(variance=0.3)
        post = GaussianProcess(k, X, noise=nz).condition(yy)
        mu, var = post.mean_and_variance(Xs, block_size=2)
        part = post.mean(Xs, kernel=post.gp.kernel.kernel1)
        return (
            jnp.sum(mu * jnp.arange(1.0, 6.0))
            + jnp.sum(var)
            + jnp.sum(part**2)
            + (post.log_marginal_likelihood)
        )

    # jitted: one compilation per transformation instead of op-by-op dispatch
    modes = ("fwd", "rev") if n < 128 else ("rev",)
    check_grads(jax.jit(f), (0.7, 1.2, 0.1, jnp.asarray(y)), order=1, modes=modes, eps=1e-5)


# ---------------------------------------------------------------- failure and input


def test_failed_factorization_gives_nan_and_status():
    X = jnp.zeros((4, 1))  # identical inputs, zero noise
    gp = GaussianProcess(kernels.ExpSquared(1.0), X, noise=0.0)
    post = gp.condition(jnp.ones(4))
    assert int(post.status) == 2
    assert np.all(np.isnan(np.asarray(post.mean(jnp.zeros((3, 1))))))
    assert np.all(np.isnan(np.asarray(post.variance(jnp.zeros((3, 1))))))
    with pytest.raises(NotPositiveDefiniteError):
        gp.condition(jnp.ones(4), check=True)
    ok = GaussianProcess(kernels.ExpSquared(1.0), X, noise=0.0, jitter=(0.0, 1e-6))
    post = ok.condition(jnp.ones(4), check=True)
    assert int(post.status) == 0 and float(post.jitter_used) == 1e-6


def test_bad_input(problem):
    X, y, Xs = problem
    post = gp_of(X).condition(y)
    with pytest.raises(ValueError, match=r"Xs .*3 column"):
        post.mean(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"Xs .*NaN.*\[1\]"):
        post.variance(np.array([[0.0, 0.0], [np.nan, 1.0]]))
    for bad in (0, -3):
        with pytest.raises(ValueError, match="block_size"):
            post.mean(Xs, block_size=bad)
    for bad in (2.5, True, "8"):
        with pytest.raises(TypeError, match="block_size"):
            post.variance(Xs, block_size=bad)
    with pytest.raises(ValueError, match="block_size"):
        gp_of(X).condition(y, block_size=0)
    with pytest.raises(ValueError, match="kernel="):
        post.mean(Xs, kernel=kernels.ExpSquared(0.8))  # not a term (no amplitude)
    with pytest.raises(ValueError, match="kernel="):
        post.variance(Xs, kernel=P["a1"] * kernels.ExpSquared(0.81))  # other parameters
    with pytest.raises(ValueError, match=r"noise .*shape \(23,\)"):
        post.variance(Xs, noise=np.ones(5))
    with pytest.raises(ValueError, match="noise"):
        post.sample(jax.random.PRNGKey(0), Xs, 2, noise=-np.ones(23))


def test_large_m_runs_in_blocks(rng):
    """Many test points in small blocks: the padded last block is dropped exactly."""
    X = rng.uniform(0, 1, (20, 1))
    post = GaussianProcess(kernels.ExpSquared(0.3), X, noise=0.01).condition(X[:, 0])
    Xs = rng.uniform(0, 1, (10_007, 1))
    mu, var = post.mean_and_variance(Xs, block_size=1000)
    mu1, var1 = post.mean_and_variance(Xs[-7:])
    np.testing.assert_allclose(mu[-7:], mu1, rtol=1e-12)
    np.testing.assert_allclose(var[-7:], var1, rtol=1e-10, atol=1e-15)
    for n in (10, 4000, 32000):
        assert default_block_size(n, 10**6) * n <= max(1 << 20, n * n // 16)
    assert isinstance(post, Posterior)


@pytest.mark.slow
def test_cli_co2_component_curves():
    """The CLI plot's curves (one jitted program): components that add up to the whole."""
    from gpchol.cli.model import Model
    from gpchol.cli.plotting import _curves

    m = Model.co2()
    p = {k: jnp.asarray(v) for k, v in m.spec.init_params().items()}
    post = m.gp(p, np.float64).condition(jnp.asarray(m.ys(m.y)))
    grid = jnp.asarray(m.xs(np.linspace(1960.0, 2010.0, 37)[:, None]))
    curves = _curves(m.gp(p, np.float64), jnp.asarray(m.ys(m.y)), grid, 3)
    assert len(curves) == 4
    whole, var_y = post.mean_and_variance(grid, include_noise=True)
    # the same arithmetic fused differently inside one program: rounding of the order of
    # cond(K) eps (|alpha| ~ 1e3 here)
    np.testing.assert_allclose(curves[0][0], whole, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(curves[0][1], var_y, rtol=1e-9)
    short = post.mean(grid, kernel=additive_terms(post.gp.kernel)[3])
    total = curves[1][0] + curves[2][0] + curves[3][0] + short
    np.testing.assert_allclose(total, whole, rtol=1e-9, atol=1e-9)
    for i in (1, 2, 3):
        ref = post.variance(grid, kernel=additive_terms(post.gp.kernel)[i - 1])
        np.testing.assert_allclose(curves[i][1], ref, rtol=1e-10, atol=1e-12)
