"""gpchol.numpyro against numpyro.distributions.MultivariateNormal (float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

numpyro = pytest.importorskip("numpyro")
import numpyro.distributions as dist  # noqa: E402
from helpers import random_spd  # noqa: E402
from numpyro.infer import MCMC, NUTS, SVI, Predictive, Trace_ELBO  # noqa: E402
from numpyro.infer.autoguide import AutoNormal  # noqa: E402

import gpchol.numpyro as gnp  # noqa: E402
from gpchol import kernels  # noqa: E402

KINDS = ("covariance_matrix", "precision_matrix", "scale_tril")
N = 5

# (loc shape, matrix batch shape, value shape without the event dimension)
SHAPES = [
    ((N,), (), ()),
    ((), (), (7,)),
    ((N,), (2, 1), (6, 2, 4)),
    ((4, 1, N), (3,), (2, 4, 3)),
]


def _params(rng, kind, batch, n=N):
    a = random_spd(rng, n, batch)
    if kind == "covariance_matrix":
        return a
    if kind == "precision_matrix":
        return np.linalg.inv(a)
    return np.linalg.cholesky(a)


def _pair(loc, kind, mat, **kw):
    ours = gnp.MultivariateNormal(loc, **{kind: mat}, **kw)
    ref = dist.MultivariateNormal(loc, **{kind: mat}, **kw)
    return ours, ref


def _rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shapes", SHAPES)
def test_log_prob_shapes_moments_match_numpyro(rng, kind, shapes):
    loc_shape, mat_batch, value_batch = shapes
    loc = rng.standard_normal(loc_shape)
    mat = _params(rng, kind, mat_batch)
    ours, ref = _pair(loc, kind, mat)
    assert ours.batch_shape == ref.batch_shape
    assert ours.event_shape == ref.event_shape
    x = rng.standard_normal(value_batch + (N,))
    lp, lp_ref = ours.log_prob(x), ref.log_prob(x)
    assert lp.shape == lp_ref.shape
    assert _rel(lp, lp_ref) < 1e-10
    assert _rel(ours.entropy(), ref.entropy()) < 1e-10
    np.testing.assert_allclose(ours.mean, ref.mean, rtol=1e-12)
    np.testing.assert_allclose(ours.variance, ref.variance, rtol=1e-10)
    for prop in KINDS:
        np.testing.assert_allclose(getattr(ours, prop), getattr(ref, prop), rtol=1e-9, atol=1e-12)
    key = jax.random.PRNGKey(0)
    s, s_ref = ours.sample(key, (2,)), ref.sample(key, (2,))
    assert s.shape == s_ref.shape
    np.testing.assert_allclose(s, s_ref, rtol=1e-9, atol=1e-12)
    assert ours.infer_shapes(loc_shape, **{kind: mat.shape}) == ref.infer_shapes(
        loc_shape, **{kind: mat.shape}
    )


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_match_numpyro(rng, kind):
    loc = rng.standard_normal(N)
    mat = _params(rng, kind, ())
    x = rng.standard_normal((3, N))

    def f(cls):
        return lambda m, c: jnp.sum(cls(m, **{kind: c}).log_prob(x))

    g = jax.grad(f(gnp.MultivariateNormal), argnums=(0, 1))(loc, mat)
    g_ref = jax.grad(f(dist.MultivariateNormal), argnums=(0, 1))(loc, mat)
    np.testing.assert_allclose(g[0], g_ref[0], rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(g[1], g_ref[1], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("n", [5, 150])
def test_whole_likelihood_path_matches_numpyro(rng, monkeypatch, n):
    """One observation per (traced) covariance takes the whole-likelihood rule on the CPU.

    n = 150 exercises LAPACK potri for K^-1; a non-PD element gives -inf with zero
    gradient (the rule's tangent is masked, never NaN).
    """
    calls = []
    real = gnp.gaussian_loglik
    monkeypatch.setattr(gnp, "gaussian_loglik", lambda *a: calls.append(1) or real(*a))
    good = np.stack([random_spd(rng, n), random_spd(rng, n)])
    loc = rng.standard_normal((2, n))
    x = rng.standard_normal((2, n))

    def f(cls):
        return lambda m, c: jnp.sum(cls(m, c, validate_args=False).log_prob(x))

    v, g = jax.jit(jax.value_and_grad(f(gnp.MultivariateNormal), argnums=(0, 1)))(loc, good)
    assert calls, "the whole-likelihood path was not taken"
    v_ref, g_ref = jax.value_and_grad(f(dist.MultivariateNormal), argnums=(0, 1))(loc, good)
    assert _rel(v, v_ref) < 1e-10
    np.testing.assert_allclose(g[0], g_ref[0], rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(g[1], g_ref[1], rtol=1e-8, atol=1e-10)
    bad = good.copy()
    bad[1, 0, 1] = bad[1, 1, 0] = 10.0 * np.abs(bad[1]).max()

    def per(c):
        return gnp.MultivariateNormal(loc, c, validate_args=False).log_prob(x)

    lp, vjp = jax.vjp(jax.jit(per), bad)
    assert np.isfinite(lp[0]) and lp[1] == -np.inf
    (gb,) = vjp(jnp.array([1.0, 1.0]))
    assert np.all(np.isfinite(gb))
    np.testing.assert_array_equal(gb[1], 0.0)
    np.testing.assert_allclose(gb[0], g_ref[1][0], rtol=1e-8, atol=1e-10)


def test_sample_statistics(rng):
    cov = random_spd(rng, 3)
    loc = rng.standard_normal(3)
    d = gnp.MultivariateNormal(loc, cov)
    s = np.asarray(d.sample(jax.random.PRNGKey(1), (40000,)))
    np.testing.assert_allclose(s.mean(0), loc, atol=5 * np.sqrt(np.diag(cov).max() / 40000))
    np.testing.assert_allclose(np.cov(s.T), cov, atol=0.05 * np.abs(cov).max())


def test_validate_args_and_bad_arguments(rng):
    bad = np.array([[1.0, 2.0], [2.0, 1.0]])
    with pytest.raises(ValueError, match="covariance_matrix"):
        gnp.MultivariateNormal(np.zeros(2), bad, validate_args=True)
    with pytest.raises(ValueError, match="precision_matrix"):
        gnp.MultivariateNormal(np.zeros(2), precision_matrix=bad, validate_args=True)
    with pytest.raises(ValueError, match="scale_tril"):
        gnp.MultivariateNormal(np.zeros(2), scale_tril=-np.eye(2), validate_args=True)
    with pytest.raises(ValueError, match="loc"):
        gnp.MultivariateNormal(np.full(2, np.nan), np.eye(2), validate_args=True)
    with pytest.raises(ValueError, match="exactly one"):
        gnp.MultivariateNormal(np.zeros(2))
    with pytest.raises(ValueError, match="exactly one"):
        gnp.MultivariateNormal(np.zeros(2), np.eye(2), scale_tril=np.eye(2))
    with pytest.raises(ValueError, match="loc"):
        gnp.MultivariateNormal(np.zeros(3), np.eye(2))
    d = gnp.MultivariateNormal(np.zeros(2), np.eye(2), validate_args=True)
    with pytest.warns(UserWarning, match="Out-of-support"):
        lp = d.log_prob(np.array([np.inf, 0.0]))
    assert lp == -np.inf
    gnp.MultivariateNormal(np.zeros(2), bad, validate_args=False)  # not checked


def test_non_pd_gives_minus_inf_and_zero_gradients(rng):
    good = random_spd(rng, 4)
    bad = good.copy()
    bad[0, 1] = bad[1, 0] = 10.0
    cov = np.stack([good, bad])
    x = rng.standard_normal(4)

    def f(c, m):
        return gnp.MultivariateNormal(m, c, validate_args=False).log_prob(x)

    lp = f(cov, np.zeros(4))
    assert np.isfinite(lp[0]) and lp[1] == -np.inf
    ref = dist.MultivariateNormal(np.zeros(4), good).log_prob(x)
    assert _rel(lp[0], ref) < 1e-10

    def total(c, m):
        v = f(c, m)
        return jnp.sum(jnp.where(jnp.isfinite(v), v, 0.0))

    gc, gm = jax.jit(jax.grad(total, argnums=(0, 1)))(cov, np.zeros(4))
    assert np.all(np.isfinite(gc)) and np.all(np.isfinite(gm))
    np.testing.assert_array_equal(gc[1], 0.0)
    # the -inf element itself has zero (not NaN) gradient
    g_bad = jax.grad(lambda c: f(c, np.zeros(4))[1])(cov)
    np.testing.assert_array_equal(g_bad, 0.0)
    g_fwd = jax.jacfwd(lambda c: f(c, np.zeros(4)))(cov)
    assert np.all(np.isfinite(g_fwd))
    d = gnp.MultivariateNormal(np.zeros(4), bad, validate_args=False)
    assert np.all(np.isnan(d.sample(jax.random.PRNGKey(0))))
    assert np.isnan(d.entropy())
    p = gnp.MultivariateNormal(np.zeros(4), precision_matrix=bad, validate_args=False)
    assert p.log_prob(x) == -np.inf


def test_pytree_jit_vmap_expand(rng):
    cov = random_spd(rng, N, (3,))
    loc = rng.standard_normal((3, N))
    x = rng.standard_normal((3, N))
    d = gnp.MultivariateNormal(loc, cov)
    leaves, tree = jax.tree_util.tree_flatten(d)
    d2 = jax.tree_util.tree_unflatten(tree, leaves)
    np.testing.assert_allclose(d2.log_prob(x), d.log_prob(x), rtol=1e-13)
    out = jax.jit(lambda d, x: d.log_prob(x))(d, x)
    np.testing.assert_allclose(out, d.log_prob(x), rtol=1e-12)
    v = jax.vmap(lambda m, c, y: gnp.MultivariateNormal(m, c).log_prob(y))(loc, cov, x)
    np.testing.assert_allclose(v, d.log_prob(x), rtol=1e-12)
    e = d.expand((2, 3))
    ref = dist.MultivariateNormal(loc, cov).expand((2, 3))
    assert e.batch_shape == ref.batch_shape and e.event_shape == ref.event_shape
    assert _rel(e.log_prob(x), ref.log_prob(x)) < 1e-10
    assert e.sample(jax.random.PRNGKey(0), (4,)).shape == (4, 2, 3, N)


def _gp_data(n=40, seed=0):
    r = np.random.default_rng(seed)
    X = np.sort(r.uniform(0.0, 5.0, n))
    y = np.sin(2.0 * X) + 0.2 * r.standard_normal(n)
    return X, y


def _sqexp(X, amp, ls):
    d2 = (X[:, None] - X[None, :]) ** 2
    return amp * jnp.exp(-0.5 * d2 / ls**2)


def _make_model(mvn):
    def model(X, y):
        _hyper_model(mvn, X, y)

    return model


def _hyper_model(mvn, X, y):
    amp = numpyro.sample("amp", dist.LogNormal(0.0, 1.0))
    ls = numpyro.sample("ls", dist.LogNormal(0.0, 1.0))
    noise = numpyro.sample("noise", dist.LogNormal(-2.0, 1.0))
    cov = _sqexp(X, amp, ls) + (noise + 1e-6) * jnp.eye(X.shape[0])
    numpyro.sample("y", mvn(jnp.zeros(X.shape[0]), cov), obs=y)


def test_gp_marginal_matches_dense_mvn(rng):
    X, y = _gp_data(12)
    k = 1.5 * kernels.ExpSquared(0.7)
    noise = rng.uniform(0.05, 0.2, 12)
    d = gnp.GaussianProcessMarginal(k, X, noise, mean=lambda X: 0.3 * X[:, 0], jitter=1e-8)
    cov = k(X, X) + np.diag(noise + 1e-8)
    ref = dist.MultivariateNormal(0.3 * X, cov)
    assert d.event_shape == (12,) and d.batch_shape == ()
    assert _rel(d.log_prob(y), ref.log_prob(y)) < 1e-10

    def lp(kern):
        return gnp.GaussianProcessMarginal(kern, X, 0.1).log_prob(y)

    def lp_ref(kern):
        return dist.MultivariateNormal(0.0, kern(X, X) + 0.1 * jnp.eye(12)).log_prob(y)

    g, g_ref = jax.grad(lp)(k), jax.grad(lp_ref)(k)
    for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g_ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-8)
    leaves, tree = jax.tree_util.tree_flatten(d)
    assert _rel(jax.tree_util.tree_unflatten(tree, leaves).log_prob(y), ref.log_prob(y)) < 1e-10
    bad = gnp.GaussianProcessMarginal(
        kernels.ExpSquared(1.0), np.zeros(3), noise=0.0, validate_args=False
    )
    assert bad.log_prob(np.zeros(3)) == -np.inf


def test_latent_gp():
    X = np.linspace(0.0, 1.0, 8)

    def model(counts=None, amp=1.0):
        f = gnp.latent_gp("f", amp * kernels.ExpSquared(0.3), X)
        numpyro.sample("y", dist.Poisson(jnp.exp(f)), obs=counts)

    draws = Predictive(model, num_samples=3)(jax.random.PRNGKey(0))
    assert draws["f"].shape == (3, 8) and draws["f_z"].shape == (3, 8)
    z = draws["f_z"][0]
    L = np.linalg.cholesky(np.asarray(kernels.ExpSquared(0.3)(X, X)) + 1e-6 * np.eye(8))
    h = numpyro.handlers
    tr = h.trace(h.seed(h.condition(model, {"f_z": z}), 0)).get_trace()
    np.testing.assert_allclose(tr["f"]["value"], L @ z, rtol=1e-9)
    ld, _ = numpyro.infer.util.log_density(model, (np.ones(8),), {}, {"f_z": z})
    assert np.isfinite(ld)
    ld_bad, _ = numpyro.infer.util.log_density(model, (np.ones(8), -1.0), {}, {"f_z": z})
    assert ld_bad == -np.inf


def test_mesh_path_with_gpchol_distributed():
    mesh = jax.make_mesh((2, 2), ("r", "c"))
    X = np.linspace(0.0, 1.0, 16)
    y = np.sin(6.0 * X)
    k = 1.3 * kernels.ExpSquared(0.3)
    d = gnp.GaussianProcessMarginal(k, X, 0.1, mean=0.2, mesh=mesh)
    ref = gnp.GaussianProcessMarginal(k, X, 0.1, mean=0.2)
    assert _rel(d.log_prob(y), ref.log_prob(y)) < 1e-10
    with pytest.raises(ValueError, match="one observation"):
        d.log_prob(np.stack([y, y]))


def _run_nuts(mvn, X, y, seed):
    mcmc = MCMC(
        NUTS(_make_model(mvn)),
        num_warmup=100,
        num_samples=150,
        num_chains=2,
        chain_method="sequential",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(seed), X, y)
    return mcmc.get_samples(group_by_chain=True)


def test_nuts_posterior_matches_numpyro():
    X, y = _gp_data(30)
    ours = _run_nuts(gnp.MultivariateNormal, X, y, 1)
    ref = _run_nuts(dist.MultivariateNormal, X, y, 2)
    for name in ("amp", "ls", "noise"):
        a, b = np.log(np.asarray(ours[name])), np.log(np.asarray(ref[name]))
        ess_a = float(numpyro.diagnostics.effective_sample_size(a))
        ess_b = float(numpyro.diagnostics.effective_sample_size(b))
        se = np.sqrt(a.var() / ess_a + b.var() / ess_b)
        assert abs(a.mean() - b.mean()) < 4.0 * se + 1e-3, (name, a.mean(), b.mean(), se)
        assert numpyro.diagnostics.split_gelman_rubin(a) < 1.1


def test_svi_autonormal_decreases_elbo():
    X, y = _gp_data(30, seed=3)
    model = _make_model(gnp.MultivariateNormal)
    guide = AutoNormal(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.05), Trace_ELBO())
    res = svi.run(jax.random.PRNGKey(0), 200, X, y, progress_bar=False)
    losses = np.asarray(res.losses)
    assert np.all(np.isfinite(losses))
    assert losses[-30:].mean() < losses[:30].mean() - 1.0
