"""Issue 14, item 6 ("Elsewhere") and the GP part of item 3.

* Result dtypes follow the arrays' dtypes: a Python number (weakly typed) never promotes
  float32 inputs to float64 under ``jax_enable_x64`` (``mvn_logpdf(y32, 0.0, cov32)`` was
  float64).
* ``Posterior.sample`` with no test points, and its ``num`` checked (a negative count gave
  an MLIR error, ``2.7`` drew 2 samples, ``True`` drew 1).
* A finite likelihood from a numerically singular covariance is reported
  (``GaussianProcess.diagnostics``) and warned about in eager calls, never inside ``jit``.

The sharded entry points' items (placement of unsharded traced inputs, jitted eager calls)
are in ``test_distributed.py``. References are float64.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg as sla

import gpchol
from gpchol import GaussianProcess, kernels

# ------------------------------------------------------------------ dtype promotion


def _spd32(rng, n):
    a = rng.standard_normal((n, n))
    return (a @ a.T + n * np.eye(n)).astype(np.float32)


def _mvn_ref(y, mean, cov):
    y, cov = np.asarray(y, np.float64), np.asarray(cov, np.float64)
    r = y - mean
    _, logdet = np.linalg.slogdet(cov)
    return -0.5 * (r @ np.linalg.solve(cov, r) + logdet + len(y) * np.log(2 * np.pi))


@pytest.mark.parametrize("mean", [0.0, 0, 1.5, -2])
def test_mvn_logpdf_python_scalar_mean_keeps_float32(rng, mean):
    assert jax.config.jax_enable_x64  # the setting in which a Python scalar promoted
    n = 6
    cov = _spd32(rng, n)
    y = rng.standard_normal(n).astype(np.float32)
    v = gpchol.mvn_logpdf(y, mean, cov)
    assert v.dtype == np.float32, v.dtype
    np.testing.assert_allclose(float(v), _mvn_ref(y, mean, cov), rtol=1e-5)
    # the same inside jit, the scalar traced as a (weakly typed) argument
    vj = jax.jit(gpchol.mvn_logpdf)(y, mean, cov)
    assert vj.dtype == np.float32
    # and with the gradient wrt the float32 arrays
    g = jax.grad(lambda c: gpchol.mvn_logpdf(y, mean, c))(cov)
    assert g.dtype == np.float32


@pytest.mark.slow
def test_mvn_logpdf_arrays_still_promote(rng):
    """Arrays of different dtypes promote as in JAX (only Python numbers are weak)."""
    n = 4
    cov = _spd32(rng, n)
    y = rng.standard_normal(n).astype(np.float32)
    assert gpchol.mvn_logpdf(y, 0.0, cov.astype(np.float64)).dtype == np.float64
    assert gpchol.mvn_logpdf(y, np.zeros(n), cov).dtype == np.float64
    assert gpchol.mvn_logpdf(y, np.float64(0.0), cov).dtype == np.float64  # a NumPy scalar
    assert gpchol.mvn_logpdf(y, jnp.zeros(n, jnp.float32), cov).dtype == np.float32
    assert gpchol.mvn_logpdf(y.astype(np.float64), 0.0, cov.astype(np.float64)).dtype == (
        np.float64
    )
    with pytest.raises(TypeError, match="integer or boolean"):
        gpchol.mvn_logpdf(y, np.int64(0), cov)
    with pytest.raises(TypeError, match="integer or boolean"):
        gpchol.mvn_logpdf(y, True, cov)


def test_linalg_results_keep_float32(rng):
    n = 5
    a = _spd32(rng, n)
    b = rng.standard_normal(n).astype(np.float32)
    L = gpchol.cholesky(a)
    assert L.dtype == np.float32
    assert gpchol.cholesky(a, jitter=1e-6).dtype == np.float32
    L2, status, used = gpchol.cholesky_with_status(a, jitter=(0.0, 1e-6))
    assert L2.dtype == np.float32 and used.dtype == np.float32 and int(status) == 0
    assert gpchol.cho_solve(L, b).dtype == np.float32
    assert gpchol.solve_triangular(L, b, transpose=True).dtype == np.float32
    assert gpchol.logdet(L).dtype == np.float32
    assert gpchol.cho_inverse(L).dtype == np.float32


@pytest.mark.slow
def test_gp_with_python_scalar_parameters_keeps_float32(rng):
    """Kernel parameters, noise and mean given as Python numbers do not promote."""
    n = 7
    X = rng.uniform(0, 1, (n, 2)).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    Xs = rng.uniform(0, 1, (3, 2)).astype(np.float32)
    gp = GaussianProcess(
        1.5 * kernels.ExpSquared(0.3) + kernels.White(0.01), X, noise=0.1, mean=0.5, jitter=1e-6
    )
    assert gp.covariance_matrix().dtype == np.float32
    assert gp.mean_vector().dtype == np.float32
    assert all(x.dtype == np.float32 for x in gp.factor()[::2])
    assert gp.log_marginal_likelihood(y).dtype == np.float32
    assert jax.jit(lambda g: g.log_marginal_likelihood(y))(gp).dtype == np.float32
    d = gp.diagnostics()
    assert d.rcond.dtype == np.float32 and d.threshold.dtype == np.float32
    post = gp.condition(y)
    assert post.L.dtype == post.alpha.dtype == post.log_marginal_likelihood.dtype == np.float32
    assert post.mean(Xs).dtype == np.float32
    assert post.variance(Xs, include_noise=True).dtype == np.float32
    assert post.covariance(Xs).dtype == np.float32
    assert post.sample(jax.random.PRNGKey(0), Xs, 2).dtype == np.float32
    # a float64 reference of the same model
    gp64 = GaussianProcess(
        1.5 * kernels.ExpSquared(0.3) + kernels.White(0.01),
        X.astype(np.float64),
        noise=0.1,
        mean=0.5,
        jitter=1e-6,
    )
    np.testing.assert_allclose(
        float(gp.log_marginal_likelihood(y)),
        float(gp64.log_marginal_likelihood(y.astype(np.float64))),
        rtol=1e-5,
    )


# ------------------------------------------------------------------ Posterior.sample


@pytest.fixture(scope="module")
def post():
    X = jnp.linspace(0.0, 1.0, 5)
    return GaussianProcess(kernels.ExpSquared(0.3), X, noise=1e-2).condition(jnp.sin(3 * X))


@pytest.mark.parametrize("num", [0, 1, 3])
def test_sample_with_no_test_points(post, num):
    s = post.sample(jax.random.PRNGKey(0), jnp.zeros((0, 1)), num)
    assert s.shape == (num, 0) and s.dtype == post.L.dtype
    s = jax.jit(lambda p, k: p.sample(k, jnp.zeros((0, 1)), num))(post, jax.random.PRNGKey(1))
    assert s.shape == (num, 0)


@pytest.mark.parametrize("num", [2, np.int64(2), jnp.asarray(2, jnp.int32)])
def test_sample_integer_counts(post, num):
    s = post.sample(jax.random.PRNGKey(0), jnp.array([0.1, 0.7]), num)
    assert s.shape == (2, 2) and np.all(np.isfinite(np.asarray(s)))


@pytest.mark.parametrize(
    "num,err,match",
    [
        (-1, ValueError, r"num \(the number of samples\) must be >= 0; got -1"),
        (2.7, TypeError, r"must be a non-negative int; got 2.7 of type float; pass an int"),
        (2.0, TypeError, r"got 2.0 of type float; pass an int, e.g. num=2"),
        (True, TypeError, r"not a bool"),
        (np.True_, TypeError, r"not a bool"),
        ("3", TypeError, r"non-negative int; got '3'"),
        (None, TypeError, r"non-negative int; got None"),
    ],
)
def test_sample_rejects_bad_counts(post, num, err, match):
    with pytest.raises(err, match=match):
        post.sample(jax.random.PRNGKey(0), jnp.array([0.5]), num)


def test_sample_traced_count_says_static(post):
    with pytest.raises(TypeError, match="static"):
        jax.jit(lambda k: post.sample(jax.random.PRNGKey(0), jnp.array([0.5]), k))(2)


# ------------------------------------------------------------------ singular covariance

# Duplicated inputs (1.6 and 0.9 twice), zero noise: k(X, X) is exactly singular, yet on
# this machine's LAPACK every pivot stays positive, status 0 and a finite likelihood, in
# float32 and float64 alike (as LAPACK itself, scikit-learn and tinygp give).
X_DUP = np.array([2.9, 0.4, 2.8, 0.9, 1.3, 2.5, 1.2, 1.6, 0.1, 2.3, 1.6, 1.0, 2.4, 0.9, 1.4])


def _singular_gp(dtype):
    gp = GaussianProcess(kernels.ExpSquared(dtype(0.3)), X_DUP.astype(dtype), noise=0.0)
    K = np.asarray(gp.covariance_matrix())
    potrf = sla.lapack.dpotrf if dtype == np.float64 else sla.lapack.spotrf
    if potrf(K, lower=1)[1] != 0:  # rounding elsewhere may make the factorization fail
        pytest.skip("this LAPACK's rounding makes the duplicated-input K fail to factor")
    return gp, np.sin(X_DUP).astype(dtype)


def _pivot_ratio_ref(K):
    """``(min L_jj / max L_jj)^2`` in float64 from LAPACK's factor of ``K`` as given."""
    c, info = (sla.lapack.dpotrf if K.dtype == np.float64 else sla.lapack.spotrf)(K, lower=1)
    assert info == 0
    d = np.abs(np.diag(c)).astype(np.float64)
    return (d.min() / d.max()) ** 2


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_singular_covariance_is_reported_and_warned_once(dtype):
    gp, y = _singular_gp(dtype)
    n, eps = len(X_DUP), np.finfo(dtype).eps
    d = gp.diagnostics()
    assert isinstance(d, gpchol.GPDiagnostics)
    assert int(d.status) == 0 and bool(d.singular)
    assert float(d.threshold) == pytest.approx(n * eps)
    ref = _pivot_ratio_ref(np.asarray(gp.covariance_matrix()))
    assert ref < n * eps  # the reference agrees: numerically singular
    np.testing.assert_allclose(float(d.rcond), ref, rtol=1e-3 if dtype == np.float32 else 1e-6)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("default")  # Python's default: once per call site
        for _ in range(3):
            v = gp.log_marginal_likelihood(y)  # one call site, three calls
    assert np.isfinite(float(v))  # the finite likelihood the warning is about
    hits = [w for w in rec if issubclass(w.category, gpchol.SingularCovarianceWarning)]
    assert len(hits) == 1, [str(w.message) for w in rec]
    w = hits[0]
    assert issubclass(w.category, RuntimeWarning)
    assert w.filename == __file__  # attributed to the caller's line
    msg = str(w.message)
    assert "GaussianProcess.log_marginal_likelihood" in msg and "numerically singular" in msg
    assert "jitter" in msg and "duplicated inputs" in msg
    assert w.message.rcond == pytest.approx(float(d.rcond)) and w.message.rcond < (
        w.message.threshold
    )
    # the other eager entry points warn too, each at its own call site
    with pytest.warns(gpchol.SingularCovarianceWarning, match="likelihood_with_status"):
        gp.log_marginal_likelihood_with_status(y)
    with pytest.warns(gpchol.SingularCovarianceWarning, match=r"GaussianProcess\.condition"):
        post = gp.condition(y)
    assert bool(post.diagnostics().singular)
    assert float(post.diagnostics().rcond) == pytest.approx(float(d.rcond), rel=1e-6)


