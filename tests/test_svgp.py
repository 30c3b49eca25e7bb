"""SVGP and its likelihoods: the bound against a dense float64 NumPy reference, quadrature
against closed forms and adaptive quadrature, whitening, the exact-GP limit, gradients,
transformations, failure status, bad input, minibatches, training with optax and
prediction.

The reference writes the bound in the unwhitened variables with dense inverses and
log-determinants (``KL(N(mu_u, Sigma_u) || N(0, K_uu)) + sum_i E[log p(y_i | f_i)]``), an
independent derivation of what the model computes with triangular solves.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.test_util import check_grads
from scipy import integrate
from scipy.special import gammaln, log_ndtr, ndtr

import gpchol
from gpchol import SVGP, kernels, likelihoods

TOL = {np.float64: 1e-8, np.float32: 2e-3}
JITTER = 1e-6


def _k_np(x1, x2, amp, ls):
    d2 = ((x1[:, None, :] - x2[None, :, :]) ** 2).sum(-1)
    return amp * np.exp(-0.5 * d2 / ls**2)


def _ve_np(lik, y, mu, var):
    """Expected log likelihoods, float64: closed forms, else adaptive quadrature."""
    if isinstance(lik, likelihoods.Gaussian):
        s = float(lik.noise)
        return -0.5 * (np.log(2 * np.pi * s) + ((y - mu) ** 2 + var) / s)
    if isinstance(lik, likelihoods.Poisson):  # E[exp f] = exp(mu + v / 2)
        return y * mu - np.exp(mu + 0.5 * var) - gammaln(y + 1.0)
    out = []
    for yi, m, v in zip(y, mu, var, strict=True):
        sd = np.sqrt(v)

        def f(t, yi=yi, m=m, sd=sd):
            return np.exp(-0.5 * t * t) / np.sqrt(2 * np.pi) * log_ndtr((2 * yi - 1) * (m + sd * t))

        out.append(integrate.quad(f, -12, 12, epsabs=1e-14, epsrel=1e-13, limit=200)[0])
    return np.asarray(out)


def _marginals_np(model_np, X):
    Z, amp, ls, mu_u, Su, c = (model_np[k] for k in ("Z", "amp", "ls", "mu_u", "Su", "c"))
    Kuu = _k_np(Z, Z, amp, ls) + JITTER * np.eye(len(Z))
    Kinv = np.linalg.inv(Kuu)
    Kuf = _k_np(Z, X, amp, ls)
    Sig = Su @ Su.T
    mean = c + Kuf.T @ Kinv @ mu_u
    var = (
        amp
        - np.einsum("ij,ik,kj->j", Kuf, Kinv, Kuf)
        + np.einsum("ij,ik,kl,lm,mj->j", Kuf, Kinv, Sig, Kinv, Kuf)
    )
    return mean, var, Kuu, Kinv, Sig


def elbo_np(model_np, lik, X, y, num_data):
    mean, var, Kuu, Kinv, Sig = _marginals_np(model_np, X)
    mu_u = model_np["mu_u"]
    M = len(mu_u)
    kl = 0.5 * (
        np.trace(Kinv @ Sig)
        + mu_u @ Kinv @ mu_u
        - M
        + np.linalg.slogdet(Kuu)[1]
        - np.linalg.slogdet(Sig)[1]
    )
    return num_data / len(y) * np.sum(_ve_np(lik, y, mean, var)) - kl


def _data(rng, lik, n, d=2):
    X = rng.uniform(-1.0, 1.0, (n, d))
    f = np.sin(2.0 * X[:, 0]) + 0.5 * X[:, -1]
    if isinstance(lik, likelihoods.Bernoulli):
        y = (rng.uniform(size=n) < ndtr(2 * f)).astype(float)
    elif isinstance(lik, likelihoods.Poisson):
        y = rng.poisson(np.exp(f)).astype(float)
    else:
        y = f + 0.1 * rng.standard_normal(n)
    return X, y


def _random_model(rng, lik, M=7, d=2, whiten=True, c=0.0, dtype=np.float64, jitter=JITTER):
    """A model with random inducing inputs and q(u) of the prior's scale (whitened: v's
    moments of order 1; unwhitened: u = L_z v, so that the latent variances stay of the
    order of the prior's and the quadrature's accuracy is that of the whitened case)."""
    Z = rng.uniform(-1.0, 1.0, (M, d))
    amp, ls = 1.3, 0.7
    Lz = np.linalg.cholesky(_k_np(Z, Z, amp, ls) + jitter * np.eye(M))
    v_mu = 0.5 * rng.standard_normal(M)
    v_sqrt = np.tril(0.3 * rng.standard_normal((M, M)), -1) + np.diag(rng.uniform(0.3, 0.9, M))
    mu_u, Su = Lz @ v_mu, Lz @ v_sqrt
    q_mu, q_sqrt = (v_mu, v_sqrt) if whiten else (mu_u, Su)
    model = SVGP(
        amp * kernels.ExpSquared(ls),
        inducing=jnp.asarray(Z, dtype),
        likelihood=lik,
        num_data=50,
        mean=c,
        whiten=whiten,
        q_mu=jnp.asarray(q_mu, dtype),
        q_sqrt=jnp.asarray(q_sqrt, dtype),
        jitter=jitter,
    )
    return model, {"Z": Z, "amp": amp, "ls": ls, "mu_u": mu_u, "Su": Su, "c": c}


LIKS = [
    pytest.param(likelihoods.Gaussian(0.2), id="gaussian"),
    # 50 points: quadrature error ~1e-13, below the tolerance (the default 20 points:
    # ~1e-7 relative at latent variances up to 2, test_more_points_converge)
    pytest.param(likelihoods.Bernoulli(50), id="bernoulli"),
    pytest.param(likelihoods.Poisson(), id="poisson"),
]


# --------------------------------------------------------------------- likelihoods


def test_gauss_hermite_is_exact_on_polynomials_and_exp(rng):
    mu, v = rng.standard_normal(5), rng.uniform(0.01, 2.0, 5)
    gh = likelihoods.gauss_hermite_expectation
    e2 = gh(lambda f: f**2, jnp.asarray(mu), jnp.asarray(v), 3)
    np.testing.assert_allclose(e2, mu**2 + v, rtol=1e-13)
    e4 = gh(lambda f: f**4, jnp.asarray(mu), jnp.asarray(v), 3)  # degree 4 <= 2 * 3 - 1
    np.testing.assert_allclose(e4, mu**4 + 6 * mu**2 * v + 3 * v**2, rtol=1e-12)
    ee = gh(jnp.exp, jnp.asarray(mu), jnp.asarray(v), 20)
    np.testing.assert_allclose(ee, np.exp(mu + v / 2), rtol=1e-13)


@pytest.mark.parametrize("v", [0.0, 1e-300, 1e-30, 1e-8, 0.7])
def test_gauss_hermite_variance_gradient_down_to_zero(v):
    """d/dv E[g(f)] = E[g''(f)] / 2 (Price's identity) holds down to v = 0: through
    sqrt(2 v) the chain rule gave 0 at v = 0 and 1e133 at v = 1e-300."""
    m = 0.3

    def e(m, v):
        return likelihoods.gauss_hermite_expectation(
            lambda f: f**2 + jnp.sin(f), jnp.asarray(m), jnp.asarray(v), 20
        )

    # E[f^2 + sin f] = m^2 + v + sin(m) exp(-v / 2)
    dv = jax.grad(e, argnums=1)(m, v)
    dm = jax.grad(e, argnums=0)(m, v)
    np.testing.assert_allclose(dv, 1.0 - 0.5 * np.sin(m) * np.exp(-v / 2), rtol=1e-13)
    np.testing.assert_allclose(dm, 2 * m + np.cos(m) * np.exp(-v / 2), rtol=1e-13)
    _, tangent = jax.jvp(e, (m, v), (0.5, 2.0))
    np.testing.assert_allclose(tangent, 0.5 * dm + 2.0 * dv, rtol=1e-13)


@pytest.mark.parametrize("v", [0.5, 20.0])
def test_gauss_hermite_gradient_is_the_values_derivative(v):
    """Away from v = 0 the gradient is the derivative of the quadrature's value (so an
    optimiser sees a consistent pair): Price's identity, taken by quadrature, differs from
    it by the quadrature's error (1.2% for a Bernoulli at v = 20)."""
    lik = likelihoods.Bernoulli()

    def e(v):
        return lik.variational_expectation(jnp.asarray(1.0), jnp.asarray(0.0), v)

    h = 1e-6 * v
    fd = (e(v + h) - e(v - h)) / (2 * h)
    np.testing.assert_allclose(jax.grad(e)(v), fd, rtol=1e-7)


