"""MultiOutputGP (ICM / LMC coregionalisation) against dense float64 NumPy references.

The reference builds ``K = sum_q kron(B_q, k_q(X, X)) + kron(diag(noise), I)`` in NumPy
and *deletes* the rows and columns of the missing entries; the model keeps static shapes
(identity rows, zero residuals) and must give the same value, gradient and posterior.
The Kronecker shortcut must equal the dense factorization to 1e-10 in float64.
"""

from functools import partial

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jax.test_util import check_grads

from gpchol import Coregionalization, MultiOutputGP, MultiOutputPosterior, Positive, fit, kernels

TOL = {np.float32: 2e-4, np.float64: 1e-10}

# ------------------------------------------------------------------ NumPy references


def np_expsq(ls, A, B):
    d = (A[:, None, :] - B[None, :, :]) / ls
    return np.exp(-0.5 * np.sum(d**2, -1))


def np_matern32(ls, A, B):
    r = np.sqrt(np.sum(((A[:, None, :] - B[None, :, :]) / ls) ** 2, -1)) * np.sqrt(3.0)
    return (1.0 + r) * np.exp(-r)


NP_KERNELS = {"expsq": np_expsq, "matern32": np_matern32}
JAX_KERNELS = {"expsq": kernels.ExpSquared, "matern32": kernels.Matern32}


def make_problem(rng, n, p, ranks, names, missing, d=2):
    """Random inputs, observations, mask and parameters of a Q-component LMC."""
    X = rng.uniform(0.0, 3.0, (n, d))
    y = rng.standard_normal((n, p))
    mask = rng.uniform(size=(n, p)) >= missing
    mask[0] = True  # at least one observed entry per output and per row 0
    params = {
        "W": [rng.standard_normal((p, r)) for r in ranks],
        "kappa": [rng.uniform(0.1, 1.0, p) for _ in ranks],
        "ls": [rng.uniform(0.5, 1.5, d) for _ in ranks],
        "noise": rng.uniform(0.05, 0.3, p),
        "mean": rng.standard_normal(p),
    }
    return X, y, mask, params, names


def np_cov(prm, names, A, B):
    """``sum_q kron(B_q, k_q(A, B))`` (output-major)."""
    out = 0.0
    for W, kap, ls, name in zip(prm["W"], prm["kappa"], prm["ls"], names, strict=True):
        Bq = W @ W.T + np.diag(kap)
        out = out + np.kron(Bq, NP_KERNELS[name](ls, A, B))
    return out


def np_reference(prm, names, X, y, mask, Xs):
    """(lml, posterior mean (m, p), posterior variance (m, p)) with missing rows deleted."""
    n, p = y.shape
    K = np_cov(prm, names, X, X) + np.diag(np.repeat(prm["noise"], n))
    o = mask.T.reshape(-1)
    r = (y - prm["mean"]).T.reshape(-1)[o]
    Ko = K[np.ix_(o, o)]
    _, ld = np.linalg.slogdet(Ko)
    alpha = np.linalg.solve(Ko, r)
    lml = -0.5 * (r @ alpha + ld + o.sum() * np.log(2 * np.pi))
    Ks = np_cov(prm, names, X, Xs)[o]  # (n_obs, p m)
    m = Xs.shape[0]
    mean = (Ks.T @ alpha).reshape(p, m).T + prm["mean"]
    prior = np.diagonal(np_cov(prm, names, Xs, Xs)).reshape(p, m).T
    var = prior - np.sum(Ks * np.linalg.solve(Ko, Ks), 0).reshape(p, m).T
    return lml, mean, var


def build(prm, names, X, mask=None, kronecker="auto", **kw):
    ks = [JAX_KERNELS[nm](ls) for nm, ls in zip(names, prm["ls"], strict=True)]
    cs = [Coregionalization(W, k) for W, k in zip(prm["W"], prm["kappa"], strict=True)]
    return MultiOutputGP(
        ks, cs, X, noise=prm["noise"], mask=mask, mean=prm["mean"], kronecker=kronecker, **kw
    )


