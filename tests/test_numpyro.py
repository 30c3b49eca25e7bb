"""gpchol.numpyro against numpyro.distributions.MultivariateNormal (float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

numpyro = pytest.importorskip("numpyro")
import numpyro.distributions as dist  # noqa: E402
from helpers import patch_read_at_trace, random_spd  # noqa: E402
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


@pytest.mark.slow_cases(
    "shapes0-covariance_matrix",
    "shapes0-precision_matrix",
    "shapes0-scale_tril",
    "shapes2-covariance_matrix",
    "shapes2-precision_matrix",
    "shapes2-scale_tril",
    "shapes3-covariance_matrix",
    "shapes3-precision_matrix",
    "shapes3-scale_tril",
)
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


@pytest.mark.slow_cases("covariance_matrix", "precision_matrix")
@pytest.mark.parametrize("kind", KINDS)
def test_gradients_match_numpyro(rng, kind):
    loc = rng.standard_normal(N)
    mat = _params(rng, kind, ())
    x = rng.standard_normal((3, N))

    def f(cls):
        return lambda m, c: jnp.sum(cls(m, **{kind: c}).log_prob(x))

    g = jax.grad(f(gnp.MultivariateNormal), argnums=(0, 1))(loc, mat)
    g_ref = jax.jit(jax.grad(f(dist.MultivariateNormal), argnums=(0, 1)))(loc, mat)
    np.testing.assert_allclose(g[0], g_ref[0], rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(g[1], g_ref[1], rtol=1e-8, atol=1e-10)


@pytest.mark.slow_cases("5")
@pytest.mark.parametrize("n", [5, 150])
def test_whole_likelihood_path_matches_numpyro(rng, monkeypatch, request, n):
    """One observation per (traced) covariance takes the whole-likelihood rule on the CPU.

    n = 150 exercises LAPACK potri for K^-1; a non-PD element gives -inf with zero
    gradient (the rule's tangent is masked, never NaN).
    """
    calls = []
    real = gnp.gaussian_loglik
    # looked up when gpchol's program is traced (a program cached by an earlier test would
    # not call the wrapper)
    counted = lambda *a: calls.append(1) or real(*a)  # noqa: E731
    patch_read_at_trace(monkeypatch, request, gnp, "gaussian_loglik", counted)
    good = np.stack([random_spd(rng, n), random_spd(rng, n)])
    loc = rng.standard_normal((2, n))
    x = rng.standard_normal((2, n))

    def f(cls):
        return lambda m, c: jnp.sum(cls(m, c, validate_args=False).log_prob(x))

    v, g = jax.jit(jax.value_and_grad(f(gnp.MultivariateNormal), argnums=(0, 1)))(loc, good)
    assert calls, "the whole-likelihood path was not taken"
    v_ref, g_ref = jax.jit(jax.value_and_grad(f(dist.MultivariateNormal), argnums=(0, 1)))(
        loc, good
    )
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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

    g, g_ref = jax.grad(lp)(k), jax.jit(jax.grad(lp_ref))(k)  # ours eager, NumPyro jitted
    for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g_ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-8)
    leaves, tree = jax.tree_util.tree_flatten(d)
    assert _rel(jax.tree_util.tree_unflatten(tree, leaves).log_prob(y), ref.log_prob(y)) < 1e-10
    bad = gnp.GaussianProcessMarginal(
        kernels.ExpSquared(1.0), np.zeros(3), noise=0.0, validate_args=False
    )
    assert bad.log_prob(np.zeros(3)) == -np.inf


@pytest.mark.slow
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


@pytest.mark.slow
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
    # per-point noise on the sharded likelihood: value and gradient as on one device
    noise = np.linspace(0.05, 0.2, 16)

    def lp(k, noise, mesh):
        return gnp.GaussianProcessMarginal(k, X, noise, mean=0.2, mesh=mesh).log_prob(y)

    vg = jax.jit(jax.value_and_grad(lp, argnums=(0, 1)), static_argnums=2)
    v1, g1 = vg(k, noise, None)
    v2, g2 = vg(k, noise, mesh)
    assert _rel(v2, v1) < 1e-10
    for a, b in zip(jax.tree_util.tree_leaves(g2), jax.tree_util.tree_leaves(g1), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9)


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_svi_autonormal_decreases_elbo():
    X, y = _gp_data(30, seed=3)
    model = _make_model(gnp.MultivariateNormal)
    guide = AutoNormal(model)
    svi = SVI(model, guide, numpyro.optim.Adam(0.05), Trace_ELBO())
    res = svi.run(jax.random.PRNGKey(0), 200, X, y, progress_bar=False)
    losses = np.asarray(res.losses)
    assert np.all(np.isfinite(losses))
    assert losses[-30:].mean() < losses[:30].mean() - 1.0


# ----------------------------------------------------------------------------------------
# Posterior predictive of GaussianProcessMarginal (predictive / predict, inside Predictive)
# ----------------------------------------------------------------------------------------


def _rw_alg21(k, X, Xs, y, noise, mean_train, mean_test, test_noise=None):
    """Rasmussen & Williams Alg. 2.1 in float64 NumPy: the predictive mean and covariance."""
    K = np.asarray(k(X, X)) + np.diag(np.broadcast_to(noise, (len(y),)))
    Ks, Kss = np.asarray(k(X, Xs)), np.asarray(k(Xs, Xs))
    L = np.linalg.cholesky(K)
    alpha = np.linalg.solve(L.T, np.linalg.solve(L, y - mean_train))
    V = np.linalg.solve(L, Ks)
    cov = Kss - V.T @ V
    if test_noise is not None:
        cov = cov + np.diag(np.broadcast_to(test_noise, (Kss.shape[0],)))
    return mean_test + Ks.T @ alpha, cov


def _lin_mean(X):
    return 0.3 * X[:, 0] - 0.1


# (kernel, d, per-point training noise, include_noise, test noise, joint, jitter)
PREDICTIVE_CASES = [
    (kernels.ExpSquared(0.7), 1, False, False, None, True, None),
    (1.7 * kernels.Matern52(0.9), 1, True, True, "per-point", True, None),
    (kernels.ExpSquared(0.5), 2, False, True, None, False, None),
    (0.8 * kernels.Matern52(1.3), 2, True, False, None, False, 1e-6),
    (kernels.ExpSquared(1.1), 1, False, True, 0.05, True, 1e-8),
]


@pytest.mark.slow_cases("0", "1")
@pytest.mark.parametrize("case", range(len(PREDICTIVE_CASES)))
def test_predictive_parameters_match_rw_alg21(rng, case):
    k, d, per_point, include_noise, test_noise, joint, jitter = PREDICTIVE_CASES[case]
    n, m = 15, 7
    X = rng.uniform(0.0, 3.0, (n, d))
    Xs = rng.uniform(-0.5, 3.5, (m, d))
    y = np.sin(2.0 * X[:, 0]) + 0.1 * rng.standard_normal(n)
    noise = rng.uniform(0.01, 0.1, n) if per_point else 0.04
    tn = rng.uniform(0.01, 0.1, m) if test_noise == "per-point" else test_noise
    gp = gnp.GaussianProcessMarginal(k, X, noise, mean=_lin_mean, jitter=jitter)
    mu_ref, cov_ref = _rw_alg21(
        k,
        X,
        Xs,
        y,
        np.asarray(noise) + (jitter or 0.0),
        _lin_mean(X),
        _lin_mean(Xs),
        (tn if tn is not None else noise) if include_noise else None,
    )
    p = gp.predictive(y, Xs, include_noise=include_noise, noise=tn, joint=joint)
    assert p.event_shape == (m,) and p.batch_shape == ()
    scale = np.max(np.diag(cov_ref))
    if joint:
        assert isinstance(p, gnp.MultivariateNormal)
        np.testing.assert_allclose(p.loc, mu_ref, rtol=1e-9, atol=1e-10)
        St = np.asarray(p.scale_tril)
        np.testing.assert_array_equal(St, np.tril(St))
        # the relative jitter (1e-10 of the largest variance) is the only difference
        np.testing.assert_allclose(St @ St.T, cov_ref, atol=2e-10 * scale + 1e-12)
    else:
        np.testing.assert_allclose(p.base_dist.loc, mu_ref, rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(
            p.base_dist.scale**2, np.diag(cov_ref), rtol=1e-8, atol=1e-10 * scale
        )
    s = p.sample(jax.random.PRNGKey(0), (3,))
    assert s.shape == (3, m) and np.all(np.isfinite(s))
    # the site records the same distribution
    h = numpyro.handlers
    tr = h.trace(h.seed(gp.predict, 0)).get_trace(
        "f_star", y, Xs, include_noise=include_noise, noise=tn, joint=joint
    )
    site = tr["f_star"]
    assert site["type"] == "sample" and site["value"].shape == (m,)
    loc = site["fn"].loc if joint else site["fn"].base_dist.loc
    np.testing.assert_allclose(loc, mu_ref, rtol=1e-9, atol=1e-10)
    post = gp.condition(y)
    np.testing.assert_allclose(post.mean(Xs), mu_ref, rtol=1e-9, atol=1e-10)


@pytest.mark.slow_cases("True")
@pytest.mark.parametrize("joint", [True, False])
def test_predictive_of_one_additive_component(rng, joint):
    """kernel=part: f_p(Xs) | y ~ N(k_p(Xs, X) alpha, k_p(Xs, Xs) - k_p(Xs, X) K^-1 k_p(X, Xs))."""
    X = rng.uniform(0.0, 3.0, 14)
    Xs = rng.uniform(-0.5, 3.5, 5)
    y = np.sin(2.0 * X) + 0.1 * rng.standard_normal(14)
    smooth, rough = 1.5 * kernels.ExpSquared(1.2), 0.3 * kernels.Matern52(0.3)
    gp = gnp.GaussianProcessMarginal(smooth + rough, X, 0.04, mean=0.5)
    K = np.asarray((smooth + rough)(X, X)) + 0.04 * np.eye(14)
    Kp, Kpss = np.asarray(smooth(X, Xs)), np.asarray(smooth(Xs, Xs))
    mu_ref = Kp.T @ np.linalg.solve(K, y - 0.5)  # a component carries no prior mean
    cov_ref = Kpss - Kp.T @ np.linalg.solve(K, Kp)
    p = gp.predictive(y, Xs, kernel=smooth, joint=joint)
    scale = np.max(np.diag(cov_ref))
    if joint:
        np.testing.assert_allclose(p.loc, mu_ref, rtol=1e-9, atol=1e-10)
        St = np.asarray(p.scale_tril)
        np.testing.assert_allclose(St @ St.T, cov_ref, atol=2e-10 * scale + 1e-12)
    else:
        np.testing.assert_allclose(p.base_dist.loc, mu_ref, rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(p.base_dist.scale**2, np.diag(cov_ref), rtol=1e-8)


def _predictive_model(X, y=None, Xs=None, joint=True):
    amp = numpyro.sample("amp", dist.LogNormal(0.0, 1.0))
    ls = numpyro.sample("ls", dist.LogNormal(0.0, 1.0))
    noise = numpyro.sample("noise", dist.LogNormal(-2.0, 1.0))
    gp = gnp.GaussianProcessMarginal(amp * kernels.ExpSquared(ls), X, noise=noise, mean=0.2)
    y = numpyro.sample("y", gp, obs=y)
    if Xs is not None:
        d = gp.predictive(y, Xs, include_noise=True, joint=joint)
        if joint:
            numpyro.deterministic("loc", d.loc)
            numpyro.deterministic("cov", d.scale_tril @ d.scale_tril.T)
        gp.predict("y_star", y, Xs, include_noise=True, joint=joint)


@pytest.mark.slow_cases("True")
@pytest.mark.parametrize("parallel", [False, True])
def test_predict_in_predictive_over_posterior_draws(rng, parallel):
    X, y = _gp_data(12)
    Xs = np.linspace(-0.5, 5.5, 6)
    draws = {
        "amp": rng.uniform(0.5, 2.0, 5),
        "ls": rng.uniform(0.3, 1.5, 5),
        "noise": rng.uniform(0.02, 0.2, 5),
    }
    out = Predictive(_predictive_model, draws, parallel=parallel)(
        jax.random.PRNGKey(0), X, y, Xs=Xs
    )
    assert out["y_star"].shape == (5, 6) and np.all(np.isfinite(out["y_star"]))
    for i in range(5):
        k = draws["amp"][i] * kernels.ExpSquared(draws["ls"][i])
        nz = draws["noise"][i]
        mu_ref, cov_ref = _rw_alg21(k, X, Xs, y, nz, 0.2, 0.2, nz)
        np.testing.assert_allclose(out["loc"][i], mu_ref, rtol=1e-9, atol=1e-10)
        scale = np.max(np.diag(cov_ref))
        np.testing.assert_allclose(out["cov"][i], cov_ref, atol=2e-10 * scale + 1e-12)
    # independent keys per draw: two draws with the same hyperparameters differ
    assert len(np.unique(np.asarray(out["y_star"][:, 0]))) == 5
    if not parallel:
        return
    # prior predictive (y not observed): y is drawn, then y_star given that y
    prior = Predictive(_predictive_model, num_samples=5, parallel=parallel)(
        jax.random.PRNGKey(1), X, Xs=Xs
    )
    assert prior["y"].shape == (5, 12) and prior["y_star"].shape == (5, 6)
    assert np.all(np.isfinite(prior["y_star"]))


@pytest.mark.slow
def test_predict_draws_have_the_predictive_moments():
    """Many draws of one hyperparameter value: empirical moments of the vmapped site."""
    X, y = _gp_data(10)
    Xs = np.array([0.3, 2.0, 2.2, 6.0])
    num = 2000
    draws = {"amp": np.full(num, 1.3), "ls": np.full(num, 0.8), "noise": np.full(num, 0.05)}
    out = Predictive(_predictive_model, draws, parallel=True, return_sites=["y_star"])(
        jax.random.PRNGKey(2), X, y, Xs=Xs
    )
    s = np.asarray(out["y_star"])
    mu_ref, cov_ref = _rw_alg21(1.3 * kernels.ExpSquared(0.8), X, Xs, y, 0.05, 0.2, 0.2, 0.05)
    sd = np.sqrt(np.diag(cov_ref))
    np.testing.assert_array_less(np.abs(s.mean(0) - mu_ref), 5.0 * sd / np.sqrt(num))
    # standard error of a sample covariance: sqrt((S_ii S_jj + S_ij^2) / num)
    se = np.sqrt((np.outer(sd**2, sd**2) + cov_ref**2) / num)
    np.testing.assert_array_less(np.abs(np.cov(s.T) - cov_ref), 5.0 * se)


@pytest.mark.slow
def test_predictive_jit_grad_and_failure(rng):
    X, y = _gp_data(10)
    Xs = np.array([0.5, 1.5, 4.0])

    def moments(ls, nz):
        gp = gnp.GaussianProcessMarginal(kernels.ExpSquared(ls), X, noise=nz)
        p = gp.predictive(y, Xs, include_noise=True, joint=False)
        return p.base_dist.loc, p.base_dist.scale

    loc, sc = jax.jit(moments)(0.8, 0.05)
    mu_ref, cov_ref = _rw_alg21(kernels.ExpSquared(0.8), X, Xs, y, 0.05, 0.0, 0.0, 0.05)
    np.testing.assert_allclose(loc, mu_ref, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(sc**2, np.diag(cov_ref), rtol=1e-8)

    def params(theta):  # both variants' parameters, flattened
        gp = gnp.GaussianProcessMarginal(kernels.ExpSquared(theta[0]), X, noise=theta[1])
        p = gp.predictive(y, Xs, noise=0.02, joint=False)
        q = gp.predictive(y, Xs)
        return jnp.concatenate([p.base_dist.loc, p.base_dist.scale, q.loc])

    # reverse mode against central differences (one compiled program each)
    theta, h = np.array([0.8, 0.05]), 1e-6
    jac = jax.jit(jax.jacrev(params))(theta)
    f = jax.jit(params)
    fd = np.stack([(f(theta + h * e) - f(theta - h * e)) / (2 * h) for e in np.eye(2)], 1)
    np.testing.assert_allclose(jac, fd, rtol=1e-5, atol=1e-7)
    # a failed factorization (traced negative noise): NaN predictions, no exception
    loc_bad, sc_bad = jax.jit(moments)(0.8, -5.0)
    assert np.all(np.isnan(loc_bad)) and np.all(np.isnan(sc_bad))

    def joint_bad(nz):
        gp = gnp.GaussianProcessMarginal(kernels.ExpSquared(0.8), X, noise=nz)
        p = gp.predictive(y, Xs)
        return p.loc, p.sample(jax.random.PRNGKey(0)), gp.condition(y).status

    loc_bad, s_bad, status = jax.jit(joint_bad)(-5.0)
    assert np.all(np.isnan(loc_bad)) and np.all(np.isnan(s_bad)) and int(status) > 0
    # no test points
    gp = gnp.GaussianProcessMarginal(kernels.ExpSquared(0.8), X, noise=0.05)
    for joint in (True, False):
        p = gp.predictive(y, np.zeros((0, 1)), joint=joint)
        assert p.event_shape == (0,) and p.sample(jax.random.PRNGKey(0), (2,)).shape == (2, 0)


def test_float32_joint_predictive_of_a_covariance_singular_to_rounding():
    # As Posterior.sample (tests/test_posterior.py): the default jitters were under float32's
    # rounding, so the joint predictive's scale_tril and draws were NaN.
    with jax.enable_x64(False):
        X = jnp.linspace(0.0, 1.0, 100)
        gp = gnp.GaussianProcessMarginal(kernels.ExpSquared(0.5), X, noise=1e-2)
        Xs = jnp.linspace(0.0, 1.0, 200)
        p = gp.predictive(jnp.sin(X), Xs)
        L = np.asarray(p.scale_tril, np.float64)
        assert np.all(np.isfinite(L)) and np.allclose(L, np.tril(L))
        C = np.asarray(gp.condition(jnp.sin(X)).covariance(Xs), np.float64)
        np.testing.assert_allclose(L @ L.T, C, atol=2e-3 * C.max())  # float32 rounding
        assert np.all(np.isfinite(p.sample(jax.random.PRNGKey(0), (3,))))
        with pytest.warns(RuntimeWarning, match="predictive: .* without jitter") as w:
            gp.predictive(jnp.sin(X), Xs, jitter=None)
        assert w[0].filename == __file__
        with pytest.warns(RuntimeWarning, match="without jitter") as w:  # through predict
            numpyro.handlers.seed(lambda: gp.predict("f", jnp.sin(X), Xs, jitter=None), 0)()
        assert w[0].filename == __file__


@pytest.mark.slow
def test_predictive_bad_arguments():
    X, y = _gp_data(8)
    gp = gnp.GaussianProcessMarginal(kernels.ExpSquared(0.8), X, noise=0.05)
    hetero = gnp.GaussianProcessMarginal(kernels.ExpSquared(0.8), X, noise=np.full(8, 0.05))
    Xs = np.array([0.5, 1.5, 4.0])
    with pytest.raises(ValueError, match=r"Xs.* has 2 column"):
        gp.predictive(y, np.zeros((3, 2)))
    with pytest.raises(ValueError, match="Xs must have shape"):
        gp.predictive(y, np.zeros((3, 1, 1)))
    with pytest.raises(ValueError, match=r"Xs.* NaN"):
        gp.predictive(y, np.array([0.5, np.nan]))
    bad_shape = r"noise \(at the test points\) must be a scalar or have shape \(3,\)"
    with pytest.raises(ValueError, match=bad_shape):
        gp.predictive(y, Xs, include_noise=True, noise=np.ones(2))
    with pytest.raises(ValueError, match="finite and >= 0"):
        gp.predictive(y, Xs, include_noise=True, noise=-1.0)
    # noise= implies include_noise
    a = gp.predictive(y, Xs, noise=0.1, joint=False).base_dist.scale
    b = gp.predictive(y, Xs, include_noise=True, noise=0.1, joint=False).base_dist.scale
    np.testing.assert_array_equal(a, b)
    needs = r"per-point \(heteroscedastic\) training noise needs .* noise="
    with pytest.raises(ValueError, match=needs):
        hetero.predictive(y, Xs, include_noise=True)
    hetero.predictive(y, Xs, include_noise=True, noise=np.full(3, 0.05))  # accepted
    with pytest.raises(TypeError, match="joint must be True or False"):
        gp.predictive(y, Xs, joint="yes")
    with pytest.raises(ValueError, match=r"y must have shape \(8,\)"):
        gp.predictive(np.zeros(5), Xs)
    plain = gnp.GaussianProcessMarginal(lambda a, b: jnp.exp(-((a - b.T) ** 2)), X, noise=0.1)
    with pytest.raises(TypeError, match="need a gpchol kernel"):
        plain.predict("f", y, Xs)


# ----------------------------------------------------------------------------------------
# NumPyro's conventions (issue 31): signature, attributes, validation inside jit, vmap_over
# ----------------------------------------------------------------------------------------


def test_signature_and_class_attributes_are_numpyros():
    import inspect

    ours = inspect.signature(gnp.MultivariateNormal).parameters
    ref = inspect.signature(dist.MultivariateNormal).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values()] == [
        (p.name, p.kind, p.default) for p in ref.values()
    ]
    assert list(inspect.getfullargspec(gnp.MultivariateNormal.__init__).args) == [
        "self",
        "loc",
        "covariance_matrix",
        "precision_matrix",
        "scale_tril",
    ]
    A, R = gnp.MultivariateNormal, dist.MultivariateNormal
    assert A.arg_constraints.keys() == R.arg_constraints.keys()
    for k, c in R.arg_constraints.items():
        assert type(A.arg_constraints[k]) is type(c), k
        assert A.arg_constraints[k].event_dim == c.event_dim, k
    assert type(A.support) is type(R.support) and A.support.event_dim == R.support.event_dim
    assert set(A.reparametrized_params) == set(R.reparametrized_params)
    assert A.infer_shapes((3, 1, 4), None, None, (2, 4, 4)) == R.infer_shapes(
        (3, 1, 4), None, None, (2, 4, 4)
    )


@pytest.mark.slow_cases("covariance_matrix", "precision_matrix")
@pytest.mark.parametrize("kind", KINDS)
def test_positional_arguments_match_numpyro(rng, kind):
    loc = rng.standard_normal((2, N))
    mat = _params(rng, kind, ())
    args = [loc, None, None, None]
    args[1 + KINDS.index(kind)] = mat
    ours, ref = gnp.MultivariateNormal(*args), dist.MultivariateNormal(*args)
    x = rng.standard_normal((3, 2, N))
    assert ours.batch_shape == ref.batch_shape == (2,)
    assert _rel(ours.log_prob(x), ref.log_prob(x)) < 1e-10
    np.testing.assert_allclose(ours.scale_tril, ref.scale_tril, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("kind", KINDS)
def test_validate_args_checks_concrete_parameters_inside_jit(rng, kind):
    bad = {
        "covariance_matrix": np.array([[1.0, 2.0], [2.0, 1.0]]),
        "precision_matrix": -np.eye(2),
        "scale_tril": np.array([[1.0, 1.0], [0.0, -1.0]]),
    }[kind]
    # the same behaviour as NumPyro's class (which checks concrete values in jit from 0.22)
    same = tuple(int(v) for v in numpyro.__version__.split(".")[:2]) >= (0, 22)
    for mvn in (gnp.MultivariateNormal,) + ((dist.MultivariateNormal,) if same else ()):
        with pytest.raises(ValueError, match=kind):
            jax.jit(lambda mvn=mvn: mvn(np.zeros(2), **{kind: bad}, validate_args=True))()
    # loc too (NumPyro's class reshapes loc under the trace first, so it skips that check)
    good = _params(rng, kind, (), n=2)
    with pytest.raises(ValueError, match="loc"):
        jax.jit(lambda: gnp.MultivariateNormal([np.nan, 0.0], **{kind: good}, validate_args=True))()
    # traced parameters (a sampler's) cannot be checked: no error, and -inf for a non-PD
    # covariance (NumPyro's own class gives NaN there)
    if kind == "covariance_matrix":
        f = jax.jit(
            lambda c: gnp.MultivariateNormal(0.0, c, validate_args=True).log_prob(np.zeros(2))
        )
        assert f(bad) == -np.inf
    d = gnp.MultivariateNormal(np.zeros(2), np.eye(2), validate_args=True)
    with pytest.warns(UserWarning, match="Out-of-support"):
        jax.jit(lambda: d.log_prob(np.array([np.inf, 0.0])))()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("axis", [0, 1])
def test_vmap_over_maps_every_matrix_attribute(rng, kind, axis):
    from numpyro.distributions.batch_util import vmap_over

    mats = _params(rng, kind, (4,))
    locs = rng.standard_normal((4, N))
    x = rng.standard_normal(N)
    d0 = gnp.MultivariateNormal(locs[0], **{kind: mats[0]})

    def make(m, c):
        d = gnp.MultivariateNormal(m, **{kind: c})
        for prop in KINDS:  # derived matrices cached by the lazy properties are mapped too
            getattr(d, prop)
        return d

    out_axes = vmap_over(d0, loc=0, **{kind: axis})
    d = jax.vmap(make, in_axes=(0, axis), out_axes=out_axes)(locs, np.moveaxis(mats, 0, axis))
    lp = jax.vmap(lambda d: d.log_prob(x), in_axes=(out_axes,))(d)
    props = {
        prop: jax.vmap(lambda d, prop=prop: getattr(d, prop), in_axes=(out_axes,))(d)
        for prop in KINDS
    }
    for i in range(4):
        ref = dist.MultivariateNormal(locs[i], **{kind: mats[i]})
        assert _rel(lp[i], ref.log_prob(x)) < 1e-10
        for prop in KINDS:
            np.testing.assert_allclose(props[prop][i], getattr(ref, prop), rtol=1e-9, atol=1e-12)


@pytest.mark.slow
def test_gp_marginal_follows_numpyro_conventions(rng):
    from numpyro.distributions.batch_util import vmap_over

    X = np.sort(rng.uniform(0.0, 3.0, 6))
    ls, noise = 0.7, 0.05
    gp = gnp.GaussianProcessMarginal(kernels.ExpSquared(ls), X, noise=noise)
    ref = dist.MultivariateNormal(np.zeros(6), np.asarray(gp.covariance_matrix))
    np.testing.assert_allclose(
        gp.covariance_matrix,
        np.exp(-0.5 * (X[:, None] - X[None, :]) ** 2 / ls**2) + noise * np.eye(6),
        rtol=1e-12,
    )
    key = jax.random.PRNGKey(0)
    assert gp.sample(key, (2, 3)).shape == (2, 3, 6)
    y = rng.standard_normal((2, 3, 6))
    # expand / to_event / mask, as any NumPyro distribution
    e = gp.expand((3,))
    assert (e.batch_shape, e.event_shape) == ((3,), (6,))
    assert _rel(e.log_prob(y), ref.expand((3,)).log_prob(y)) < 1e-10
    t = e.to_event(1)
    assert (t.batch_shape, t.event_shape) == ((), (3, 6))
    assert _rel(t.log_prob(y), ref.expand((3,)).to_event(1).log_prob(y)) < 1e-10
    assert gp.mask(False).log_prob(y[0, 0]) == 0.0
    assert _rel(gp.mask(True).log_prob(y[0, 0]), ref.log_prob(y[0, 0])) < 1e-10
    assert gp.infer_shapes(None, X.shape, ()) == ((), (6,))
    # a pytree: returned from jit and mapped with vmap_over
    assert _rel(jax.jit(lambda: gp)().log_prob(y), ref.log_prob(y)) < 1e-10
    lss = np.array([0.5, 0.7, 1.1])
    out_axes = vmap_over(gp, kernel=0)
    gps = jax.vmap(
        lambda s: gnp.GaussianProcessMarginal(kernels.ExpSquared(s), X, noise=noise),
        out_axes=out_axes,
    )(lss)
    lp = jax.vmap(lambda d: d.log_prob(y[0, 0]), in_axes=(out_axes,))(gps)
    assert _rel(lp[1], ref.log_prob(y[0, 0])) < 1e-10
    # validate_args=True checks concrete parameters inside jit too (a negative noise)
    with pytest.raises(ValueError, match="covariance_matrix"):
        jax.jit(
            lambda: gnp.GaussianProcessMarginal(
                kernels.ExpSquared(ls), X, noise=-5.0, validate_args=True
            )
        )()


def test_bad_arguments_name_the_argument():
    with pytest.raises(TypeError, match="loc"):
        gnp.MultivariateNormal("a", np.eye(2))
    with pytest.raises(TypeError, match=r"covariance_matrix.*complex"):
        gnp.MultivariateNormal(0.0, np.eye(2) + 0j)
    with pytest.raises(TypeError, match="scale_tril"):
        gnp.MultivariateNormal(0.0, None, None, np.array([["a", "b"], ["c", "d"]]))
    with pytest.raises(ValueError, match="precision_matrix must have shape"):
        gnp.MultivariateNormal(0.0, None, np.ones((2, 3)))
    with pytest.raises(ValueError, match="exactly one"):
        gnp.MultivariateNormal(0.0, np.eye(2), np.eye(2))
    X = np.linspace(0.0, 1.0, 4)
    with pytest.raises(TypeError, match="validate_args"):
        gnp.GaussianProcessMarginal(kernels.ExpSquared(0.3), X, 0.1, validate_args="yes")
    with pytest.raises(ValueError, match="noise"):
        gnp.GaussianProcessMarginal(kernels.ExpSquared(0.3), X, np.ones(3))
    from numpyro.distributions.batch_util import vmap_over

    gp = gnp.GaussianProcessMarginal(kernels.ExpSquared(0.3), X, 0.1)
    with pytest.raises(ValueError, match="one axis"):
        vmap_over(gp, X=0, noise=1)


def test_mixed_dtypes_give_the_promoted_density_under_jit_and_eagerly():
    """A float32 covariance with float64 values: the density is float64 under ``jit`` (the
    whole-likelihood path) as eagerly and in NumPyro (it was float32 under jit)."""
    import numpyro.distributions as nd

    from gpchol.numpyro import MultivariateNormal

    C = np.array([[2.0, 0.5], [0.5, 1.0]], np.float32)
    x = np.array([0.3, -0.2])

    def lp(cls):
        return lambda C: cls(np.zeros(2), C).log_prob(x)

    eager, jitted = lp(MultivariateNormal)(C), jax.jit(lp(MultivariateNormal))(C)
    ref = jax.jit(lp(nd.MultivariateNormal))(C)
    assert eager.dtype == jitted.dtype == ref.dtype == np.float64
    # the paths round the float32 covariance's factor differently: float32's precision
    np.testing.assert_allclose(float(jitted), float(eager), rtol=1e-6)
    np.testing.assert_allclose(float(jitted), float(ref), rtol=1e-6)


# ------------------------------------------------------------------ kl_divergence


def _kl_np(m1, S1, m2, S2):
    """KL(N(m1, S1) || N(m2, S2)) in float64 NumPy, from the covariances."""
    n = m1.shape[-1]
    inv = np.linalg.inv(S2)
    dm = m2 - m1
    quad = np.einsum("...i,...ij,...j->...", dm, inv, dm)
    trace = np.einsum("...ij,...ji->...", inv, S1)
    logdet = np.linalg.slogdet(S2)[1] - np.linalg.slogdet(S1)[1]
    return 0.5 * (trace + quad - n + logdet)


@pytest.mark.parametrize("kind_p", KINDS)
@pytest.mark.parametrize("kind_q", KINDS)
@pytest.mark.parametrize("numpyro_side", [None, "p", "q"])
def test_kl_divergence_against_numpy(rng, kind_p, kind_q, numpyro_side):
    """``numpyro.distributions.kl_divergence`` of gpchol normals (against each other or a
    NumPyro one), every parametrization, batch shapes broadcast: the float64 formula."""
    S1, S2 = random_spd(rng, N, (3,)), random_spd(rng, N, ())
    m1, m2 = rng.standard_normal((3, N)), rng.standard_normal(N)

    def make(m, S, kind, numpyro_dist):
        cls = dist.MultivariateNormal if numpyro_dist else gnp.MultivariateNormal
        mat = {"covariance_matrix": S, "precision_matrix": np.linalg.inv(S)}.get(kind)
        return cls(m, **{kind: np.linalg.cholesky(S) if mat is None else mat})

    p = make(m1, S1, kind_p, numpyro_side == "p")
    q = make(m2, S2, kind_q, numpyro_side == "q")
    got = dist.kl_divergence(p, q)
    assert got.shape == (3,)
    np.testing.assert_allclose(got, _kl_np(m1, S1, m2, S2), rtol=1e-11)
    np.testing.assert_allclose(dist.kl_divergence(p, p), 0.0, atol=1e-12)


def test_kl_divergence_gradients_and_failures(rng):
    from jax.test_util import check_grads

    S1, S2 = random_spd(rng, 4, ()), random_spd(rng, 4, ())
    m1, m2 = rng.standard_normal(4), rng.standard_normal(4)

    def kl(m1, S1, m2, S2):
        return dist.kl_divergence(gnp.MultivariateNormal(m1, S1), gnp.MultivariateNormal(m2, S2))

    def kl_of_roots(m1, A1, m2, A2):  # symmetric covariances under any perturbation
        return kl(m1, A1 @ A1.T + np.eye(4), m2, A2 @ A2.T + np.eye(4))

    roots = rng.standard_normal((2, 4, 4))
    check_grads(kl_of_roots, (m1, roots[0], m2, roots[1]), order=1, modes=("fwd", "rev"))
    # as the reference: grad wrt the covariances of the float64 formula's JAX version
    g = jax.grad(kl, argnums=(1, 3))(m1, S1, m2, S2)
    want = jax.grad(
        lambda a, b: dist.kl_divergence(
            dist.MultivariateNormal(m1, a), dist.MultivariateNormal(m2, b)
        ),
        argnums=(0, 1),
    )(S1, S2)
    for a, b in zip(g, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    bad = S2 - 2 * np.linalg.eigvalsh(S2)[-1] * np.eye(4)  # negative definite
    q = gnp.MultivariateNormal(m2, bad, validate_args=False)
    assert np.isnan(dist.kl_divergence(gnp.MultivariateNormal(m1, S1), q))
    with pytest.raises(ValueError, match="same dimension"):
        dist.kl_divergence(
            gnp.MultivariateNormal(m1, S1), gnp.MultivariateNormal(m2[:3], S2[:3, :3])
        )


def test_trace_mean_field_elbo_takes_gpchol_normals():
    """NumPyro's TraceMeanField_ELBO computes the KL of a gpchol prior and guide in closed
    form."""
    from numpyro.infer import TraceMeanField_ELBO

    S = np.array([[1.0, 0.5], [0.5, 2.0]])
    y = np.array([0.3, -0.2])

    def model():
        f = numpyro.sample("f", gnp.MultivariateNormal(jnp.zeros(2), S))
        numpyro.sample("y", dist.Normal(f, 1.0).to_event(1), obs=y)

    mq, Sq = np.array([0.1, -0.1]), np.array([[0.5, 0.1], [0.1, 0.6]])

    def guide():
        numpyro.sample("f", gnp.MultivariateNormal(jnp.asarray(mq), jnp.asarray(Sq)))

    # without an observation the loss is the KL alone, in closed form (no sampling error)
    def prior_only():
        numpyro.sample("f", gnp.MultivariateNormal(jnp.zeros(2), S))

    kl = TraceMeanField_ELBO().loss(jax.random.PRNGKey(0), {}, prior_only, guide)
    np.testing.assert_allclose(kl, _kl_np(mq, Sq, np.zeros(2), S), rtol=1e-12)
    # with one: KL + E_q[-log p(y | f)] by one draw, finite and differentiable
    loss, grad = jax.value_and_grad(
        lambda m: TraceMeanField_ELBO().loss(
            jax.random.PRNGKey(0),
            {},
            model,
            lambda: numpyro.sample("f", gnp.MultivariateNormal(m, jnp.asarray(Sq))),
        )
    )(jnp.asarray(mq))
    assert np.isfinite(loss) and np.all(np.isfinite(grad))
