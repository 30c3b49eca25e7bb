"""Small n: the Gaussian likelihood's rule picked by size (issue 16 item 2).

On the CPU the factor-and-solve is one LAPACK call at every n (its status is LAPACK's
info: no status search), and ``K^-1`` is LAPACK ``potri`` from n = ``HOST_MIN_N`` on, the
tiled XLA inverse below. These tests check the values, gradients and statuses on both
sides of that threshold against float64 NumPy/SciPy references and JAX's own rules, under
``jit``, ``vmap`` and ``grad``, and that the compiled small-n step has no status search.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import lapack_info
from jax.test_util import check_grads

import gpchol
from gpchol import GaussianProcess, kernels
from gpchol._internal import host_lapack

HOST_MIN_N = host_lapack.HOST_MIN_N
compiled_lapack = host_lapack.compiled_lapack

SIZES = [1, 2, 7, HOST_MIN_N - 1, HOST_MIN_N, 50]
TOL = {np.float64: 1e-10, np.float32: 2e-4}


def reference(X, y, theta):
    """float64 value and gradient wrt (amplitude, lengthscale, noise), R&W eq. 5.9."""
    a, ell, s = (float(t) for t in theta)
    X = np.asarray(X, np.float64)
    d2 = np.sum((X[:, None, :] - X[None, :, :]) ** 2, axis=-1)
    E = np.exp(-0.5 * d2 / ell**2)
    n = X.shape[0]
    K = a * E + s * np.eye(n)
    L = np.linalg.cholesky(K)
    Kinv = np.linalg.inv(K)
    alpha = Kinv @ y
    value = -0.5 * y @ alpha - np.sum(np.log(np.diag(L))) - 0.5 * n * np.log(2 * np.pi)
    W = 0.5 * (np.outer(alpha, alpha) - Kinv)
    return value, np.array([np.sum(W * G) for G in (E, a * E * d2 / ell**3, np.eye(n))])


def lml(theta, X, y):
    gp = GaussianProcess(theta[0] * kernels.ExpSquared(lengthscale=theta[1]), X, noise=theta[2])
    return gp.log_marginal_likelihood(y)


def data(rng, n, dtype=np.float64):
    X = rng.uniform(0.0, 4.0, (n, 2))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(n)
    return X.astype(dtype), y.astype(dtype), np.array([1.3, 0.9, 0.1], dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", SIZES)
def test_value_and_gradient_against_numpy(rng, n, dtype):
    X, y, theta = data(rng, n, dtype)
    v, g = jax.jit(jax.value_and_grad(lml))(jnp.asarray(theta), X, y)
    v_ref, g_ref = reference(X, y.astype(np.float64), theta)
    assert v.dtype == dtype and g.dtype == dtype
    tol = TOL[dtype]
    np.testing.assert_allclose(float(v), v_ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(g, np.float64), g_ref, rtol=tol, atol=tol * 10)


def lml_jax(theta, X, y):
    """The same likelihood by JAX's own rules (jnp.linalg.cholesky + autodiff)."""
    n = X.shape[0]
    K = (theta[0] * kernels.ExpSquared(lengthscale=theta[1]))(X, X) + theta[2] * jnp.eye(n)
    L = jnp.linalg.cholesky(K)
    z = jax.scipy.linalg.solve_triangular(L, y, lower=True)
    return -0.5 * z @ z - jnp.sum(jnp.log(jnp.diag(L))) - 0.5 * n * np.log(2 * np.pi)


@pytest.mark.slow_cases("2", "32")
@pytest.mark.parametrize("n", [2, HOST_MIN_N - 1, HOST_MIN_N])
def test_hessian_equals_jax_rules(rng, n):
    """Second order (differentiating the whole-likelihood rule and its LAPACK call)."""
    X, y, theta = data(rng, n)
    h = jax.jit(jax.hessian(lml))(jnp.asarray(theta), X, y)
    h_ref = jax.jit(jax.hessian(lml_jax))(jnp.asarray(theta), X, y)
    np.testing.assert_allclose(h, h_ref, rtol=1e-8, atol=1e-9 * float(jnp.abs(h_ref).max()))
    check_grads(
        jax.jit(lambda t: lml(t, X, y)), (jnp.asarray(theta),), order=1, modes=["fwd", "rev"]
    )


@pytest.mark.parametrize("B, n", [(16, 5), (8, HOST_MIN_N + 3)])
def test_vmap_matches_one_by_one(rng, B, n):
    sets = [data(rng, n) for _ in range(B)]
    X = np.stack([s[0] for s in sets])
    y = np.stack([s[1] for s in sets])
    th = np.stack([s[2] * np.exp(0.2 * rng.standard_normal(3)) for s in sets])
    v, g = jax.jit(jax.vmap(jax.value_and_grad(lml)))(jnp.asarray(th), X, y)
    for b in range(B):
        v_ref, g_ref = reference(X[b], y[b], th[b])
        np.testing.assert_allclose(float(v[b]), v_ref, rtol=1e-10)
        np.testing.assert_allclose(np.asarray(g[b]), g_ref, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("n", [3, 9, HOST_MIN_N + 1])
def test_status_under_vmap_is_lapack_info(rng, n):
    """Failing covariances in a batch: status = reference LAPACK potrf info per element,
    the value NaN there and finite elsewhere."""
    X, y, _ = data(rng, n)
    Xb = np.stack([X, X, X, X])
    Xb[1, n // 2] = Xb[1, 0]  # a duplicated input with zero noise: a failing pivot
    Xb[2, -1, 0] = np.nan  # a NaN in the last row
    noise = np.array([0.1, 0.0, 0.1, 0.1])

    def one(X, s):
        gp = GaussianProcess(kernels.ExpSquared(0.7), X, noise=s)
        return gp.log_marginal_likelihood_with_status(y)

    value, status = jax.jit(jax.vmap(one))(Xb, noise)
    k = kernels.ExpSquared(0.7)
    Ks = [np.asarray(k(Xb[b], Xb[b])) + noise[b] * np.eye(n) for b in range(4)]
    np.testing.assert_array_equal(np.asarray(status), lapack_info(np.stack(Ks)))
    assert (np.asarray(status) != 0).tolist() == [False, True, True, False]
    assert np.isnan(np.asarray(value)[1:3]).all() and np.isfinite(np.asarray(value)[[0, 3]]).all()


def test_small_n_step_has_no_status_search():
    """At small n the compiled value-and-gradient is one LAPACK factor-and-solve call (its
    info is the status): no status search, no separate potrf and triangular solves."""
    if not compiled_lapack():
        pytest.skip("gpchol's compiled CPU handlers are not built")
    n = 20
    X = jnp.linspace(0.0, 3.0, n)[:, None]
    hlo = (
        jax.jit(jax.value_and_grad(lml))
        .lower(jnp.asarray([1.0, 0.5, 0.1]), X, jnp.sin(X[:, 0]))
        .compile()
        .as_text()
    )
    assert "gpchol_cpu_chol_solve" in hlo
    assert "potrf_info" not in hlo and "lapack_dpotrf" not in hlo
    # and the same through mvn_logpdf
    K = jnp.eye(n) + 0.5
    hlo = jax.jit(jax.grad(gpchol.mvn_logpdf, argnums=2)).lower(jnp.zeros(n), 0.0, K)
    text = hlo.compile().as_text()
    assert "gpchol_cpu_chol_solve" in text and "potrf_info" not in text
