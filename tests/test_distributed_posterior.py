"""Sharded GP posterior (gpchol.distributed.condition) against float64 NumPy references.

8 simulated CPU devices (conftest). Each mesh's programs are unrolled over the tiles, so
one posterior per mesh (2x4, 4x2, 1x8; padded and unpadded sizes, one and several chunks
of test points) is conditioned once (module fixture) and every prediction is checked on
it. The reference is the one-device float64 computation: ``K = k(X, X) + diag(noise)``,
``mu = m(Xs) + Ks^T K^-1 (y - m(X))``, ``var = diag k(Xs, Xs) - diag(Ks^T K^-1 Ks)``.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg as sla
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import gpchol
from gpchol import distributed as gd
from gpchol import kernels, means

RTOL = 1e-10  # relative to the largest reference value (float64, n <= 72)

# (mesh shape, n, T_A, block_size): n = 70 and 61 are padded (N = 72, 64); 37 test points
# make 3, 1 and 5 blocks (rounded up to a multiple of Pc, the last one padded).
# As few tiles as each mesh allows (4, 4, 8): the programs are unrolled over them.
CASES = [((2, 4), 70, 18, 16), ((4, 2), 64, 16, None), ((1, 8), 61, 8, 8)]
M = 37


def _kernel():
    return 1.3 * kernels.Matern52(lengthscale=0.35) + 0.4 * kernels.ExpSquared(lengthscale=1.2)


def _reference(k, mean, X, y, noise, Xs):
    n = X.shape[0]
    K = np.asarray(k(X, X)) + np.diag(np.broadcast_to(noise, (n,)))
    Ks = np.asarray(k(X, Xs))
    cf = sla.cho_factor(K, lower=True)
    r = y - np.asarray(mean(X))
    alpha = sla.cho_solve(cf, r)
    mu = np.asarray(mean(Xs)) + Ks.T @ alpha
    V = sla.solve_triangular(cf[0], Ks, lower=True)
    var = np.diag(np.asarray(k(Xs, Xs))) - np.sum(V * V, axis=0)
    lml = -0.5 * r @ alpha - np.sum(np.log(np.diag(cf[0]))) - 0.5 * n * np.log(2 * np.pi)
    return mu, var, lml


def _close(a, ref, rtol=RTOL):
    a, ref = np.asarray(a), np.asarray(ref)
    assert a.shape == ref.shape
    err = np.max(np.abs(a - ref)) / np.max(np.abs(ref))
    assert err <= rtol, err


@pytest.fixture(scope="module", params=CASES, ids=lambda c: "x".join(map(str, c[0])))
def case(request):
    shape, n, T, chunk = request.param
    rng = np.random.default_rng(15 + n)
    mesh = jax.make_mesh(shape, ("r", "c"))
    X = rng.uniform(0.0, 2.0, (n, 2))
    y = np.sin(3 * X[:, 0]) + X[:, 1] + 0.1 * rng.standard_normal(n)
    noise = rng.uniform(0.01, 0.1, n)  # per point
    mean = means.Linear(weights=jnp.array([0.3, 1.0]), bias=-0.2)
    Xs = rng.uniform(-0.2, 2.2, (M, 2))
    k = _kernel()
    post = gd.condition(k, k, X, y, noise=noise, mean=mean, mesh=mesh, T_A=T, block_size=chunk)
    ref = _reference(k, mean, X, y, noise, Xs)
    return dict(mesh=mesh, post=post, X=X, y=y, noise=noise, Xs=Xs, ref=ref, rng=rng)


@pytest.mark.slow_cases("1x8", "2x4")
def test_factor_stays_in_its_sharded_tiles(case):
    post, mesh = case["post"], case["mesh"]
    assert int(post.status) == 0
    assert post.L.sharding == NamedSharding(mesh, P("r", "c"))
    N = post.L.shape[0]
    Pr, Pc = mesh.devices.shape
    assert N >= case["X"].shape[0] and N % post.setup.grid.T == 0
    assert {s.data.shape for s in post.L.addressable_shards} == {(N // Pr, N // Pc)}
    np.testing.assert_allclose(post.log_marginal_likelihood, case["ref"][2], rtol=RTOL)


@pytest.mark.slow_cases("1x8", "4x2")
def test_mean_and_variance_match_one_device(case):
    post, Xs = case["post"], case["Xs"]
    mu, var, _ = case["ref"]
    _close(post.mean(Xs), mu)
    _close(post.variance(Xs), var)
    # the predictive variance of y at the test points: a scalar or per-point test noise
    noise_s = case["rng"].uniform(0.0, 0.2, M)
    _close(post.variance(Xs, noise=noise_s), var + noise_s)
    _close(post.variance(Xs, include_noise=True, noise=0.05), var + 0.05)


@pytest.mark.slow_cases("1x8")
def test_training_inputs_and_heteroscedastic_noise(case):
    post, X, noise = case["post"], case["X"], case["noise"]
    if post.setup.grid.Pr != 4:  # one mesh is enough (each is another compile)
        pytest.skip("checked on the 4x2 mesh")
    k = _kernel()
    mean = post.prior_mean
    mu, var, _ = _reference(k, mean, X, case["y"], noise, X)
    m, v = post.mean_and_variance(include_noise=True)  # Xs=None: the training noise
    _close(m, mu)
    _close(v, var + noise)
    with pytest.raises(ValueError, match="noise=<scalar or"):
        post.variance(case["Xs"], include_noise=True)


@pytest.mark.slow_cases("1x8")
def test_jit_and_block_size(case):
    """Under the caller's jit (the posterior is a pytree) and with another block size."""
    post, Xs = case["post"], case["Xs"]
    if post.setup.grid.Pr != 4:  # one mesh is enough (each is another compile)
        pytest.skip("checked on the 4x2 mesh")
    mu, var, _ = case["ref"]
    f = jax.jit(lambda p, x: p.mean_and_variance(x, block_size=10, noise=0.01))
    m2, v2 = f(post, Xs)  # 4 blocks of 10
    _close(m2, mu)
    _close(v2, var + 0.01)
    assert post.mean(Xs[:0]).shape == (0,)


