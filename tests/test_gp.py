"""GaussianProcess: log marginal likelihood, its gradient, the posterior, transformations.

References are float64 NumPy/SciPy formulas (R&W 2006, Alg. 2.1); gradients are checked
against central finite differences of the NumPy likelihood, wrt every hyperparameter.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg as sla

from gpchol import GaussianProcess, NotPositiveDefiniteError, Posterior, kernels

# ------------------------------------------------------------------ NumPy references


def np_kernel(p, A, B):
    """a1 ExpSquared(ARD ls) + a2 RQ(ls_rq, alpha) * Periodic(ls_p, period) on 2-D inputs."""
    d = (A[:, None, :] - B[None, :, :]) / p["ls"]
    k1 = p["a1"] * np.exp(-0.5 * np.sum(d**2, -1))
    r2 = np.sum((A[:, None, :] - B[None, :, :]) ** 2, -1) / p["ls_rq"] ** 2
    rq = (1.0 + r2 / (2.0 * p["alpha"])) ** (-p["alpha"])
    s = np.sum(np.sin(np.pi * (A[:, None, :] - B[None, :, :]) / p["period"]) ** 2, -1)
    per = np.exp(-2.0 * s / p["ls_p"] ** 2)
    return k1 + p["a2"] * rq * per


def jax_kernel(p):
    return p["a1"] * kernels.ExpSquared(p["ls"]) + p["a2"] * (
        kernels.RationalQuadratic(p["ls_rq"], p["alpha"])
        * kernels.Periodic(lengthscale=p["ls_p"], period=p["period"])
    )


def np_lml(p, X, y):
    n = X.shape[0]
    K = np_kernel(p, X, X) + np.diag(np.broadcast_to(p["noise"], (n,)))
    L = np.linalg.cholesky(K)
    r = y - p["mean"]
    a = sla.cho_solve((L, True), r)
    return -0.5 * r @ a - np.sum(np.log(np.diag(L))) - 0.5 * n * np.log(2 * np.pi)


def make_params(rng, n, hetero=False):
    return {
        "a1": 1.3,
        "ls": np.array([0.7, 1.4]),
        "a2": 0.6,
        "ls_rq": 0.9,
        "alpha": 1.7,
        "ls_p": 1.1,
        "period": 2.3,
        "noise": rng.uniform(0.05, 0.3, n) if hetero else 0.12,
        "mean": 0.4,
    }


def build(p, X):
    return GaussianProcess(jax_kernel(p), X, noise=p["noise"], mean=p["mean"])


@pytest.fixture
def data(rng):
    n = 40
    X = rng.uniform(-2, 2, (n, 2))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(n)
    return X, y


# ------------------------------------------------------------------------ likelihood


@pytest.mark.parametrize("hetero", [False, True], ids=["scalar-noise", "per-point-noise"])
def test_lml_matches_numpy(rng, data, hetero):
    X, y = data
    p = make_params(rng, X.shape[0], hetero)
    got = float(build(p, X).log_marginal_likelihood(y))
    np.testing.assert_allclose(got, np_lml(p, X, y), rtol=1e-11, atol=1e-10)


@pytest.mark.parametrize("hetero", [False, True], ids=["scalar-noise", "per-point-noise"])
def test_lml_gradient_every_hyperparameter(rng, data, hetero):
    X, y = data
    p = make_params(rng, X.shape[0], hetero)
    jp = jax.tree_util.tree_map(jnp.asarray, p)
    g = jax.jit(jax.grad(lambda q: build(q, X).log_marginal_likelihood(y)))(jp)
    h = 1e-6
    for name, value in p.items():
        v = np.atleast_1d(np.asarray(value, np.float64))
        for i in range(v.size):
            up, dn = dict(p), dict(p)
            vu, vd = v.copy(), v.copy()
            vu[i] += h
            vd[i] -= h
            up[name] = vu.reshape(np.shape(value))
            dn[name] = vd.reshape(np.shape(value))
            fd = (np_lml(up, X, y) - np_lml(dn, X, y)) / (2 * h)
            got = float(np.atleast_1d(np.asarray(g[name]))[i])
            np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-6, err_msg=f"{name}[{i}]")


def test_lml_gradient_equals_jax_cholesky_autodiff(rng, data):
    X, y = data
    p = jax.tree_util.tree_map(jnp.asarray, make_params(rng, X.shape[0]))

    def ref(q):
        n = X.shape[0]
        K = jax_kernel(q)(X, X) + q["noise"] * jnp.eye(n)
        L = jnp.linalg.cholesky(K)
        r = y - q["mean"]
        a = jax.scipy.linalg.cho_solve((L, True), r)
        return -0.5 * r @ a - jnp.sum(jnp.log(jnp.diag(L))) - 0.5 * n * jnp.log(2 * jnp.pi)

    g = jax.grad(lambda q: build(q, X).log_marginal_likelihood(y))(p)
    g_ref = jax.jit(jax.grad(ref))(p)
    for name in p:
        np.testing.assert_allclose(g[name], g_ref[name], rtol=1e-9, atol=1e-10, err_msg=name)


def test_gradient_goes_through_gpchol_rules(rng):
    X = rng.uniform(-2, 2, (150, 2))  # n >= 128: K^-1 by LAPACK potri on the CPU
    y = np.sin(X[:, 0])
    n = X.shape[0]

    def lml(ls):
        return GaussianProcess(kernels.ExpSquared(ls), X, noise=0.1).log_marginal_likelihood(y)

    from gpchol._internal import cpu_ffi

    hlo = jax.jit(jax.grad(lml)).lower(1.0).compile().as_text()
    # on the CPU the factor, the solves and K^-1 are host LAPACK calls: gpchol's compiled
    # FFI handlers, no Python callback (issue 14)
    hits = [ln.strip()[:300] for ln in hlo.splitlines() if "callback" in ln.lower()]
    assert not hits, hits
    if cpu_ffi.cpu_unavailable_reason() is None:
        assert "gpchol_cpu_" in hlo
    # JAX's own Cholesky rule would transpose its JVP with n x n triangular solves; the
    # whole-likelihood rule solves only with the data vector
    solves = [ln for ln in hlo.splitlines() if "trsm" in ln and "custom-call(" in ln]
    assert not any(f"[{n},{n}]" in ln.split("custom-call(")[0] for ln in solves)


def test_gradient_wrt_the_gp_pytree(data):
    X, y = data
    gp = GaussianProcess(0.5 * kernels.Matern32(0.8), X, noise=0.2, mean=0.1)
    g = jax.grad(lambda m: m.log_marginal_likelihood(y))(gp)
    assert isinstance(g, GaussianProcess)
    assert np.isfinite(float(g.kernel.amplitude)) and np.isfinite(float(g.noise))
    assert g.X.shape == X.shape


@pytest.mark.slow
@pytest.mark.parametrize("n", [300, 513])
def test_lean_core_matches_jax_default_rules(rng, n):
    """n > 256: the kernel contraction over tiles of the lower triangle (n = 300: three
    even tiles of 100; n = 513: five of 103, the last shifted back and masked) and LAPACK
    potri; the gradient wrt the whole GP pytree (ARD lengthscales, amplitude, per-point
    noise, the inputs X, the mean) equals JAX's own rules, in reverse and forward mode."""
    X = rng.uniform(-2, 2, (n, 2))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(n)
    kern = 0.7 * kernels.Matern52(np.array([0.6, 1.3])) + kernels.ExpSquared(0.4)
    gp = GaussianProcess(kern, X, noise=0.05 + 0.1 * rng.uniform(size=n), mean=0.2)

    def lml_ref(m):
        K = m.covariance_matrix()
        L = jnp.linalg.cholesky(K)
        r = y - m.mean_vector()
        z = jax.scipy.linalg.solve_triangular(L, r, lower=True)
        return -0.5 * z @ z - jnp.sum(jnp.log(jnp.diag(L))) - 0.5 * n * np.log(2 * np.pi)

    v, g = jax.jit(jax.value_and_grad(lambda m: m.log_marginal_likelihood(y)))(gp)
    v_ref, g_ref = jax.jit(jax.value_and_grad(lml_ref))(gp)
    assert abs(float(v) - float(v_ref)) <= 1e-10 * abs(float(v_ref))
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-9 * np.abs(b).max())
    # forward mode along one direction equals the reverse-mode gradient's projection
    d = jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(np.shape(x))), gp)
    _, t = jax.jvp(lambda m: m.log_marginal_likelihood(y), (gp,), (d,))
    leaves = zip(jax.tree.leaves(g), jax.tree.leaves(d), strict=True)
    proj = sum(jnp.vdot(a, b) for a, b in leaves)
    np.testing.assert_allclose(t, proj, rtol=1e-8)