def cast(tree, dtype):
    return jax.tree.map(lambda a: np.asarray(a, dtype), tree)


# (n, p, ranks per latent kernel, kernels, fraction missing, kronecker)
CASES = [
    (20, 2, (1,), ("expsq",), 0.0, True),  # ICM, Kronecker shortcut
    (20, 2, (1,), ("expsq",), 0.0, False),  # the same, dense
    (17, 3, (2,), ("matern32",), 0.0, "auto"),
    (23, 3, (3,), ("expsq",), 0.3, "auto"),  # missing entries: dense
    (15, 2, (2, 1), ("expsq", "matern32"), 0.0, "auto"),  # LMC: dense
    (19, 3, (1, 2), ("matern32", "expsq"), 0.25, "auto"),  # LMC with missing entries
]


VALUE_CASES = [(*c, np.float64) for c in CASES] + [
    (*CASES[0], np.float32),
    (*CASES[5], np.float32),
]


@pytest.mark.parametrize("n,p,ranks,names,missing,kron,dtype", VALUE_CASES)
def test_value_and_posterior_match_numpy(rng, n, p, ranks, names, missing, kron, dtype):
    X, y, mask, prm, names = make_problem(rng, n, p, ranks, names, missing)
    Xs = rng.uniform(-0.5, 3.5, (5, X.shape[1]))
    lml, mean, var = np_reference(prm, names, X, y, mask, Xs)
    y_in = np.where(mask, y, np.nan)  # missing entries are ignored, NaN or not
    gp = build(cast(prm, dtype), names, X.astype(dtype), mask=mask, kronecker=kron)
    assert gp.uses_kronecker == (kron is not False and len(ranks) == 1 and missing == 0.0)
    tol = TOL[dtype]

    @jax.jit
    def run(gp, y, Xs):
        post = gp.condition(y)
        out = (post.log_marginal_likelihood, post.mean(Xs), post.variance(Xs))
        return gp.log_marginal_likelihood(y), post, out, post.variance(Xs, include_noise=True)

    value, post, (post_lml, post_mean, post_var), var_y = run(
        gp, y_in.astype(dtype), Xs.astype(dtype)
    )
    assert isinstance(post, MultiOutputPosterior) and value.dtype == dtype
    np.testing.assert_allclose(float(value), lml, rtol=tol * 10, atol=tol * 10)
    np.testing.assert_allclose(float(post_lml), lml, rtol=tol * 10)
    np.testing.assert_allclose(post_mean, mean, atol=tol * 50, rtol=0)
    np.testing.assert_allclose(post_var, var, atol=tol * 50, rtol=0)
    np.testing.assert_allclose(var_y, var + prm["noise"], atol=tol * 50)


@pytest.mark.slow_cases("0.001")
@pytest.mark.parametrize("jitter", [None, 1e-3])
def test_kronecker_equals_dense(rng, jitter):
    """The Kronecker shortcut against the dense factorization: value, gradient, posterior."""
    X, y, _, prm, names = make_problem(rng, 25, 3, (2,), ("matern32",), 0.0)

    Xs = rng.uniform(0.0, 3.0, (4, 2))

    @partial(jax.jit, static_argnums=1)
    def run(prm, kron):
        gp = build(prm, names, X, kronecker=kron, jitter=jitter)
        value, grad = jax.value_and_grad(lambda q: gp_of(q, kron).log_marginal_likelihood(y))(prm)
        post = gp.condition(y)
        return value, grad, post.mean(Xs), post.variance(Xs), post.P is not None

    def gp_of(q, kron):
        return build(q, names, X, kronecker=kron, jitter=jitter)

    a, b = run(prm, True), run(prm, False)
    assert a[4] and not b[4]  # the Kronecker posterior holds P, the dense one does not
    np.testing.assert_allclose(float(a[0]), float(b[0]), rtol=1e-12, atol=1e-10)
    for u, v in zip(a[1:4], b[1:4], strict=True):
        jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, atol=1e-10, rtol=1e-10), u, v)