def test_gauss_hermite_gradients_through_closed_over_parameters(rng):
    """The derivative rule also differentiates what ``fn`` closes over (a likelihood's
    learnable parameter): checked against finite differences, to second order."""
    mu, v = jnp.asarray(rng.standard_normal(4)), jnp.asarray(rng.uniform(0.1, 1.0, 4))
    y = jnp.asarray(rng.standard_normal(4))

    def e(s, mu, v):
        return jnp.sum(
            likelihoods.gauss_hermite_expectation(
                lambda f: -0.5 * ((y - f) / s) ** 2 - jnp.log(s), mu, v, 20
            )
        )

    # jitted: one program per derivative (eager, one per operation: 162 compilations); and
    # differentiating a jitted expectation that closes over a boolean y (Bernoulli) leaked
    # the y traced inside jit ("No constant handler for ... Tracer")
    check_grads(jax.jit(e), (1.3, mu, v), order=2, modes=("fwd", "rev"))
    check_grads(
        jax.jit(lambda m, v: likelihoods.Bernoulli().variational_expectation(y > 0, m, v)),
        (mu, v),
        order=2,
        modes=("fwd", "rev"),
    )


@pytest.mark.parametrize("lik", LIKS)
def test_variational_expectation_against_reference(rng, lik):
    n = 12
    mu, var = 1.5 * rng.standard_normal(n), rng.uniform(0.0, 2.0, n)
    _, y = _data(rng, lik, n)
    got = lik.variational_expectation(jnp.asarray(y), jnp.asarray(mu), jnp.asarray(var))
    np.testing.assert_allclose(got, _ve_np(lik, y, mu, var), rtol=1e-9, atol=1e-11)
    # the closed form of the Gaussian agrees with the quadrature of its log density
    if isinstance(lik, likelihoods.Gaussian):
        q = likelihoods.Likelihood.variational_expectation(lik, y, mu, var)
        np.testing.assert_allclose(q, got, rtol=1e-12)