def test_one_additive_component(case):
    """``kernel=part``: that component's posterior, ``k_p(Xs, X) alpha`` and
    ``k_p(Xs, Xs) - k_p(Xs, X) K^-1 k_p(X, Xs)`` (no prior mean)."""
    post, X, Xs = case["post"], case["X"], case["Xs"]
    if post.setup.grid.Pr != 1:
        pytest.skip("checked on the 1x8 mesh")
    part = post.params.kernel2  # 0.4 * ExpSquared(1.2)
    K = np.asarray(post.params(X, X)) + np.diag(case["noise"])
    Kp = np.asarray(part(X, Xs))
    alpha = np.linalg.solve(K, case["y"] - np.asarray(post.prior_mean(X)))
    mu = Kp.T @ alpha
    var = np.diag(np.asarray(part(Xs, Xs))) - np.sum(Kp * np.linalg.solve(K, Kp), axis=0)
    m, v = post.mean_and_variance(Xs, kernel=part)
    _close(m, mu)
    _close(v, var)


@pytest.mark.slow_cases("2x4")
def test_covariance_and_samples_match_one_device(case):
    """The posterior core's covariance and joint samples, which every posterior shares:
    ``k(Xs, Xs) - Ks^T K^-1 Ks`` (+ noise on the diagonal), and samples equal to the
    one-device posterior's from the same key."""
    post, X, Xs = case["post"], case["X"], case["Xs"]
    if post.setup.grid.Pr != 2:
        pytest.skip("checked on the 2x4 mesh")
    k, noise = _kernel(), case["noise"]
    K = np.asarray(k(X, X)) + np.diag(noise)
    Ks = np.asarray(k(X, Xs))
    cov = np.asarray(k(Xs, Xs)) - Ks.T @ np.linalg.solve(K, Ks)
    _close(post.covariance(Xs), cov)
    _close(post.covariance(Xs, noise=0.03), cov + 0.03 * np.eye(M))
    dense = gpchol.GaussianProcess(k, X, noise=noise, mean=post.prior_mean).condition(case["y"])
    key = jax.random.PRNGKey(3)
    s = post.sample(key, Xs, 4)
    assert s.shape == (4, M)
    _close(s, dense.sample(key, Xs, 4), rtol=1e-7)