GRAD_CASES = [
    (12, 2, (1,), ("expsq",), 0.0, True),
    (12, 3, (2,), ("expsq",), 0.3, "auto"),
    (10, 2, (1, 1), ("expsq", "matern32"), 0.2, "auto"),
]


@pytest.mark.slow_cases("10-2-ranks2-names2-0.2-auto", "12-2-ranks0-names0-0.0-True")
@pytest.mark.parametrize("n,p,ranks,names,missing,kron", GRAD_CASES)
def test_gradients(rng, n, p, ranks, names, missing, kron):
    """check_grads (forward and reverse) wrt every parameter, the inputs and y."""
    X, y, mask, prm, names = make_problem(rng, n, p, ranks, names, missing)

    def f(prm, X, y):
        return build(prm, names, X, mask=mask, kronecker=kron).log_marginal_likelihood(y)

    # central differences with a small step (the default 1e-4 leaves a truncation error of
    # ~1e-6 relative on this likelihood); tolerances are check_grads' float64 defaults
    check_grads(jax.jit(f), (prm, X, y), order=1, modes=["fwd", "rev"], eps=1e-6)


def test_gradient_matches_numpy_finite_differences(rng):
    """Reverse-mode gradient with missing entries equals central differences of the NumPy
    reference that deletes them (so the masked rows contribute nothing)."""
    X, y, mask, prm, names = make_problem(rng, 11, 3, (2,), ("expsq",), 0.3)
    g = jax.jit(
        jax.grad(lambda W: build({**prm, "W": [W]}, names, X, mask=mask).log_marginal_likelihood(y))
    )
    got = np.asarray(g(prm["W"][0]))
    ref = np.zeros_like(got)
    h = 1e-6
    for idx in np.ndindex(*got.shape):
        Wp, Wm = prm["W"][0].copy(), prm["W"][0].copy()
        Wp[idx] += h
        Wm[idx] -= h
        fp = np_reference({**prm, "W": [Wp]}, names, X, y, mask, X[:1])[0]
        fm = np_reference({**prm, "W": [Wm]}, names, X, y, mask, X[:1])[0]
        ref[idx] = (fp - fm) / (2 * h)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)


def test_degenerate_coregionalization_gradient_is_finite(rng):
    """At B = I (W = 0, equal kappa) every eigenvalue repeats: the Kronecker rule never
    differentiates the eigenvectors, so the gradient is finite and equals the dense one."""
    X, y, _, prm, names = make_problem(rng, 14, 3, (1,), ("expsq",), 0.0)
    prm = {**prm, "W": [np.zeros((3, 1))], "kappa": [np.ones(3)], "noise": np.full(3, 0.1)}

    def lml(prm, kron):
        return build(prm, names, X, kronecker=kron).log_marginal_likelihood(y)

    grad = jax.jit(jax.grad(lml), static_argnums=1)
    ga, gb = grad(prm, True), grad(prm, False)
    jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, atol=1e-10, rtol=1e-10), ga, gb)
    assert all(bool(np.all(np.isfinite(u))) for u in jax.tree.leaves(ga))


@pytest.mark.slow_cases("True")
@pytest.mark.parametrize("kron", [True, False])
def test_jit_vmap_grad(rng, kron):
    X, _, _, prm, names = make_problem(rng, 10, 2, (1,), ("expsq",), 0.0)
    ys = rng.standard_normal((3, 10, 2))

    def lml(prm, y):
        return build(prm, names, X, kronecker=kron).log_marginal_likelihood(y)

    ref = np.array([np_reference(prm, names, X, yi, np.ones((10, 2), bool), X[:1])[0] for yi in ys])
    np.testing.assert_allclose(jax.jit(jax.vmap(lml, (None, 0)))(prm, ys), ref, rtol=1e-10)
    g = jax.jit(jax.grad(lml))(prm, ys[0])
    g_batched = jax.jit(jax.vmap(jax.grad(lml), (None, 0)))(prm, ys)
    jax.tree.map(
        lambda u, v: np.testing.assert_allclose(u[0], v, rtol=1e-10, atol=1e-12), g_batched, g
    )
    # the model itself is a pytree: through jit and back
    gp = build(prm, names, X, kronecker=kron)
    out = jax.jit(lambda m: m.log_marginal_likelihood_with_status(ys[0]))(gp)
    np.testing.assert_allclose(float(out[0]), ref[0], rtol=1e-10)
    assert int(out[1]) == 0