@pytest.mark.slow
def test_more_points_converge(rng):
    """The Bernoulli quadrature's error falls geometrically with ``num_points`` (against
    adaptive quadrature); the default 20 points are within 1e-6 relative for latent
    variances up to 2."""
    n = 30
    mu, var = 1.5 * rng.standard_normal(n), rng.uniform(0.0, 2.0, n)
    y = (rng.uniform(size=n) < 0.5).astype(float)
    ref = _ve_np(likelihoods.Bernoulli(), y, mu, var)

    def err(lik):
        return np.max(np.abs(lik.variational_expectation(y, mu, var) - ref) / np.abs(ref))

    errs = [err(likelihoods.Bernoulli(k)) for k in (10, 20, 40, 60)]
    assert errs[3] < errs[2] < errs[1] < errs[0], errs
    assert err(likelihoods.Bernoulli()) == errs[1] < 1e-6, errs
    assert errs[3] < 1e-12, errs


def test_predictive_against_quadrature(rng):
    mu, var = rng.standard_normal(4), rng.uniform(0.1, 1.0, 4)

    def quad(g, m, v):
        def f(t):
            return np.exp(-0.5 * t * t) / np.sqrt(2 * np.pi) * g(m + np.sqrt(v) * t)

        return integrate.quad(f, -12, 12, epsabs=1e-14, epsrel=1e-13)[0]

    p, pv = likelihoods.Bernoulli().predict(jnp.asarray(mu), jnp.asarray(var))
    ref = np.array([quad(ndtr, m, v) for m, v in zip(mu, var, strict=True)])
    np.testing.assert_allclose(p, ref, rtol=1e-10)
    np.testing.assert_allclose(pv, ref * (1 - ref), rtol=1e-10)
    m, mv = likelihoods.Poisson().predict(jnp.asarray(mu), jnp.asarray(var))
    e1 = np.array([quad(np.exp, a, b) for a, b in zip(mu, var, strict=True)])
    e2 = np.array([quad(lambda f: np.exp(2 * f), a, b) for a, b in zip(mu, var, strict=True)])
    np.testing.assert_allclose(m, e1, rtol=1e-10)
    np.testing.assert_allclose(mv, e1 + e2 - e1**2, rtol=1e-9)  # E[Var] + Var[E]
    g, gv = likelihoods.Gaussian(0.3).predict(jnp.asarray(mu), jnp.asarray(var))
    np.testing.assert_allclose(g, mu)
    np.testing.assert_allclose(gv, var + 0.3)


def test_likelihoods_are_pytrees():
    g = likelihoods.Gaussian(0.5)
    assert jax.tree_util.tree_leaves(g) == [0.5]
    assert jax.tree_util.tree_leaves(likelihoods.Poisson(7)) == []
    p = jax.tree_util.tree_map(lambda x: x, likelihoods.Bernoulli(9))
    assert isinstance(p, likelihoods.Bernoulli) and p.num_points == 9
    grad = jax.grad(lambda lik: lik.variational_expectation(1.0, 0.0, 1.0))(g)
    assert isinstance(grad, likelihoods.Gaussian)


# ----------------------------------------------------------------------------- bound


@pytest.mark.parametrize("lik", LIKS)
@pytest.mark.parametrize("whiten", [True, False], ids=["whitened", "unwhitened"])
@pytest.mark.parametrize("c", [0.0, 0.4], ids=["zero_mean", "constant_mean"])
def test_elbo_against_numpy(rng, lik, whiten, c):
    model, ref = _random_model(rng, lik, whiten=whiten, c=c)
    X, y = _data(rng, lik, 20)
    got = model.elbo(X, y)
    want = elbo_np(ref, lik, X, y, num_data=50)
    np.testing.assert_allclose(float(got), want, rtol=TOL[np.float64])


@pytest.mark.parametrize("lik", LIKS)
def test_elbo_float32(rng, lik):
    with jax.enable_x64(False):
        model, ref = _random_model(rng, lik, dtype=np.float32)
        X, y = _data(rng, lik, 20)
        got = model.elbo(jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32))
        assert got.dtype == jnp.float32
    np.testing.assert_allclose(float(got), elbo_np(ref, lik, X, y, 50), rtol=TOL[np.float32])