@pytest.mark.slow_cases("float64")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_singular_covariance_inside_jit_grad_vmap_is_silent(dtype):
    gp, y = _singular_gp(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning would fail here
        v, status = jax.jit(lambda g: g.log_marginal_likelihood_with_status(y))(gp)
        g = jax.grad(lambda g: g.log_marginal_likelihood(y))(gp)  # eager grad: traced
        d = jax.jit(lambda g: g.diagnostics())(gp)
        post = jax.jit(lambda g: g.condition(y))(gp)
        # a batch of two GPs: the singular one and one with noise
        noisy = GaussianProcess(gp.kernel, gp.X, noise=dtype(0.1))
        both = jax.tree.map(lambda a, b: jnp.stack([a, b]), gp, noisy)
        db = jax.vmap(lambda g: g.diagnostics())(both)
    assert int(status) == 0 and np.isfinite(float(v))
    assert np.isfinite(float(g.kernel.lengthscale))
    assert bool(d.singular) and bool(post.diagnostics().singular)
    assert db.singular.tolist() == [True, False] and db.status.tolist() == [0, 0]
    assert db.rcond.shape == (2,) and float(db.rcond[1]) > float(db.threshold[1])


def test_regular_covariance_is_not_flagged(rng):
    """A well-posed GP: no warning; ``rcond`` is an upper bound on ``1 / cond_2(K)``."""
    X = rng.uniform(0, 3, (12, 1))
    gp = GaussianProcess(kernels.Matern32(0.5), X, noise=1e-3)
    y = np.sin(X[:, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gp.log_marginal_likelihood(y)
        post = gp.condition(y)
    d = gp.diagnostics()
    K = np.asarray(gp.covariance_matrix())
    assert int(d.status) == 0 and not bool(d.singular)
    np.testing.assert_allclose(float(d.rcond), _pivot_ratio_ref(K), rtol=1e-10)
    assert float(d.rcond) >= 1.0 / np.linalg.cond(K) * (1 - 1e-10)
    assert float(post.diagnostics().rcond) == pytest.approx(float(d.rcond), rel=1e-12)
    assert float(d.jitter_used) == 0.0


def test_failed_factorization_is_not_singular_and_not_warned():
    """A covariance that does not factor has a non-zero status, rcond 0, NaN value and no
    singular warning (the NaN and ``check=True`` report it)."""
    gp = GaussianProcess(kernels.ExpSquared(0.5), np.zeros((4, 1)), noise=0.0)  # rank one
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        v = gp.log_marginal_likelihood(np.zeros(4))
    d = gp.diagnostics()
    assert np.isnan(float(v)) and int(d.status) == 2
    assert float(d.rcond) == 0.0 and not bool(d.singular)
    # jitter that rescues it: reported with the jitter used, and not singular
    d = GaussianProcess(
        kernels.ExpSquared(0.5), np.zeros((4, 1)), noise=0.0, jitter=(1e-20, 1e-2)
    ).diagnostics()
    assert int(d.status) == 0 and float(d.jitter_used) == 1e-2 and not bool(d.singular)


def test_warn_if_singular_helper():
    """``GPDiagnostics.warn_if_singular`` (the call the fit layer makes): concrete values
    only, batches warn once, and it returns whether it warned."""
    d = GaussianProcess(kernels.ExpSquared(), jnp.arange(3.0), noise=0.1).diagnostics()
    fake = d._replace(rcond=jnp.asarray([1e-20, 0.5]), singular=jnp.asarray([True, False]))
    with pytest.warns(gpchol.SingularCovarianceWarning, match="gpchol.fit: the cov") as rec:
        assert fake.warn_if_singular("gpchol.fit", stacklevel=1) is True
    assert rec[0].message.rcond == 1e-20
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert d.warn_if_singular() is False
        assert jax.jit(lambda f: jnp.asarray(f.warn_if_singular()))(fake) == 0  # traced