def test_fit(rng):
    """gpchol.fit maximises the likelihood of a masked ICM: the result is a stationary
    point of the NumPy reference in the optimiser's (unconstrained) coordinates."""
    X, y, mask, _, names = make_problem(rng, 15, 2, (1,), ("expsq",), 0.2, d=1)
    y = np.sin(2 * X) @ np.array([[1.0, -0.5]]) + 0.1 * y

    def model(p):
        return MultiOutputGP(
            kernels.ExpSquared(p["ls"]), p["coreg"], X, noise=p["noise"], mask=mask
        )

    c0 = Coregionalization(np.array([[0.5], [0.5]]), np.array([0.5, 0.5]))
    p0 = {"ls": 1.0, "coreg": c0, "noise": np.array([0.1, 0.1])}
    t = {"ls": Positive(), "coreg": c0.default_transforms(), "noise": Positive()}
    # a tight stopping tolerance: the W-kappa valley of B = W W^T + diag(kappa) is flat, and
    # the default (loss change 1e-9) stops where the gradient is still ~1e-3 in W
    res = fit(model, p0, y, transforms=t, steps=500, tol=1e-13, progress=False)
    assert res.success, res.message
    lml = jax.jit(lambda p: model(p).log_marginal_likelihood(y))
    assert res.log_marginal_likelihood > float(lml(p0)) + 1.0
    np.testing.assert_allclose(res.log_marginal_likelihood, float(lml(res.params)), rtol=1e-12)

    def ref(ls, W, kap, noise):
        q = {"W": [W], "kappa": [kap], "ls": [np.array([ls])], "noise": noise, "mean": np.zeros(2)}
        return np_reference(q, names, X, y, mask, X[:1])[0]

    ls = float(res.params["ls"])
    W, kap = np.asarray(res.params["coreg"].W), np.asarray(res.params["coreg"].kappa)
    noise = np.asarray(res.params["noise"])
    h = 1e-6

    def unconstrained(theta):  # d theta / du of the softplus transform of a positive theta
        return -np.expm1(-theta)

    grads = [
        (ref(ls + h, W, kap, noise) - ref(ls - h, W, kap, noise)) / (2 * h) * unconstrained(ls)
    ]
    for arr, name in ((W, "W"), (kap, "kap"), (noise, "noise")):
        for idx in np.ndindex(*arr.shape):
            up, dn = arr.copy(), arr.copy()
            up[idx] += h
            dn[idx] -= h
            args = {"W": W, "kap": kap, "noise": noise}
            fu = ref(ls, **{**args, name: up})
            fd = ref(ls, **{**args, name: dn})
            scale = 1.0 if name == "W" else unconstrained(arr[idx])
            grads.append((fu - fd) / (2 * h) * scale)
    assert np.max(np.abs(grads)) < 1e-3, grads