@pytest.mark.slow_cases("bernoulli", "gaussian")
@pytest.mark.parametrize("lik", LIKS)
def test_whitened_and_unwhitened_agree(rng, lik):
    white, ref = _random_model(rng, lik, whiten=True)
    plain = SVGP(
        white.kernel,
        inducing=white.inducing,
        likelihood=lik,
        num_data=50,
        whiten=False,
        q_mu=ref["mu_u"],
        q_sqrt=ref["Su"],
        jitter=JITTER,
    )
    X, y = _data(rng, lik, 15)
    np.testing.assert_allclose(float(plain.elbo(X, y)), float(white.elbo(X, y)), rtol=1e-10)
    for a, b in zip(plain.predict(X), white.predict(X), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.slow
def test_minibatch_estimate_is_unbiased(rng):
    """The bound's minibatch estimates over a partition of the data average to the bound
    on the whole data (the data term is linear in the rows, the KL the same)."""
    lik = likelihoods.Poisson()
    model, _ = _random_model(rng, lik)
    X, y = _data(rng, lik, 50)
    whole = float(model.elbo(X, y))
    batches = gpchol.minibatches((X, y), 10, jax.random.PRNGKey(3), epochs=1)
    parts = [float(model.elbo(xb, yb)) for xb, yb in batches]
    assert len(parts) == 5
    np.testing.assert_allclose(np.mean(parts), whole, rtol=1e-12)


@pytest.mark.parametrize("whiten", [True, False], ids=["whitened", "unwhitened"])
def test_inducing_at_data_with_optimal_q_is_the_exact_lml(rng, whiten):
    """Gaussian likelihood, Z = X, q(u) = p(f | y): the bound equals log p(y) (then
    Q_ff = K_ff and KL(q || p(u | y)) = 0). A White part in the kernel keeps K_uu well
    conditioned without a jitter, so both models are exactly the same."""
    n, noise = 15, 0.05
    X, y = _data(rng, likelihoods.Gaussian(noise), n)
    kern = 1.3 * kernels.ExpSquared(0.7) + kernels.White(0.02)
    K = _k_np(X, X, 1.3, 0.7) + 0.02 * np.eye(n)
    A = np.linalg.solve(K + noise * np.eye(n), K)  # (K + s I)^-1 K
    mu_u, Sig = A.T @ y, K - K @ A
    Su = np.linalg.cholesky(0.5 * (Sig + Sig.T))
    if whiten:
        Lz = np.linalg.cholesky(K)
        mu_u, Su = np.linalg.solve(Lz, mu_u), np.linalg.solve(Lz, Su)
    model = SVGP(
        kern,
        inducing=X,
        likelihood=likelihoods.Gaussian(noise),
        num_data=n,
        whiten=whiten,
        q_mu=mu_u,
        q_sqrt=Su,
    )
    exact = gpchol.GaussianProcess(kern, X, noise=noise).log_marginal_likelihood(y)
    np.testing.assert_allclose(float(model.elbo(X, y)), float(exact), rtol=1e-10)


# ------------------------------------------------------ gradients and transformations


@pytest.mark.slow_cases(
    "unwhitened-bernoulli",
    "unwhitened-gaussian",
    "unwhitened-poisson",
    "whitened-bernoulli",
    "whitened-gaussian",
)
@pytest.mark.parametrize("lik", LIKS)
@pytest.mark.parametrize("whiten", [True, False], ids=["whitened", "unwhitened"])
def test_check_grads(rng, lik, whiten):
    # a jitter of 1e-2 keeps K_uu's condition number (and the finite differences' error)
    # small; the gradient at JITTER is checked against plain JAX in the next test
    model, _ = _random_model(rng, lik, M=5, whiten=whiten, jitter=1e-2)
    X, y = _data(rng, lik, 8)
    leaves, treedef = jax.tree_util.tree_flatten(model)

    def f(*leaves):
        return jax.tree_util.tree_unflatten(treedef, leaves).elbo(X, y)

    # central differences with a step of 1e-6: truncation error ~ 1e-12 times the third
    # derivative, rounding ~ 1e-10 |f|
    f = jax.jit(f)
    check_grads(f, leaves, order=1, modes=("rev", "fwd"), eps=1e-6, atol=1e-6, rtol=1e-6)


@pytest.mark.slow
def test_grad_against_jnp_reference(rng):
    """The gradient through gpchol's factor equals the gradient of the same bound written
    with jnp.linalg.cholesky and jnp.linalg.solve (plain JAX rules)."""
    lik = likelihoods.Gaussian(0.3)
    model, _ = _random_model(rng, lik)
    X, y = _data(rng, lik, 20)

    def plain(m):
        Z = m.inducing
        Kuu = m.kernel(Z, Z) + JITTER * jnp.eye(Z.shape[0])
        L = jnp.linalg.cholesky(Kuu)
        A = jnp.linalg.solve(L, m.kernel(Z, X))
        S = jnp.tril(m.q_sqrt)
        mean = A.T @ m.q_mu + m.mean(X)
        var = m.kernel.diag(X) - jnp.sum(A**2, 0) + jnp.sum((S.T @ A) ** 2, 0)
        s = m.likelihood.noise
        ve = -0.5 * (jnp.log(2 * jnp.pi * s) + ((y - mean) ** 2 + var) / s)
        kl = 0.5 * (jnp.sum(S**2) + m.q_mu @ m.q_mu - Z.shape[0]) - jnp.sum(
            jnp.log(jnp.abs(jnp.diagonal(S)))
        )
        return 50 / 20 * jnp.sum(ve) - kl

    np.testing.assert_allclose(float(model.elbo(X, y)), float(plain(model)), rtol=1e-12)
    g1 = jax.grad(lambda m: m.elbo(X, y))(model)
    g2 = jax.jit(jax.grad(plain))(model)
    for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g2), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)