@pytest.mark.slow
def test_lean_core_failure_and_float32(rng):
    """n >= 128 on the CPU: LAPACK's own pivot as status, NaN value; float32 works."""
    n = 150
    X = rng.uniform(-2, 2, (n, 2))
    y = np.sin(X[:, 0])
    # identical inputs, no noise: rank one, the second pivot is exactly zero
    gp = GaussianProcess(kernels.ExpSquared(0.5), np.zeros((n, 1)), noise=0.0)
    v, status = jax.jit(lambda g: g.log_marginal_likelihood_with_status(y))(gp)
    assert np.isnan(float(v))
    assert int(status) == sla.lapack.dpotrf(np.asarray(gp.covariance_matrix()), lower=1)[1] == 2
    with pytest.raises(NotPositiveDefiniteError):
        gp.log_marginal_likelihood(y, check=True)
    g32 = GaussianProcess(kernels.ExpSquared(np.float32(0.5)), X.astype(np.float32), noise=0.1)
    v32, g = jax.value_and_grad(lambda m: m.log_marginal_likelihood(y.astype(np.float32)))(g32)
    v64 = GaussianProcess(kernels.ExpSquared(0.5), X, noise=0.1).log_marginal_likelihood(y)
    assert v32.dtype == np.float32 and abs(float(v32) - float(v64)) < 1e-3 * abs(float(v64))
    assert np.isfinite(float(g.kernel.lengthscale))


