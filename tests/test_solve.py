"""solve_triangular, cho_solve, logdet, cho_inverse and mvn_logpdf against SciPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg as sla
import scipy.stats as sst
from helpers import patch_read_at_trace, random_spd
from jax.test_util import check_grads

import gpchol

TOL = {np.float32: 2e-4, np.float64: 1e-10}


def _lower(rng, n, batch=(), dtype=np.float64):
    return np.linalg.cholesky(random_spd(rng, n, batch)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("rhs", [(), (3,)])
def test_solve_triangular(rng, dtype, lower, transpose, rhs):
    n = 17
    L = _lower(rng, n, dtype=dtype)
    T = L if lower else L.T.copy()
    b = rng.standard_normal((n, *rhs)).astype(dtype)
    x = gpchol.solve_triangular(T, b, lower=lower, transpose=transpose)
    ref = sla.solve_triangular(T.astype(np.float64), b, lower=lower, trans=1 if transpose else 0)
    assert x.shape == b.shape and x.dtype == dtype
    np.testing.assert_allclose(x, ref, rtol=TOL[dtype], atol=TOL[dtype])


def test_solve_triangular_batched_broadcast(rng):
    L = _lower(rng, 6, batch=(4,))
    b = rng.standard_normal((4, 6))
    x = gpchol.solve_triangular(L, b)
    ref = np.stack([sla.solve_triangular(L[i], b[i], lower=True) for i in range(4)])
    np.testing.assert_allclose(x, ref, rtol=1e-12)
    # one factor, many right-hand-side batches
    B = rng.standard_normal((5, 6, 2))
    x2 = gpchol.solve_triangular(L[0], B)
    np.testing.assert_allclose(x2, np.linalg.solve(L[0], B), rtol=1e-10)


@pytest.mark.slow
def test_solve_triangular_grads(rng):
    L = _lower(rng, 5)
    b = rng.standard_normal((5, 2))
    check_grads(
        lambda L, b: gpchol.solve_triangular(L, b, transpose=True),
        (L, b),
        order=2,
        modes=("fwd", "rev"),
    )


@pytest.mark.slow_cases("rhs0")
@pytest.mark.parametrize("rhs", [(), (4,)])
def test_cho_solve_and_logdet(rng, rhs):
    n = 30
    a = random_spd(rng, n)
    L = np.linalg.cholesky(a)
    b = rng.standard_normal((n, *rhs))
    np.testing.assert_allclose(gpchol.cho_solve(L, b), np.linalg.solve(a, b), rtol=1e-10)
    np.testing.assert_allclose(gpchol.logdet(L), np.linalg.slogdet(a)[1], rtol=1e-12)
    check_grads(gpchol.cho_solve, (L, b), order=1, modes=("fwd", "rev"))
    check_grads(gpchol.logdet, (L,), order=2, modes=("fwd", "rev"))


@pytest.mark.parametrize("n, tile", [(1, None), (9, 4), (64, 16), (300, 64)])
def test_cho_inverse(rng, n, tile):
    a = random_spd(rng, n)
    inv = gpchol.cho_inverse(np.linalg.cholesky(a), tile_size=tile)
    np.testing.assert_allclose(inv, np.linalg.inv(a), rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(inv, np.asarray(inv).T)


def test_cho_inverse_grad(rng):
    L = _lower(rng, 6)
    check_grads(lambda L: gpchol.cho_inverse(L, tile_size=4), (L,), order=1, modes=("rev",))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch", [(), (3,)])
def test_cho_inverse_lapack_and_tiled_agree(rng, dtype, batch):
    """On the CPU n >= HOST_MIN_N takes LAPACK potri; the tiled path must agree with it."""
    from gpchol._internal import cho_inverse_tiled, host_lapack

    HOST_MIN_N = host_lapack.HOST_MIN_N

    n = HOST_MIN_N + 37
    a = random_spd(rng, n, batch)
    L = np.linalg.cholesky(a).astype(dtype)
    host = jax.jit(gpchol.cho_inverse)(L)
    tiled = jax.jit(lambda L: cho_inverse_tiled(L, 64))(L)
    ref = np.linalg.inv(np.linalg.cholesky(a) @ np.swapaxes(np.linalg.cholesky(a), -1, -2))
    ref = np.linalg.inv(a) if dtype == np.float64 else ref
    scale = np.abs(ref).max()
    tol = {np.float32: 5e-3, np.float64: 1e-9}[dtype]  # cond(a) ~ 1e2..1e3
    assert host.dtype == dtype and host.shape == a.shape
    np.testing.assert_allclose(host / scale, ref / scale, atol=tol)
    np.testing.assert_allclose(tiled / scale, ref / scale, atol=tol)
    np.testing.assert_array_equal(host, np.swapaxes(np.asarray(host), -1, -2))
    # vmap over the batch gives the same as the batched call
    if batch:
        np.testing.assert_allclose(jax.vmap(gpchol.cho_inverse)(L), host, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 2, 31, 50, 100, 101, 140, 353, 512, 513])
def test_potri_handler_small_loops_and_lapack(rng, dtype, n):
    """The potri handler: its own loops up to n = 100 (no OpenBLAS thread pool), halving
    with BLAS-3 triangular products on one OpenBLAS thread up to ONE_THREAD_MAX_N, LAPACK's
    potri above; all give A^-1 to the dtype's accuracy, exactly symmetric, in both layouts,
    and NaN for a factor with an exactly zero diagonal entry (LAPACK's trtri info)."""
    from gpchol._internal import cpu_ffi

    if cpu_ffi.cpu_unavailable_reason() is not None:
        pytest.skip(cpu_ffi.cpu_unavailable_reason())
    a = random_spd(rng, n, (2,))
    L = np.linalg.cholesky(a)
    ref = np.linalg.inv(a)
    scale = np.abs(ref).max()
    tol = {np.float32: 5e-3, np.float64: 1e-9}[dtype]  # cond(a) ~ 1e2..1e3
    Lj = jnp.asarray(np.tril(L) + np.triu(np.full_like(L, 7.0), 1), dtype)  # junk above
    inv = np.asarray(jax.jit(cpu_ffi.potri)(Lj))
    assert inv.dtype == dtype
    np.testing.assert_allclose(inv / scale, ref / scale, atol=tol)
    np.testing.assert_array_equal(inv, np.swapaxes(inv, -1, -2))
    # the factor handed over column-major (row-major L^T): the same numbers
    cm = np.asarray(jax.jit(lambda F: cpu_ffi.potri(F, column_major=True))(Lj))
    np.testing.assert_allclose(cm / scale, ref / scale, atol=tol)
    # a zero pivot: that matrix NaN, the other untouched
    Lz = np.array(Lj)
    Lz[1, n // 2, n // 2] = 0.0
    out = np.asarray(jax.jit(cpu_ffi.potri)(jnp.asarray(Lz)))
    assert np.isnan(out[1]).all()
    np.testing.assert_array_equal(out[0], inv[0])


@pytest.mark.slow
def test_cho_inverse_lapack_grads_and_failure(rng):
    """The LAPACK inverse is differentiable to second order; a NaN factor gives NaN."""
    from gpchol._internal import cho_inverse_tiled, host_lapack

    n = host_lapack.HOST_MIN_N
    # well conditioned (cond ~ 3), so that second-order finite differences are accurate
    g = rng.standard_normal((n, n)) / np.sqrt(n)
    L = np.linalg.cholesky(np.eye(n) + 0.5 * g @ g.T)
    w = rng.standard_normal((n, n))
    f = lambda L: jnp.sum(w * gpchol.cho_inverse(L))  # noqa: E731
    # eps=1e-5: the default step's truncation error (~5e-5 relative in the second order
    # for this function) exceeds the tolerance, for JAX's own autodiff of the tiled
    # inverse just the same
    check_grads(f, (L,), order=2, modes=("fwd", "rev"), eps=1e-5)
    # first and second derivatives equal those of the tiled inverse (JAX autodiff)
    f_tiled = lambda L: jnp.sum(w * cho_inverse_tiled(jnp.tril(L), 32))  # noqa: E731
    d = np.tril(rng.standard_normal((n, n)))
    hvp = lambda f: jax.jvp(jax.grad(f), (L,), (d,))  # noqa: E731
    (g1, h1), (g2, h2) = hvp(f), hvp(f_tiled)
    np.testing.assert_allclose(g1, g2, rtol=1e-10, atol=1e-10 * np.abs(g2).max())
    np.testing.assert_allclose(h1, h2, rtol=1e-9, atol=1e-9 * np.abs(h2).max())
    bad = np.full((n, n), np.nan)
    assert np.all(np.isnan(jax.jit(gpchol.cho_inverse)(bad)))


@pytest.mark.slow_cases("False")
@pytest.mark.parametrize("compiled", [True, False])
def test_host_lapack_compiled_and_xla_fallback(rng, monkeypatch, request, compiled):
    """The compiled LAPACK handlers and the XLA operations used where they are not built
    give the same factor, solve, inverse and likelihood gradient."""
    from gpchol._internal import cpu_ffi, host_lapack

    if compiled:
        assert cpu_ffi.cpu_unavailable_reason() is None, cpu_ffi.cpu_unavailable_reason()
    else:
        off = lambda: "switched off (test)"  # noqa: E731
        patch_read_at_trace(monkeypatch, request, cpu_ffi, "cpu_unavailable_reason", off)
    assert host_lapack.compiled_lapack() is compiled
    n = 150
    a = random_spd(rng, n, (2,))
    r = rng.standard_normal((2, n))
    if compiled:
        L, alpha, quad, logdet, status = jax.jit(host_lapack.chol_solve_cpu)(a, r)
        np.testing.assert_allclose(L, np.linalg.cholesky(a), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(alpha, np.linalg.solve(a, r[..., None])[..., 0], rtol=1e-9)
        np.testing.assert_allclose(quad, np.einsum("bi,bi->b", r, alpha), rtol=1e-9)
        np.testing.assert_allclose(logdet, np.linalg.slogdet(a)[1], rtol=1e-12)
        np.testing.assert_array_equal(status, 0)
    L = np.linalg.cholesky(a)
    inv = jax.jit(lambda L: gpchol.cho_inverse(L))(L)
    np.testing.assert_allclose(inv, np.linalg.inv(a), rtol=1e-8, atol=1e-12)
    f = jax.jit(jax.value_and_grad(lambda c: gpchol.mvn_logpdf(r[0], 0.0, c)))
    text = f.lower(a[0]).as_text()
    assert ("gpchol_cpu_chol_solve_f64" in text) is compiled
    v, g = f(a[0])
    assert abs(float(v) - _scipy_logpdf(r[0], np.zeros(n), a[0])) < 1e-9 * abs(float(v))
    ai = np.linalg.inv(a[0])
    al = ai @ r[0]
    np.testing.assert_allclose(g, 0.5 * (np.outer(al, al) - ai), rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize(
    "shape, match",
    [((3,), "vector right-hand side"), ((5, 2), "needs shape"), ((5, 5, 2), "needs shape")],
)
def test_bad_rhs(shape, match):
    with pytest.raises(ValueError, match=match):
        gpchol.cho_solve(np.eye(4), np.ones(shape))


# ---------------------------------------------------------------------- mvn_logpdf


def _scipy_logpdf(y, mean, cov):
    return sst.multivariate_normal(mean, cov).logpdf(y)


@pytest.mark.slow_cases("120-32-composed", "200-64-composed")
@pytest.mark.parametrize("gradient", ["composed", "whole"])
@pytest.mark.parametrize("n, tile", [(1, None), (7, 3), (120, 32), (200, 64)])
def test_mvn_logpdf_value_and_grad(rng, gradient, n, tile):
    cov = random_spd(rng, n)
    y, mu = rng.standard_normal(n), rng.standard_normal(n)
    f = lambda y, m, c: gpchol.mvn_logpdf(y, m, c, gradient=gradient, tile_size=tile)  # noqa: E731
    np.testing.assert_allclose(f(y, mu, cov), _scipy_logpdf(y, mu, cov), rtol=1e-11)

    def ref(y, m, c):
        c = 0.5 * (c + c.T)
        L = jnp.linalg.cholesky(c)
        z = jax.scipy.linalg.solve_triangular(L, y - m, lower=True)
        return -0.5 * (z @ z) - jnp.sum(jnp.log(jnp.diag(L))) - 0.5 * n * jnp.log(2 * jnp.pi)

    for got, want in zip(
        jax.grad(f, argnums=(0, 1, 2))(y, mu, cov),
        jax.jit(jax.grad(ref, argnums=(0, 1, 2)))(y, mu, cov),
        strict=True,
    ):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)


@pytest.mark.slow
@pytest.mark.parametrize("gradient", ["composed", "whole"])
def test_mvn_logpdf_check_grads(rng, gradient):
    n = 6
    cov = random_spd(rng, n)
    y, mu = rng.standard_normal(n), rng.standard_normal(n)
    f = lambda y, m, c: gpchol.mvn_logpdf(y, m, c, gradient=gradient, tile_size=4)  # noqa: E731
    check_grads(f, (y, mu, cov), order=2, modes=("fwd", "rev"))


@pytest.mark.slow_cases("composed")
@pytest.mark.parametrize("gradient", ["composed", "whole"])
def test_mvn_logpdf_broadcasting(rng, gradient):
    n = 8
    cov = random_spd(rng, n, batch=(2, 1))
    y = rng.standard_normal((2, 3, n))
    out = gpchol.mvn_logpdf(y, 0.0, cov, gradient=gradient)
    assert out.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            np.testing.assert_allclose(
                out[i, j], _scipy_logpdf(y[i, j], np.zeros(n), cov[i, 0]), rtol=1e-11
            )
    g = jax.grad(lambda c: gpchol.mvn_logpdf(y, 0.0, c, gradient=gradient).sum())(cov)
    g_ref = jax.jit(
        jax.grad(lambda c: jax.scipy.stats.multivariate_normal.logpdf(y, jnp.zeros(n), c).sum())
    )(cov)
    np.testing.assert_allclose(g, g_ref, rtol=1e-9, atol=1e-11)


def test_mvn_logpdf_jit_vmap_and_failure(rng):
    n = 5
    cov = random_spd(rng, n, batch=(3,))
    y = rng.standard_normal((3, n))
    f = jax.jit(jax.vmap(lambda y, c: gpchol.mvn_logpdf(y, 0.0, c)))
    np.testing.assert_allclose(
        f(y, cov), [_scipy_logpdf(y[i], np.zeros(n), cov[i]) for i in range(3)], rtol=1e-11
    )
    bad = np.diag([1.0, -1.0, 1.0, 1.0, 1.0])
    assert np.isnan(gpchol.mvn_logpdf(y[0], 0.0, bad))
    # n >= 128 on the CPU: the host LAPACK forward, batched under vmap, one failing
    m = 150
    covs = random_spd(rng, m, batch=(2,))
    covs[1, 5, 5] = -1.0
    ys = rng.standard_normal((2, m))
    out = jax.jit(jax.vmap(lambda y, c: gpchol.mvn_logpdf(y, 0.0, c)))(ys, covs)
    assert np.isnan(out[1])
    np.testing.assert_allclose(out[0], _scipy_logpdf(ys[0], np.zeros(m), covs[0]), rtol=1e-11)


def test_mvn_logpdf_bad_input():
    with pytest.raises(ValueError, match="y needs shape"):
        gpchol.mvn_logpdf(np.ones(3), 0.0, np.eye(4))
    with pytest.raises(ValueError, match="mean"):
        gpchol.mvn_logpdf(np.ones(4), np.ones(3), np.eye(4))
    with pytest.raises(ValueError, match="gradient"):
        gpchol.mvn_logpdf(np.ones(4), 0.0, np.eye(4), gradient="fast")


def test_no_python_callback_on_any_step_path(rng):
    """Issue 14: no Python callback in the compiled likelihood step or the factorizations,
    under jit, vmap and grad, whichever path (host LAPACK, device, tiled) they take."""
    from gpchol import kernels as gk

    def loss(p, X, y):
        k = p["a"] * gk.ExpSquared(p["l"])
        return -gpchol.GaussianProcess(k, X, noise=p["s"]).log_marginal_likelihood(y)

    p = {"a": 1.0, "l": 1.0, "s": 0.1}
    programs = []
    for B, n in [(4, 32), (2, 160)]:
        X, y = rng.uniform(0, 5, (B, n, 3)), rng.standard_normal((B, n))
        g = jax.jit(jax.vmap(jax.value_and_grad(loss), in_axes=(None, 0, 0)))
        programs.append(g.lower(p, X, y).as_text())
    a = random_spd(rng, 40, (3,))
    for be in ("xla", "tiled"):
        f = jax.vmap(lambda a, be=be: gpchol.cholesky_with_status(a, backend=be, tile_size=16))
        programs.append(jax.jit(f).lower(a).as_text())
        h = jax.grad(lambda a, be=be: jnp.sum(gpchol.cholesky(a, backend=be)))
        programs.append(jax.jit(h).lower(a[0]).as_text())
    for text in programs:
        assert "callback" not in text.lower()


def test_handlers_compute_the_same_with_either_source_of_lapack(rng):
    """The handlers take SciPy's routines from the OpenBLAS its wheel bundles (no import of
    ``scipy.linalg``) or from ``cython_lapack``/``cython_blas``'s pointers (other builds):
    the same factor, solve and inverse, bit for bit, on one thread and on OpenBLAS's own
    (n = 353 halving with trmm; 700: whole potrf/potri threaded)."""
    from gpchol._internal import cpu_ffi

    if cpu_ffi.cpu_unavailable_reason() is not None:
        pytest.skip(cpu_ffi.cpu_unavailable_reason())
    bundled = cpu_ffi._bundled_openblas()
    if bundled is None:
        pytest.skip("this SciPy bundles no scipy_-prefixed OpenBLAS (the Cython path is used)")
    cython = cpu_ffi._cython_routines()
    assert set(bundled[0]) == set(cython[0]) and all(bundled[0].values())
    assert (bundled[1] is None) == (cython[1] is None)
    lib = cpu_ffi._state["lib"]
    cases = []
    for n in (353, 700):
        a = jnp.asarray(random_spd(rng, n, (2,)))
        y = jnp.asarray(rng.standard_normal((2, n)))
        cases.append((a, y, jnp.linalg.cholesky(a)))
    solve = jax.jit(cpu_ffi.chol_solve)
    inverse = jax.jit(cpu_ffi.potri)

    def run():
        return [[np.asarray(o) for o in (*solve(a, y), inverse(L))] for a, y, L in cases]

    try:
        first = run()
        assert cpu_ffi._hand_over(lib, cython) is None
        second = run()
    finally:
        assert cpu_ffi._hand_over(lib, bundled) is None
    for outs1, outs2 in zip(first, second, strict=True):
        for o1, o2 in zip(outs1, outs2, strict=True):
            np.testing.assert_array_equal(o1, o2)