@pytest.mark.slow
def test_jit_vmap_grad_compose(rng):
    lik = likelihoods.Bernoulli()
    model, _ = _random_model(rng, lik)
    X, y = _data(rng, lik, 16)
    eager = float(model.elbo(X, y))
    np.testing.assert_allclose(float(jax.jit(SVGP.elbo)(model, X, y)), eager, rtol=1e-12)
    # a batch of three models (stacked variational means) under vmap, jit and grad
    q = jnp.stack([model.q_mu, 2 * model.q_mu, -model.q_mu])
    batch = jax.tree_util.tree_map(lambda x: x, model)
    batch.q_mu = q
    axes = jax.tree_util.tree_map(lambda _: None, model)
    axes.q_mu = 0
    vals = jax.jit(jax.vmap(lambda m: m.elbo(X, y), in_axes=(axes,)))(batch)
    np.testing.assert_allclose(vals[0], eager, rtol=1e-12)
    for i in range(3):
        one = jax.tree_util.tree_map(lambda x: x, model)
        one.q_mu = q[i]
        np.testing.assert_allclose(vals[i], float(one.elbo(X, y)), rtol=1e-12)
    grads = jax.jit(jax.vmap(jax.grad(lambda m: m.elbo(X, y)), in_axes=(axes,)))(batch)
    g0 = jax.grad(lambda m: m.elbo(X, y))(model)
    np.testing.assert_allclose(grads.q_mu[0], g0.q_mu, rtol=1e-10)
    # minibatches under vmap: one model, a batch of minibatches
    vb = jax.vmap(lambda xb, yb: model.elbo(xb, yb))(X.reshape(2, 8, 2), y.reshape(2, 8))
    np.testing.assert_allclose(float(vb.mean()), eager, rtol=1e-12)


# ---------------------------------------------------------------- failure and bad input


@pytest.mark.slow
def test_failed_factor_gives_nan_and_status(rng):
    Z = np.repeat(rng.uniform(size=(3, 1)), 2, axis=0)  # duplicated inducing inputs
    lik = likelihoods.Gaussian(0.1)
    model = SVGP(kernels.ExpSquared(0.5), inducing=Z, likelihood=lik, num_data=10)
    X, y = _data(rng, lik, 10, d=1)
    value, status = jax.jit(SVGP.elbo_with_status)(model, X, y)
    assert np.isnan(value) and int(status) > 0
    assert np.isnan(model.elbo(X, y))
    with pytest.raises(gpchol.NotPositiveDefiniteError, match="inducing covariance"):
        model.elbo(X, y, check=True)
    with pytest.raises(gpchol.NotPositiveDefiniteError, match="jitter"):
        model.condition(check=True)
    post = model.condition()
    assert int(post.status) > 0 and np.all(np.isnan(post.mean(X)))
    # the jitter schedule: the first value that factors is used and reported
    fixed = SVGP(
        kernels.ExpSquared(0.5), inducing=Z, likelihood=lik, num_data=10, jitter=(0.0, 1e-6)
    )
    value, status = fixed.elbo_with_status(X, y)
    assert int(status) == 0 and np.isfinite(value)
    assert float(fixed.condition(check=True).jitter_used) == 1e-6


def _make(**kw):
    args = {
        "inducing": np.zeros((3, 2)) + np.arange(3)[:, None],
        "likelihood": likelihoods.Gaussian(0.1),
        "num_data": 10,
    }
    args.update(kw)
    return SVGP(kernels.ExpSquared(), **args)


BAD = [
    ({"likelihood": "gaussian"}, TypeError, "likelihood .* not supported"),
    ({"likelihood": likelihoods.Bernoulli}, TypeError, "likelihood must be an instance"),
    ({"likelihood": None}, TypeError, "likelihood"),
    (
        {"inducing": np.array([[0.0, np.nan], [1.0, 1.0]])},
        ValueError,
        r"inducing .* row\(s\) \[0\]",
    ),
    ({"inducing": np.array([[0.0, np.inf]])}, ValueError, "inducing .* NaN or inf"),
    ({"inducing": np.zeros((0, 2))}, ValueError, "inducing .* at least one row"),
    ({"inducing": np.zeros((2, 2, 2))}, ValueError, "inducing must have shape"),
    ({"num_data": 0}, ValueError, "num_data .* >= 1"),
    ({"num_data": 10.5}, TypeError, "num_data .* positive int"),
    ({"num_data": True}, TypeError, "num_data .* not a bool"),
    ({"q_mu": np.zeros(4)}, ValueError, r"q_mu must have shape \(3,\)"),
    ({"q_sqrt": np.eye(4)}, ValueError, r"q_sqrt must have shape \(3, 3\)"),
    ({"whiten": "yes"}, TypeError, "whiten"),
    ({"jitter": -1.0}, ValueError, "jitter"),
]


@pytest.mark.parametrize(("kw", "err", "match"), BAD)
def test_bad_arguments(kw, err, match):
    with pytest.raises(err, match=match):
        _make(**kw)


def test_bad_batches(rng):
    model = _make()
    X = rng.uniform(size=(5, 2))
    with pytest.raises(ValueError, match=r"inducing .* 2 column.* X has 3"):
        model.elbo(rng.uniform(size=(5, 3)), np.zeros(5))
    with pytest.raises(ValueError, match=r"inducing .* 2 column.* Xs has 1"):
        model.predict(np.zeros(4))
    with pytest.raises(ValueError, match=r"y must have shape \(5,\)"):
        model.elbo(X, np.zeros(4))
    with pytest.raises(ValueError, match="0 or 1"):
        _make(likelihood=likelihoods.Bernoulli()).elbo(X, np.array([0, 1, 2, 0, 1.0]))
    with pytest.raises(ValueError, match="non-negative integer counts"):
        _make(likelihood=likelihoods.Poisson()).elbo(X, np.array([0, 1, 2.5, 0, 1]))
    with pytest.raises(ValueError, match="check=True"):
        jax.jit(lambda m: m.elbo(X, np.zeros(5), check=True))(model)
    with pytest.raises(ValueError, match=r"num_points .* >= 1"):
        likelihoods.Bernoulli(0)
    with pytest.raises(TypeError, match="num_points"):
        likelihoods.Poisson(2.0)