@pytest.mark.slow
def test_sharded_dense_matches_one_device(rng):
    """X on a 2x2 mesh of the simulated CPU devices: the dense np x np covariance is
    factored by gpchol.distributed (n p = 42 padded to 44), value and gradient as on one
    device to 1e-10; the posterior replicates X and matches too."""
    X, y, mask, prm, names = make_problem(rng, 14, 3, (2, 1), ("expsq", "matern32"), 0.2)
    mesh = jax.make_mesh((2, 2), ("r", "c"))
    Xd = jax.device_put(X, NamedSharding(mesh, P("r")))

    def lml(prm, X):
        return build(prm, names, X, mask=mask).log_marginal_likelihood(y)

    assert not build(prm, names, Xd, mask=mask).uses_kronecker
    ref = np_reference(prm, names, X, y, mask, X[:1])[0]

    Xs = rng.uniform(0.0, 3.0, (3, 2))

    @jax.jit
    def run(prm, X):
        value, grad = jax.value_and_grad(lml)(prm, X)
        return value, grad, build(prm, names, X, mask=mask).condition(y).mean(Xs)

    one, g1, m1 = run(prm, X)
    with jax.set_mesh(mesh):
        value, g, m = run(prm, Xd)
    np.testing.assert_allclose(m, m1, atol=1e-10, rtol=0)  # the posterior: on one device
    np.testing.assert_allclose(float(one), ref, rtol=1e-10)
    np.testing.assert_allclose(float(value), float(one), rtol=1e-10, atol=1e-10)
    jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, atol=1e-10, rtol=1e-9), g, g1)


# ------------------------------------------------------------------------ bad input


def test_bad_input_errors():
    k, X = kernels.ExpSquared(), np.linspace(0.0, 1.0, 4)
    c = Coregionalization(np.ones((2, 1)), 0.5)
    with pytest.raises(ValueError, match=r"rank \(3.*larger than the number of outputs \(2"):
        Coregionalization(np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"W .* must have shape \(p, rank\)"):
        Coregionalization(np.ones(3))
    with pytest.raises(ValueError, match=r"kappa must be a scalar or have shape \(2,\)"):
        Coregionalization(np.ones((2, 1)), np.ones(3))
    with pytest.raises(ValueError, match=r"kappa .* must be > 0"):
        Coregionalization(np.ones((2, 1)), np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match=r"mask must have shape \(n, p\) = \(4, 2\).*\(2, 4\)"):
        MultiOutputGP(k, c, X, noise=0.1, mask=np.ones((2, 4), bool))
    with pytest.raises(TypeError, match="mask must be a boolean array"):
        MultiOutputGP(k, c, X, noise=0.1, mask=np.ones((4, 2)))
    gp = MultiOutputGP(k, c, X, noise=0.1)
    with pytest.raises(ValueError, match=r"y must have shape \(n, p\) = \(4, 2\).*reshape y"):
        gp.log_marginal_likelihood(np.zeros(4))
    with pytest.raises(ValueError, match=r"y must have shape \(n, p\) = \(4, 2\).*\(4, 3\)"):
        gp.condition(np.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"noise must be a scalar or have shape \(2,\)"):
        MultiOutputGP(k, c, X, noise=np.ones(3))
    with pytest.raises(ValueError, match=r"noise .* must be finite and >= 0"):
        MultiOutputGP(k, c, X, noise=np.array([0.1, -1.0]))
    with pytest.raises(ValueError, match=r"one Coregionalization per latent kernel"):
        MultiOutputGP([k, k], c, X, noise=0.1)
    with pytest.raises(ValueError, match="same number of outputs"):
        MultiOutputGP([k, k], [c, Coregionalization(np.ones((3, 1)))], X, noise=0.1)
    with pytest.raises(TypeError, match="kernel must be a gpchol kernel"):
        MultiOutputGP("ExpSquared", c, X, noise=0.1)
    with pytest.raises(ValueError, match="kronecker=True needs one latent kernel"):
        MultiOutputGP(k, c, X, noise=0.1, mask=np.eye(4, 2, dtype=bool), kronecker=True)
    with pytest.raises(ValueError, match="Xs has 2 column"):
        jax.jit(gp.condition)(np.zeros((4, 2))).mean(np.zeros((3, 2)))