def test_bad_input(case):
    post, Xs = case["post"], case["Xs"]
    with pytest.raises(ValueError, match=r"Xs has 3 column\(s\).*have 2"):
        post.mean(np.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"noise \(at the test points\).* must be .*\(37,\)"):
        post.variance(Xs, noise=np.ones(36))
    with pytest.raises(ValueError, match="finite and >= 0"):
        post.variance(Xs, noise=-1.0)
    bad = Xs.copy()
    bad[5, 1] = np.nan
    with pytest.raises(ValueError, match=r"Xs has NaN or inf in row\(s\) \[5\]"):
        post.variance(bad)
    with pytest.raises(ValueError, match="block_size"):
        post.mean(Xs, block_size=0)
    for c in (2.5, True):
        with pytest.raises(TypeError, match="block_size"):
            post.mean(Xs, block_size=c)
    with pytest.raises(ValueError, match=r"noise .*must be a scalar or have shape \(\d+,\)"):
        gd.condition(_kernel(), _kernel(), case["X"], case["y"], noise=np.ones(3),
                     mesh=case["mesh"])  # fmt: skip


def _collective_result_elements(txt):
    out = []
    pat = re.compile(r"=\s*(\(?[^=]*?)\s+(all-gather|all-reduce|all-to-all|collective-permute)")
    for line in txt.splitlines():
        m = pat.search(line)
        if m:
            for dims in re.findall(r"[fsu]\d+\[([\d,]*)\]", m.group(1)):
                out.append(int(np.prod([int(d) for d in dims.split(",") if d] or [1])))
    return out


def test_hlo_collectives_move_at_most_one_tile_row(case):
    """Compiled mean and variance: every collective carries at most one ``(T, mb)`` tile
    row of the right-hand side (or one ``T x T`` diagonal tile): nothing of size ``n``
    times the test points, nothing of the factor beyond one tile."""
    post, Xs = case["post"], case["Xs"]
    if post.setup.grid.Pr != 2:
        pytest.skip("checked on the 2x4 mesh")
    T, mb = post.setup.grid.T, 16
    for f in (lambda p, x: p.mean(x), lambda p, x: p.variance(x)):
        txt = jax.jit(f).lower(post, Xs).compile().as_text()
        sizes = _collective_result_elements(txt)
        assert sizes, "expected collectives in the HLO"
        assert max(sizes) <= T * max(mb, T), (max(sizes), T, mb)


def test_failed_factorization_status_nan_and_check(case):
    """A covariance that is not positive definite: status, NaN predictions, or the error
    with ``check=True``. (A negative noise, which made it so before, is refused now: a
    kernel term that subtracts 60 from K_99 alone, through a third input column that is 1
    on row 9 only.)"""
    if case["post"].setup.grid.Pr != 4:
        pytest.skip("checked on the 4x2 mesh")
    X, y, Xs, mesh, noise = case["X"], case["y"], case["Xs"], case["mesh"], case["noise"]
    flag = np.zeros((X.shape[0], 1))
    flag[9] = 1.0
    X3, Xs3 = np.hstack([X, flag]), np.hstack([Xs, np.zeros((Xs.shape[0], 1))])
    k = (
        1.3 * kernels.Matern52(lengthscale=0.35, active_dims=(0, 1))
        + 0.4 * kernels.ExpSquared(lengthscale=1.2, active_dims=(0, 1))
        + kernels.Scale(-60.0, kernels.Linear(active_dims=(2,)))
    )  # K_99 < 0: the 10th pivot fails
    two = case["post"].prior_mean  # of the first two columns
    mean, T = means.Function(lambda X: two(X[:, :2])), case["post"].setup.grid.T
    post = gd.condition(k, k, X3, y, noise=noise, mean=mean, mesh=mesh, T_A=T)
    assert int(post.status) == 10
    assert np.all(np.isnan(np.asarray(post.variance(Xs3))))
    assert np.isnan(float(post.log_marginal_likelihood))
    with pytest.raises(gpchol.NotPositiveDefiniteError, match="pivot 10") as err:
        gd.condition(k, k, X3, y, noise=noise, mean=mean, mesh=mesh, T_A=T, check=True)
    assert err.value.pivot == 10