@pytest.mark.slow_cases(
    "one-value-host-lapack",
    "schedule-retries-twice-host-lapack",
    "schedule-retries-twice-xla-factor",
)
@pytest.mark.parametrize("n", [40, 150], ids=["xla-factor", "host-lapack"])
@pytest.mark.parametrize(
    "jitter, kept",
    [((0.0, 0.0, 1e-3, 1.0), 1e-3), (0.05, 0.05)],
    ids=["schedule-retries-twice", "one-value"],
)
def test_jitter_in_the_lean_core(rng, n, jitter, kept):
    """A jitter schedule: the first value that factors is kept (earlier ones fail), and
    value and gradient are those of ``K + kept I`` by JAX's own rules, under jit, for both
    factor paths (XLA in place below 128 rows, host LAPACK)."""
    X = rng.uniform(-2, 2, (n, 2))
    X[1] = X[0]  # the first two inputs equal, amplitude 4, no noise: pivot 2 is 4 - 2 * 2 = 0
    y = np.cos(X[:, 1]) + 0.1 * rng.standard_normal(n)
    kern = 4.0 * kernels.Matern52(np.array([0.7, 1.2]))
    gp = GaussianProcess(kern, X, noise=0.0, mean=0.1, jitter=jitter)
    assert np.all(np.asarray(gp.covariance_matrix())[:2, :2] == 4.0)

    def lml_ref(m):
        K = m.covariance_matrix() + kept * jnp.eye(n)
        L = jnp.linalg.cholesky(K)
        z = jax.scipy.linalg.solve_triangular(L, y - m.mean_vector(), lower=True)
        return -0.5 * z @ z - jnp.sum(jnp.log(jnp.diag(L))) - 0.5 * n * np.log(2 * np.pi)

    f = jax.jit(jax.value_and_grad(lambda m: m.log_marginal_likelihood_with_status(y)[0]))
    v, g = f(gp)
    v_ref, g_ref = jax.jit(jax.value_and_grad(lml_ref))(gp)
    assert np.isfinite(float(v_ref))
    np.testing.assert_allclose(float(v), float(v_ref), rtol=1e-10)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-9 * np.abs(b).max())
    assert float(gp.factor()[2]) == kept
    # without the jitter the same GP fails (so the schedule really retried)
    bare = GaussianProcess(kern, X, noise=0.0, mean=0.1)
    assert int(bare.log_marginal_likelihood_with_status(y)[1]) == 2