def np_covariance(prm, names, X, mask, Xs):
    """The joint posterior covariance ``(m, p, m, p)`` with missing rows deleted."""
    n, p = mask.shape
    m = Xs.shape[0]
    K = np_cov(prm, names, X, X) + np.diag(np.repeat(prm["noise"], n))
    o = mask.T.reshape(-1)
    Ko = K[np.ix_(o, o)]
    Ks = np_cov(prm, names, X, Xs)[o]
    C = np_cov(prm, names, Xs, Xs) - Ks.T @ np.linalg.solve(Ko, Ks)  # (p m, p m), (a, s)
    return np.transpose(C.reshape(p, m, p, m), (1, 0, 3, 2))


@pytest.mark.slow
@pytest.mark.parametrize("n,p,ranks,names,missing,kron", CASES)
def test_covariance_and_samples_match_numpy(rng, n, p, ranks, names, missing, kron):
    X, y, mask, prm, names = make_problem(rng, n, p, ranks, names, missing)
    Xs = rng.uniform(-0.5, 3.5, (3, X.shape[1]))
    m = Xs.shape[0]
    want = np_covariance(prm, names, X, mask, Xs)
    gp = build(prm, names, X, mask=mask, kronecker=kron)
    post = jax.jit(lambda gp, y: gp.condition(y))(gp, np.where(mask, y, np.nan))
    cov = np.asarray(jax.jit(lambda post, Xs: post.covariance(Xs))(post, Xs))
    assert cov.shape == (m, p, m, p)
    np.testing.assert_allclose(cov, want, atol=1e-9, rtol=0)
    np.testing.assert_array_equal(cov, np.transpose(cov, (2, 3, 0, 1)))
    flat = cov.reshape(m * p, m * p)
    np.testing.assert_allclose(
        np.diagonal(flat).reshape(m, p), np.asarray(post.variance(Xs)), atol=1e-10
    )
    cov_y = np.asarray(post.covariance(Xs, include_noise=True)).reshape(m * p, m * p)
    np.testing.assert_allclose(cov_y - flat, np.diag(np.tile(prm["noise"], m)), atol=1e-12)

    # samples: jointly N(mean, covariance) across test points and outputs
    key = jax.random.PRNGKey(7)
    num = 20000
    s = np.asarray(jax.jit(lambda post, key: post.sample(key, Xs, num))(post, key))
    assert s.shape == (num, m, p)
    # eager: the same draws (rounding aside: the programs fuse differently)
    np.testing.assert_allclose(s, np.asarray(post.sample(key, Xs, num)), rtol=1e-9, atol=1e-12)
    mean = np.asarray(post.mean(Xs))
    sd = np.sqrt(np.maximum(np.diagonal(flat), 0.0)).reshape(m, p)
    np.testing.assert_allclose(s.mean(0), mean, atol=6 * sd.max() / np.sqrt(num) + 1e-12)
    emp = np.cov(s.reshape(num, m * p), rowvar=False)
    scale = np.sqrt(np.outer(np.diagonal(flat), np.diagonal(flat))) + 1e-12
    # each normalized entry's sampling sd is at most sqrt(2 / num)
    assert np.max(np.abs(emp - flat) / scale) < 6 * np.sqrt(2 / num), "sample covariance"
    y_star = np.asarray(post.sample(key, Xs, num, include_noise=True))
    emp_y = np.cov(y_star.reshape(num, m * p), rowvar=False)
    np.testing.assert_allclose(np.diagonal(emp_y), np.diagonal(cov_y), rtol=0.06)
    assert post.sample(key, Xs[:0], 2).shape == (2, 0, p)
    with pytest.raises(TypeError, match="num"):
        post.sample(key, Xs, 2.5)
    with pytest.raises(ValueError, match="num"):
        post.sample(key, Xs, -1)


# ------------------------------------------------- behaviour shared with every posterior