@pytest.mark.slow
def test_training_inputs_as_test_points_on_a_sharded_model():
    """``Xs=None`` on a model whose X is row-sharded: the training inputs are replicated
    before they are blocked (covariance and sample raised a sharding error, and mean and
    variance did under jit), for the exact and the sparse GP."""
    rng = np.random.default_rng(3)
    mesh = jax.make_mesh((2, 4), ("r", "c"))
    X, y = rng.standard_normal((30, 2)), rng.standard_normal(30)
    Xsh = jax.device_put(X, NamedSharding(mesh, P("r")))
    k = kernels.ExpSquared(0.7)
    key = jax.random.PRNGKey(0)
    for model in (
        lambda X: gpchol.GaussianProcess(k, X, noise=0.1),
        lambda X: gpchol.SparseGP(k, X, inducing=np.asarray(X)[:5], noise=0.1),
    ):
        sharded, one = model(Xsh).condition(y), model(X).condition(y)
        _close(sharded.covariance(), one.covariance())
        _close(jax.jit(lambda p: p.variance())(sharded), one.variance())
        _close(sharded.sample(key, num=2), one.sample(key, num=2), rtol=1e-9)


def test_posterior_returned_from_jit_and_passed_to_jit():
    """The model kernel's part check travelled in the posterior's static data as a closure
    over the kernel: a posterior returned from jit held a leaked tracer (every kernel=
    part was refused), and each posterior was a new static value (a jitted function of
    posteriors retraced for each)."""
    mesh = jax.make_mesh((2, 4), ("r", "c"))
    k1 = kernels.ExpSquared(0.5)
    k = k1 + kernels.Matern52(1.5)
    X = np.linspace(0, 3, 21)[:, None]
    y = np.sin(3 * X[:, 0])
    Xs = np.array([[0.3], [1.7]])
    Xsh = jax.device_put(X, NamedSharding(mesh, P()))
    post = jax.jit(lambda g, y: g.condition(y))(gpchol.GaussianProcess(k, Xsh, noise=0.01), y)
    want = gpchol.GaussianProcess(k, X, noise=0.01).condition(y).mean(Xs, kernel=k1)
    np.testing.assert_allclose(post.mean(Xs, kernel=k1), want, rtol=1e-10)
    traces = []

    @jax.jit
    def f(p, x):
        traces.append(1)
        return p.mean(x)

    for i in range(3):
        f(gpchol.GaussianProcess(k, Xsh, noise=0.01).condition(y * (i + 1)), Xs)
    assert len(traces) == 1


def test_negative_or_nan_noise_is_refused():
    """A negative noise factored and gave predictive variances below the prior's; NaN gave
    a 'not positive definite' error whose hint was to raise the noise."""
    mesh = jax.make_mesh((2, 4), ("r", "c"))
    k = kernels.ExpSquared(0.1)
    X = np.arange(10.0)[:, None] * 5
    for noise in (-0.5, np.nan, np.array([0.1] * 9 + [-1.0])):
        with pytest.raises(ValueError, match=r"noise .* must be finite and >= 0"):
            gd.condition(k, k, X, np.ones(10), noise=noise, mesh=mesh)
        with pytest.raises(ValueError, match=r"noise .* must be finite and >= 0"):
            gd.gaussian_log_likelihood(k, k, X, np.ones(10), noise, mesh)