# ---------------------------------------------------------------------------- minibatches


@pytest.mark.parametrize(("n", "b"), [(10, 3), (12, 4), (7, 7), (5, 1)])
def test_minibatches_cover_every_row_once_per_epoch(n, b):
    X = np.arange(2 * n, dtype=float).reshape(n, 2)
    y = np.arange(n, dtype=float)
    key = jax.random.PRNGKey(1)
    batches = list(gpchol.minibatches((X, y), b, key, epochs=2, drop_last=False))
    per_epoch = -(-n // b)
    assert len(batches) == 2 * per_epoch
    for e in range(2):
        rows = np.concatenate([yb for _, yb in batches[e * per_epoch : (e + 1) * per_epoch]])
        assert sorted(rows.tolist()) == list(range(n))  # every row exactly once
    for xb, yb in batches:  # the same rows of each array
        np.testing.assert_array_equal(xb, X[yb.astype(int)])
    # drop_last: fixed shapes, n // b batches per epoch, no row twice within an epoch
    fixed = list(gpchol.minibatches({"x": X, "y": y}, b, key, epochs=3))
    assert len(fixed) == 3 * (n // b)
    assert all(bt["x"].shape == (b, 2) and bt["y"].shape == (b,) for bt in fixed)
    for e in range(3):
        rows = np.concatenate([bt["y"] for bt in fixed[e * (n // b) : (e + 1) * (n // b)]])
        assert len(set(rows.tolist())) == rows.size
    # the order differs between epochs (n > 3) and is a function of the key alone
    again = list(gpchol.minibatches({"x": X, "y": y}, b, key, epochs=3))
    for a, c in zip(fixed, again, strict=True):
        np.testing.assert_array_equal(a["y"], c["y"])
    other = list(gpchol.minibatches({"x": X, "y": y}, b, jax.random.PRNGKey(2), epochs=3))
    if n > 3:
        assert any(not np.array_equal(a["y"], c["y"]) for a, c in zip(fixed, other, strict=True))


def test_minibatches_endless_and_types():
    X = jnp.arange(6.0)
    it = gpchol.minibatches(X, 4, 0)  # an int seed, one array, no end
    got = [next(it) for _ in range(5)]
    assert all(isinstance(g, jax.Array) and g.shape == (4,) for g in got)
    it = gpchol.minibatches([np.arange(6.0)], 2, 0, epochs=1)
    assert all(isinstance(g[0], np.ndarray) for g in it)


@pytest.mark.parametrize(
    ("args", "kw", "err", "match"),
    [
        ((np.zeros(5), 0), {}, ValueError, "batch_size .* >= 1"),
        ((np.zeros(5), 2.0), {}, TypeError, "batch_size .* positive int"),
        ((np.zeros(5), True), {}, TypeError, "batch_size .* not a bool"),
        ((np.zeros(5), "8"), {}, TypeError, "batch_size"),
        ((np.zeros(5), 6), {}, ValueError, r"batch_size \(6\) is larger than the number of rows"),
        ((np.zeros(5), 2), {"epochs": 0}, ValueError, "epochs .* >= 1"),
        (((np.zeros(5), np.zeros(4)), 2), {}, ValueError, "same number of rows"),
        (((), 2), {}, ValueError, "at least one array"),
    ],
)
def test_minibatches_bad_input(args, kw, err, match):
    with pytest.raises(err, match=match):
        gpchol.minibatches(*args, jax.random.PRNGKey(0), **kw)


# ------------------------------------------------------------------ training with optax


def _train(model, X, y, *, steps, batch, lr, key=0, train_inducing=True):
    t = model.default_transforms()
    u = gpchol.to_unconstrained(model, t)
    opt = optax.adam(lr)
    state = opt.init(u)

    @jax.jit
    def step(u, state, Xb, yb):
        def loss(u):
            m = gpchol.to_constrained(u, t)
            if not train_inducing:
                m.inducing = jax.lax.stop_gradient(m.inducing)
            return -m.elbo(Xb, yb)

        value, grad = jax.value_and_grad(loss)(u)
        updates, state = opt.update(grad, state, u)
        return optax.apply_updates(u, updates), state, value

    values = []
    batches = gpchol.minibatches((X, y), batch, jax.random.PRNGKey(key))
    for _, (Xb, yb) in zip(range(steps), batches, strict=False):
        u, state, value = step(u, state, Xb, yb)
        values.append(float(value))
    return gpchol.to_constrained(u, t), values


@pytest.mark.slow
def test_bernoulli_classification_fit(rng):
    n = 600
    X = rng.uniform(-3.0, 3.0, (n, 2))
    f = np.sin(X[:, 0]) * 2.0 + X[:, 1]
    y = (f > 0).astype(float)
    flip = rng.uniform(size=n) < 0.05
    y[flip] = 1 - y[flip]
    model = SVGP(
        kernels.ExpSquared(1.0),
        inducing=X[:16],
        likelihood=likelihoods.Bernoulli(),
        num_data=n,
        jitter=1e-6,
    )
    model, values = _train(model, X, y, steps=400, batch=64, lr=0.05)
    assert np.mean(values[-50:]) < np.mean(values[:50])  # the loss (-elbo) fell
    Xt = rng.uniform(-3.0, 3.0, (400, 2))
    ft = np.sin(Xt[:, 0]) * 2.0 + Xt[:, 1]
    p, _ = model.predict_y(Xt)
    acc = np.mean((np.asarray(p) > 0.5) == (ft > 0))
    assert acc > 0.9, acc


@pytest.mark.slow
def test_poisson_fit_recovers_a_known_rate(rng):
    n, rate = 500, 4.0
    X = rng.uniform(0.0, 1.0, (n, 1))
    y = rng.poisson(rate, n).astype(float)
    model = SVGP(
        kernels.ExpSquared(0.5),
        inducing=np.linspace(0.0, 1.0, 6)[:, None],
        likelihood=likelihoods.Poisson(),
        num_data=n,
        jitter=1e-6,
    )
    model, _ = _train(model, X, y, steps=400, batch=100, lr=0.05, train_inducing=False)
    m, _ = model.predict_y(np.linspace(0.05, 0.95, 10)[:, None])
    # the sample mean's standard error is sqrt(4 / 500) = 0.09
    np.testing.assert_allclose(m, np.mean(y), rtol=0.08)
    np.testing.assert_allclose(np.mean(m), rate, rtol=0.08)


# ---------------------------------------------------------------------------- prediction


@pytest.mark.slow_cases("whitened")
@pytest.mark.parametrize("whiten", [True, False], ids=["whitened", "unwhitened"])
def test_prediction_against_numpy(rng, whiten):
    lik = likelihoods.Poisson()
    model, ref = _random_model(rng, lik, whiten=whiten, c=0.3)
    Xs = rng.uniform(-1.0, 1.0, (11, 2))
    mean, var, *_ = _marginals_np(ref, Xs)
    post = model.condition()
    m, v = post.mean_and_variance(Xs, block_size=4)  # blocks of 4, the last padded
    np.testing.assert_allclose(m, mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(v, var, rtol=1e-9, atol=1e-12)
    m1, v1 = model.predict(Xs)
    np.testing.assert_allclose(m1, m, rtol=1e-12)
    np.testing.assert_allclose(v1, v, rtol=1e-12)
    C = post.covariance(Xs)
    np.testing.assert_allclose(np.diagonal(C), var, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(post.mean(Xs), mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(post.variance(Xs), var, rtol=1e-9, atol=1e-12)
    py, _ = model.predict_y(Xs)
    np.testing.assert_allclose(py, np.exp(mean + var / 2), rtol=1e-9)
    s = post.sample(jax.random.PRNGKey(0), Xs, 4000)
    assert s.shape == (4000, 11)
    np.testing.assert_allclose(np.mean(s, 0), mean, atol=5 * np.sqrt(var.max() / 4000))
    assert jax.jit(lambda p, x: p.mean_and_variance(x))(post, Xs)[0].shape == (11,)


@pytest.mark.slow
def test_full_batch_fit_with_gpchol_fit(rng):
    """gpchol.fit minimises the negative whole-data bound like any loss (L-BFGS), the
    model itself being the parameter pytree."""
    lik = likelihoods.Gaussian(0.5)
    X, y = _data(rng, lik, 60, d=1)
    model = SVGP(kernels.ExpSquared(1.0), inducing=X[:8], likelihood=lik, num_data=60, jitter=1e-6)
    res = gpchol.fit(
        lambda m: -m.elbo(X, y),
        model,
        transforms=model.default_transforms(),
        steps=30,
        progress=False,
    )
    assert isinstance(res.params, SVGP)
    assert float(res.params.elbo(X, y)) > float(model.elbo(X, y)) + 10.0
    assert 0.0 < float(res.params.likelihood.noise) < 0.1  # the data's noise is 0.1^2


@pytest.mark.slow
def test_benchmark_function_runs():
    """benchmarks/bench_svgp.py's function at a tiny size (no time is checked)."""
    from benchmarks.bench_svgp import svgp_steps_per_second

    rec = svgp_steps_per_second(2000, 16, 64, steps=2, repeats=1)
    assert rec["steps_per_second"] > 0 and np.isfinite(rec["final_loss"])
    assert (rec["n"], rec["M"], rec["batch"]) == (2000, 16, 64)


@pytest.mark.parametrize("whiten", [True, False], ids=["whitened", "unwhitened"])
def test_optimal_q_gives_the_collapsed_bound(rng, whiten):
    """Gaussian likelihood, M < n, Titsias's optimal q(u) = N(K_uu Sig^-1 K_uf y / s,
    K_uu Sig^-1 K_uu), Sig = K_uu + K_uf K_fu / s: the bound is the collapsed one,
    log N(y | 0, Q_ff + s I) - tr(K_ff - Q_ff) / (2 s) (Titsias 2009), written here with
    dense NumPy; and SGPR's (gpchol.SparseGP) where it exists."""
    n, M, s = 40, 6, 0.3
    lik = likelihoods.Gaussian(s)
    X, y = _data(rng, lik, n)
    Z = rng.uniform(-1.0, 1.0, (M, 2))
    kern = 1.3 * kernels.ExpSquared(0.7)
    Kuu = _k_np(Z, Z, 1.3, 0.7) + JITTER * np.eye(M)
    Kuf = _k_np(Z, X, 1.3, 0.7)
    Sig = Kuu + Kuf @ Kuf.T / s
    mu_u = Kuu @ np.linalg.solve(Sig, Kuf @ y) / s
    Su = np.linalg.cholesky(Kuu @ np.linalg.solve(Sig, Kuu))
    if whiten:
        Lz = np.linalg.cholesky(Kuu)
        mu_u, Su = np.linalg.solve(Lz, mu_u), np.linalg.solve(Lz, Su)
    model = SVGP(
        kern,
        inducing=Z,
        likelihood=lik,
        num_data=n,
        whiten=whiten,
        q_mu=mu_u,
        q_sqrt=Su,
        jitter=JITTER,
    )
    Qff = Kuf.T @ np.linalg.solve(Kuu, Kuf)
    C = Qff + s * np.eye(n)
    collapsed = (
        -0.5 * y @ np.linalg.solve(C, y)
        - 0.5 * np.linalg.slogdet(C)[1]
        - 0.5 * n * np.log(2 * np.pi)
        - 0.5 * (n * 1.3 - np.trace(Qff)) / s
    )
    got = float(model.elbo(X, y))
    np.testing.assert_allclose(got, collapsed, rtol=1e-8)
    if hasattr(gpchol, "SparseGP"):
        sgpr = gpchol.SparseGP(kern, X, inducing=Z, noise=s, jitter=JITTER)
        np.testing.assert_allclose(got, float(sgpr.elbo(y)), rtol=1e-8)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="counts the CPU LAPACK calls")
def test_one_triangular_solve_per_prediction_block(rng):
    """The solver's projection and prior term both need A = L_z^-1 k(Z, xb): the compiled
    block holds one triangular solve (XLA merges the two), not two."""
    import collections
    import re

    from gpchol._internal import posterior_core_module as core

    model, _ = _random_model(rng, likelihoods.Bernoulli())
    post = model.condition()
    Xs = jnp.asarray(rng.uniform(-1.0, 1.0, (64, 2)))
    for b in (64, 32):
        text = (
            core.predict_program.lower(
                model.solver(post.L), Xs, None, jnp.zeros(()), want_var=True, b=b
            )
            .compile()
            .as_text()
        )
        calls = collections.Counter(re.findall(r'custom_call_target="([^"]+)"', text))
        assert sum(v for k, v in calls.items() if "trsm" in k) == 1, calls


def test_poisson_expectation_is_exact_at_large_variances():
    """The Poisson expected log likelihood is its closed form at every latent variance (20
    quadrature points were 97 % off at v = 100)."""

    y = np.array([0.0, 3.0, 7.0, 1.0])
    mu = np.array([0.5, -1.0, 2.0, 0.0])
    for v in (0.0, 1.0, 25.0, 100.0):
        var = np.full(4, v)
        got = np.asarray(likelihoods.Poisson().variational_expectation(y, mu, var))
        want = y * mu - np.exp(mu + v / 2) - gammaln(y + 1.0)
        np.testing.assert_allclose(got, want, rtol=1e-13)


def test_bad_inputs_and_integer_variational_parameters():
    """From a review: an inf row of X gave a finite, wrong ELBO (predict refused it); a
    zero or negative Gaussian noise gave NaN without a word; integer q_mu/q_sqrt stayed
    integer leaves (jax.grad refused them); repr of a tree_map'd model raised."""
    X = np.linspace(0, 1, 10)[:, None]
    y = np.sin(X[:, 0])

    def model(noise=0.1, **kw):
        return SVGP(
            kernels.ExpSquared(0.3),
            inducing=X[::3],
            likelihood=likelihoods.Gaussian(noise),
            num_data=10,
            **kw,
        )

    bad = X.copy()
    bad[2, 0] = np.inf
    with pytest.raises(ValueError, match=r"X has NaN or inf in row\(s\) \[2\]"):
        model().elbo(bad, y)
    for noise in (0.0, -0.1, np.nan):
        with pytest.raises(ValueError, match=r"noise .* must be finite and > 0"):
            model(noise).elbo(X, y)
    ints = model(q_mu=[0, 0, 0, 0], q_sqrt=np.eye(4, dtype=int))
    floats = model(q_mu=np.zeros(4), q_sqrt=np.eye(4))
    g_int, g_float = jax.grad(SVGP.elbo)(ints, X, y), jax.grad(SVGP.elbo)(floats, X, y)
    np.testing.assert_allclose(g_int.q_mu, g_float.q_mu, rtol=1e-12)
    np.testing.assert_allclose(g_int.q_sqrt, g_float.q_sqrt, rtol=1e-12)
    assert "M=None" in repr(jax.tree.map(lambda a: jnp.abs(a).max(), g_float))
    assert np.isfinite(jax.jit(SVGP.elbo)(model(), X, y))  # a traced noise is not read


def test_a_batch_larger_than_num_data_is_refused():
    X = np.linspace(0, 1, 10)[:, None]
    m = SVGP(
        kernels.ExpSquared(0.3), inducing=X[::3], likelihood=likelihoods.Gaussian(0.1), num_data=5
    )
    with pytest.raises(ValueError, match="minibatch has 10 rows but num_data = 5"):
        m.elbo(X, np.sin(X[:, 0]))