@pytest.mark.slow
def test_status_agrees_with_factor_when_every_jitter_fails(rng):
    """n >= 128 on the CPU (host LAPACK path), float32, every jitter too small: the
    likelihood reports the same pivot as ``factor()`` (the exact search), also under vmap
    with one failing and one positive-definite GP.

    Each input twice and no noise: K is singular, and in float32 ``1 + 1e-9 == 1``, so
    each attempt factors the same K; where rounding makes its first failing pivot differ
    between LAPACK and the search, only the search's is reported."""
    n = 200
    X = np.repeat(rng.uniform(-2, 2, (n // 2, 2)), 2, axis=0).astype(np.float32)
    y = np.sin(X[:, 0]).astype(np.float32)
    gp = GaussianProcess(
        kernels.ExpSquared(np.float32(1.0)), X, noise=np.float32(0.0), jitter=(0.0, 1e-30, 1e-9)
    )
    d = np.diagonal(np.asarray(gp.covariance_matrix()))
    assert np.array_equal(d + np.float32(1e-9), d)
    v, status = jax.jit(lambda g: g.log_marginal_likelihood_with_status(y))(gp)
    assert np.isnan(float(v)) and int(status) >= 1
    assert int(status) == int(gp.factor()[1])

    def lml(noise):
        g = GaussianProcess(kernels.ExpSquared(np.float32(1.0)), X, noise=noise)
        return g.log_marginal_likelihood_with_status(y)

    v2, s2 = jax.jit(jax.vmap(lml))(jnp.array([0.0, 0.5], jnp.float32))
    assert np.isnan(float(v2[0])) and int(s2[0]) >= 1 and int(s2[1]) == 0
    ok = GaussianProcess(kernels.ExpSquared(np.float32(1.0)), X, noise=np.float32(0.5))
    np.testing.assert_allclose(float(v2[1]), float(ok.log_marginal_likelihood(y)), rtol=1e-5)


# ------------------------------------------------------------------------- posterior


def test_posterior_against_closed_form(rng, data):
    X, y = data
    p = make_params(rng, X.shape[0], hetero=True)
    Xs = rng.uniform(-2.5, 2.5, (7, 2))
    post = build(p, X).condition(y)
    assert isinstance(post, Posterior)
    K = np_kernel(p, X, X) + np.diag(p["noise"])
    Ks = np_kernel(p, X, Xs)
    Kss = np_kernel(p, Xs, Xs)
    mean = p["mean"] + Ks.T @ np.linalg.solve(K, y - p["mean"])
    cov = Kss - Ks.T @ np.linalg.solve(K, Ks)
    np.testing.assert_allclose(post.mean(Xs), mean, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(post.covariance(Xs), cov, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(post.variance(Xs), np.diag(cov), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(float(post.log_marginal_likelihood), np_lml(p, X, y), rtol=1e-11)
    # predictive variance at the training inputs adds each point's own noise
    var_y = post.variance(include_noise=True)
    Kx = np_kernel(p, X, X)
    cov_tr = Kx - Kx @ np.linalg.solve(K, Kx)
    np.testing.assert_allclose(var_y, np.diag(cov_tr) + p["noise"], rtol=1e-7, atol=1e-10)


def test_posterior_samples(rng, data):
    X, y = data
    gp = GaussianProcess(kernels.ExpSquared(1.0), X, noise=0.05)
    post = gp.condition(y)
    Xs = rng.uniform(-1, 1, (5, 2))
    s = post.sample(jax.random.PRNGKey(1), Xs, 4000)
    assert s.shape == (4000, 5)
    sd = np.sqrt(np.asarray(post.variance(Xs)))
    np.testing.assert_allclose(s.mean(0), post.mean(Xs), atol=5 * sd.max() / np.sqrt(4000) + 1e-6)
    np.testing.assert_allclose(s.std(0), sd, rtol=0.1, atol=1e-6)


# ------------------------------------------------------------------ transformations


def test_jit_and_grad_agree_with_eager(data):
    X, y = data

    def f(ls, noise):
        return GaussianProcess(kernels.Matern52(ls), X, noise=noise).log_marginal_likelihood(y)

    v = f(0.9, 0.1)
    np.testing.assert_allclose(jax.jit(f)(0.9, 0.1), v, rtol=1e-12)
    g = jax.grad(f, argnums=(0, 1))(0.9, 0.1)
    gj = jax.jit(jax.grad(f, argnums=(0, 1)))(0.9, 0.1)
    np.testing.assert_allclose(np.array(gj), np.array(g), rtol=1e-10)


@pytest.mark.slow
def test_vmap_over_a_batch_of_gps(rng):
    B, n = 4, 25
    Xb = rng.uniform(-2, 2, (B, n, 1))
    yb = np.sin(3 * Xb[..., 0]) + 0.1 * rng.standard_normal((B, n))
    lsb = np.array([0.3, 0.6, 1.0, 2.0])
    nzb = np.array([0.01, 0.05, 0.1, 0.2])

    def one(X, y, ls, nz):
        gp = GaussianProcess(2.0 * kernels.ExpSquared(ls), X, noise=nz)
        return gp.log_marginal_likelihood(y), gp.condition(y).mean(jnp.zeros((1, 1)))[0]

    lml, m0 = jax.jit(jax.vmap(one))(Xb, yb, lsb, nzb)
    for b in range(B):
        ref_l, ref_m = one(Xb[b], yb[b], lsb[b], nzb[b])
        np.testing.assert_allclose(lml[b], ref_l, rtol=1e-10)
        np.testing.assert_allclose(m0[b], ref_m, rtol=1e-9, atol=1e-12)
    # a batched GP object through vmap (pytree in_axes)
    gps = jax.vmap(lambda X, ls: GaussianProcess(kernels.ExpSquared(ls), X, noise=0.1))(Xb, lsb)
    lml2 = jax.vmap(lambda g, y: g.log_marginal_likelihood(y))(gps, yb)
    g = jax.grad(
        lambda ls: jnp.sum(
            jax.vmap(
                lambda X, y, l: GaussianProcess(
                    kernels.ExpSquared(l), X, noise=0.1
                ).log_marginal_likelihood(y)
            )(Xb, yb, ls)
        )
    )(lsb)
    assert lml2.shape == (B,) and g.shape == (B,) and np.all(np.isfinite(g))


def test_float32(data):
    X, y = data
    gp = GaussianProcess(kernels.ExpSquared(1.0), X.astype(np.float32), noise=np.float32(0.1))
    v = gp.log_marginal_likelihood(y.astype(np.float32))
    assert v.dtype == jnp.float32
    ref = GaussianProcess(kernels.ExpSquared(1.0), X, noise=0.1).log_marginal_likelihood(y)
    np.testing.assert_allclose(float(v), float(ref), rtol=1e-4)


# ---------------------------------------------------------------- failure and input


def test_not_positive_definite_nan_in_jit_and_error_outside():
    X = jnp.zeros((4, 1))  # identical inputs, no noise: rank one
    gp = GaussianProcess(kernels.ExpSquared(1.0), X, noise=0.0)
    v, status = jax.jit(lambda g: g.log_marginal_likelihood_with_status(jnp.ones(4)))(gp)
    assert np.isnan(float(v)) and int(status) == 2
    assert np.isnan(float(gp.log_marginal_likelihood(jnp.ones(4))))
    with pytest.raises(NotPositiveDefiniteError, match="noise") as info:
        gp.log_marginal_likelihood(jnp.ones(4), check=True)
    assert info.value.pivot == 2 and "jitter" in str(info.value)
    with pytest.raises(ValueError, match=r"inside jit|concrete"):
        jax.jit(lambda g: g.log_marginal_likelihood(jnp.ones(4), check=True))(gp)
    # a jitter schedule rescues it, and reports the value used
    ok = GaussianProcess(kernels.ExpSquared(1.0), X, noise=0.0, jitter=(0.0, 1e-6))
    assert np.isfinite(float(ok.log_marginal_likelihood(jnp.ones(4), check=True)))
    assert float(ok.factor()[2]) == 1e-6


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(noise=np.ones(3)), "noise must be"),
        (dict(noise=-1.0), "noise"),
        (dict(noise=0.1 + 5j), "noise must be a real variance .* complex"),  # was its real part
        (dict(noise=np.ones(5, bool)), "noise must be a real variance .* bool"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        GaussianProcess(kernels.ExpSquared(), np.arange(5.0), **kwargs)


def test_bad_y_and_X():
    gp = GaussianProcess(kernels.ExpSquared(), np.arange(5.0), noise=0.1)
    with pytest.raises(ValueError, match=r"y must have shape \(5,\)"):
        gp.log_marginal_likelihood(np.zeros(4))
    with pytest.raises(ValueError, match="NaN or inf"):
        GaussianProcess(kernels.ExpSquared(), np.array([0.0, np.nan]), noise=0.1)
    with pytest.raises(TypeError, match="kernel must be a gpchol kernel"):
        GaussianProcess("rbf", np.arange(3.0), noise=0.1)  # (a function is wrapped)
    with pytest.raises(ValueError, match=r"X must have shape \(n, d\).*jax.vmap"):
        GaussianProcess(kernels.ExpSquared(), np.zeros((2, 3, 1)), noise=0.1)
    with pytest.raises(ValueError, match="at least one column"):
        GaussianProcess(kernels.ExpSquared(), np.zeros((3, 0)), noise=0.1)
    with pytest.raises(ValueError, match=r"Xs must have shape"):
        gp.condition(np.sin(np.arange(5.0))).mean(np.zeros((1, 1, 1)))


@pytest.mark.slow
def test_sharded_inputs_take_the_distributed_path(rng):
    """A GP whose X lives on a multi-device mesh uses gpchol.distributed, same numbers."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    X = rng.uniform(0, 5, (24, 2))
    y = np.sin(X[:, 0])
    k = 1.3 * kernels.ExpSquared(lengthscale=0.8)
    auto = (jax.sharding.AxisType.Auto,) * 2
    mesh = jax.make_mesh((2, 2), ("r", "c"), axis_types=auto)
    Xs = jax.device_put(X, NamedSharding(mesh, P()))

    def lml(k, X, noise=0.1):
        return GaussianProcess(k, X, noise=noise).log_marginal_likelihood(y)

    v1, g1 = jax.value_and_grad(lml)(k, X)
    v2, g2 = jax.value_and_grad(lml)(k, Xs)
    np.testing.assert_allclose(v2, v1, rtol=1e-12)
    for a, b in zip(jax.tree_util.tree_leaves(g2), jax.tree_util.tree_leaves(g1), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9)
    # per-point noise on the sharded path: value and gradient as on one device
    noise = rng.uniform(0.05, 0.2, 24)
    v1, g1 = jax.value_and_grad(lml)(k, X, noise)
    v2, g2 = jax.value_and_grad(lml)(k, Xs, noise)
    np.testing.assert_allclose(v2, v1, rtol=1e-12)
    for a, b in zip(jax.tree_util.tree_leaves(g2), jax.tree_util.tree_leaves(g1), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9)
    # the posterior keeps its factor sharded and predicts as on one device
    Xt = rng.uniform(0, 5, (7, 2))
    p1 = GaussianProcess(k, X, noise=noise, mean=0.3).condition(y)
    p2 = GaussianProcess(k, Xs, noise=noise, mean=0.3).condition(y)
    assert type(p2).__name__ == "ShardedPosterior"
    np.testing.assert_allclose(p2.mean(Xt), p1.mean(Xt), rtol=1e-10)
    np.testing.assert_allclose(p2.variance(Xt), p1.variance(Xt), rtol=1e-10)
    np.testing.assert_allclose(p2.mean(Xt, kernel=k), p1.mean(Xt, kernel=k), rtol=1e-10)
    with pytest.raises(ValueError, match="kernel="):
        p2.mean(Xt, kernel=kernels.Matern32(0.5))