@pytest.mark.slow_cases("kronecker")
@pytest.mark.parametrize("kron", [True, False], ids=["kronecker", "dense"])
def test_posterior_runs_in_blocks(rng, kron):
    """Many test points take several blocks of the posterior core (the default block of
    ``max(2^20, (np)^2 / 16) / (np) / p`` points): the padded last block is dropped
    exactly, and each point's mean and variance are those of a one-block call."""
    X, y, mask, prm, names = make_problem(rng, 20, 2, (1,), ("expsq",), 0.0)
    post = build(prm, names, X, kronecker=kron).condition(y)
    assert post.gp.uses_kronecker == kron
    m = 30_001  # 3 blocks of 13107 (n p = 40)
    Xs = rng.uniform(-0.5, 3.5, (m, X.shape[1]))
    mu = np.asarray(post.mean(Xs))
    var = np.asarray(post.variance(Xs))
    assert mu.shape == var.shape == (m, 2)
    pick = np.array([0, 13106, 13107, 26213, 26214, m - 1])  # at the blocks' edges
    np.testing.assert_allclose(mu[pick], post.mean(Xs[pick]), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(var[pick], post.variance(Xs[pick]), rtol=1e-10, atol=1e-14)
    _, mean, v = np_reference(prm, names, X, y, mask, Xs[pick])
    np.testing.assert_allclose(mu[pick], mean, atol=TOL[np.float64] * 50, rtol=0)
    np.testing.assert_allclose(var[pick], v, atol=TOL[np.float64] * 50, rtol=0)


@pytest.mark.slow
def test_posterior_input_checks(rng):
    """The posterior core's checks of the test inputs: NaN rows, columns, empty."""
    X, y, _, prm, names = make_problem(rng, 8, 2, (1,), ("expsq",), 0.0)
    post = build(prm, names, X).condition(y)
    with pytest.raises(ValueError, match=r"Xs has 3 column\(s\) but the training inputs X have 2"):
        post.variance(np.zeros((4, 3)))
    bad = rng.uniform(0.0, 1.0, (4, X.shape[1]))
    bad[2, 0] = np.nan
    for method in (post.mean, post.variance, post.covariance):
        with pytest.raises(ValueError, match=r"Xs has NaN or inf in row\(s\) \[2\]"):
            method(bad)
    with pytest.raises(ValueError, match=r"Xs has NaN or inf in row\(s\) \[2\]"):
        post.sample(jax.random.PRNGKey(0), bad, 2)
    assert post.mean(bad[:0]).shape == post.variance(bad[:0]).shape == (0, 2)
    assert post.covariance(bad[:0]).shape == (0, 2, 0, 2)
    np.testing.assert_allclose(post.mean(), post.mean(X), rtol=1e-12)  # None: training inputs


@pytest.mark.parametrize("kron", [True, False], ids=["kronecker", "dense"])
def test_float32_targets_with_float64_inputs_compute_in_float64(kron):
    """The compute dtype is the promotion of X's and y's, as for the exact GP (it was y's
    alone: float32 predictions, errors of 1e-4 against the float64 model)."""
    from gpchol import GaussianProcess

    X = np.linspace(0.0, 1.0, 8)
    y32 = np.sin(3.0 * X).astype(np.float32)
    B = Coregionalization(np.zeros((1, 1)), np.ones(1))
    post = MultiOutputGP(kernels.ExpSquared(0.5), B, X, noise=0.1, kronecker=kron).condition(
        y32[:, None]
    )
    exact = GaussianProcess(kernels.ExpSquared(0.5), X, noise=0.1).condition(y32)
    Xs = np.array([0.3, 0.71])
    mean, var = post.mean(Xs), post.variance(Xs)
    assert mean.dtype == var.dtype == np.float64
    np.testing.assert_allclose(np.asarray(mean)[:, 0], np.asarray(exact.mean(Xs)), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(var)[:, 0], np.asarray(exact.variance(Xs)), rtol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("degenerate", [True, False], ids=["equal-eigenvalues", "generic"])
def test_kronecker_predictions_differentiate_as_the_dense_ones(degenerate):
    """Gradients of the Kronecker shortcut's mean, variance and covariance in every
    hyperparameter, the data and the test inputs equal the dense path's, also where the
    whitened B's eigenvalues are equal (W = 0, equal kappa and noise: they were NaN,
    through the eigenvectors' derivative)."""
    X = np.linspace(0.0, 1.0, 8)
    Y = np.stack([np.sin(3 * X), np.cos(3 * X), X], axis=1)
    if degenerate:
        W, kappa, noise = np.zeros((3, 1)), np.full(3, 0.5), np.full(3, 0.1)
    else:
        W, kappa, noise = (
            np.array([[1.0], [-0.5], [0.3]]),
            np.array([0.5, 0.2, 0.9]),
            [0.1, 0.05, 0.2],
        )
    weights = np.sin(np.arange(81.0))

    def f(theta, kron):
        W, kappa, noise, ls, Y, Xs = theta
        B = Coregionalization(W, kappa)
        post = MultiOutputGP(kernels.ExpSquared(ls), B, X, noise=noise, kronecker=kron).condition(Y)
        mean, var = post.mean(Xs), post.variance(Xs)
        cov = post.covariance(Xs).reshape(-1)
        return mean.sum() + (weights[:9] * var.reshape(-1)).sum() + (weights * cov).sum()

    theta = (W, kappa, np.asarray(noise), 0.4, Y, np.array([0.3, 0.55, 1.4]))
    theta = jax.tree.map(jax.numpy.asarray, theta)
    # the shortcut's gradient eagerly (as a user's call; XLA may simplify a NaN away under
    # jit); the dense reference and the forward mode each as one compiled program (eager,
    # one program per operation: 248 compilations and about 25 s)
    got = jax.grad(f)(theta, True)
    want = jax.jit(jax.grad(f), static_argnums=1)(theta, False)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert np.all(np.isfinite(np.asarray(g)))
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-9, atol=1e-11)
    ones = jax.tree.map(jax.numpy.ones_like, theta)
    fwd = jax.jit(lambda t, v: jax.jvp(lambda t: f(t, True), (t,), (v,))[1])(theta, ones)
    np.testing.assert_allclose(
        float(fwd), sum(float(np.sum(w)) for w in jax.tree.leaves(want)), rtol=1e-9
    )


@pytest.mark.slow
@pytest.mark.parametrize("kron", [True, False], ids=["kronecker", "dense"])
def test_block_size_changes_no_prediction(kron):
    """The multi-output posterior takes ``block_size`` as the other posteriors do: the
    same numbers for any block, a clear error for a bad one."""
    rng = np.random.default_rng(5)
    X = rng.uniform(0.0, 2.0, 9)
    Y = np.stack([np.sin(3 * X), X], axis=1)
    B = Coregionalization(np.array([[1.0], [-0.4]]), np.array([0.3, 0.2]))
    post = MultiOutputGP(kernels.ExpSquared(0.5), B, X, noise=0.05, kronecker=kron).condition(Y)
    Xs = rng.uniform(-0.5, 2.5, 7)
    m0, v0 = post.mean_and_variance(Xs)
    c0 = np.asarray(post.covariance(Xs))
    for b in (1, 3, 7, 50):
        m, v = post.mean_and_variance(Xs, block_size=b)
        np.testing.assert_allclose(np.asarray(m), np.asarray(m0), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(np.asarray(v), np.asarray(v0), rtol=1e-12, atol=1e-14)
        np.testing.assert_array_equal(np.asarray(post.mean(Xs, block_size=b)), np.asarray(m))
        c = np.asarray(post.covariance(Xs, block_size=b))
        np.testing.assert_allclose(c, c0, rtol=1e-12, atol=1e-14)
    key = jax.random.PRNGKey(1)
    np.testing.assert_allclose(
        np.asarray(post.sample(key, Xs, 2, block_size=2)),
        np.asarray(post.sample(key, Xs, 2)),
        rtol=1e-9,
        atol=1e-12,
    )
    with pytest.raises((TypeError, ValueError), match="block_size"):
        post.mean(Xs, block_size=0)
