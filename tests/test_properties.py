"""Property-based tests of the public API (issue 14, item 7), with hypothesis.

Shapes (batch dimensions, ``n`` including 0 and 1), dtypes, scales from 1e-150 to 1e150,
non-finite entries, failing factorizations under ``vmap`` and CLI inputs are drawn by
hypothesis; the linear algebra and the GP likelihood are compared with float64 NumPy /
LAPACK references, the status with LAPACK ``potrf``'s ``info``.

Reproducibility: the examples are derandomized (the same on every run) unless the
environment variable ``GPCHOL_TEST_SEED`` is set, which seeds hypothesis instead; either
way a failure prints the falsifying example and the ``@reproduce_failure`` blob. No
example database is written. Each test draws 10-30 examples over few distinct shapes
(XLA compiles once per shape), so the module runs in well under a minute on 2 cores.
"""

import functools
import math
import os
import string

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import lapack_info
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

import gpchol
from gpchol import kernels
from gpchol.cli import main as cli_main

_SEED = os.environ.get("GPCHOL_TEST_SEED")


def prop(max_examples):
    """The settings of every property here, plus the seed from GPCHOL_TEST_SEED if set."""
    s = settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=_SEED is None,
        database=None,
        print_blob=True,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )

    def wrap(f):
        f = s(f)
        return hypothesis_seed(int(_SEED))(f) if _SEED is not None else f

    return wrap


DTYPES = st.sampled_from([np.float32, np.float64])
# (batch, n) pairs: a few shapes, so that XLA compiles few programs
SHAPES = st.sampled_from([((), 0), ((), 1), ((), 5), ((3,), 2), ((2, 2), 3), ((1,), 8)])
SEEDS = st.integers(0, 2**32 - 1)
BACKENDS = st.sampled_from(["xla", "tiled"])
EPS = {np.float32: float(np.finfo(np.float32).eps), np.float64: float(np.finfo(np.float64).eps)}


def spd(seed, batch, n, dtype, scale=1.0):
    """Well-conditioned SPD ``batch + (n, n)``, exactly symmetric, times ``scale``."""
    rng = np.random.default_rng(seed)
    m = rng.standard_normal(batch + (n, n))
    a = m @ np.swapaxes(m, -1, -2) / max(n, 1) + np.eye(n)
    a = np.tril(a) + np.swapaxes(np.tril(a, -1), -1, -2)
    with np.errstate(over="ignore", under="ignore"):
        return (a * scale).astype(dtype)


def rel_err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    if ref.size == 0:
        return 0.0
    return float(np.max(np.abs(x - ref)) / max(np.max(np.abs(ref)), 1e-300))


# ------------------------------------------------------------------ linear algebra


@functools.cache
def chol_program(backend):
    return jax.jit(lambda a: gpchol.cholesky_with_status(a, backend=backend))


@functools.cache
def vmap_program(backend):
    return jax.jit(jax.vmap(lambda a: gpchol.cholesky_with_status(a, backend=backend)))


@functools.cache
def mvn_program(backend):
    return jax.jit(lambda y, m, c: gpchol.mvn_logpdf(y, m, c, backend=backend))


@functools.cache
def linalg_program(backend):
    """cholesky_with_status, cho_solve (vector and matrix) and logdet as one jitted
    program per backend (XLA compiles it once per shape and dtype drawn)."""

    def run(a, b, B):
        L, status = gpchol.cholesky_with_status(a, backend=backend)
        return L, status, gpchol.cho_solve(L, b), gpchol.cho_solve(L, B), gpchol.logdet(L)

    return jax.jit(run)


@pytest.mark.slow
@prop(30)
@given(seed=SEEDS, shape=SHAPES, dtype=DTYPES, backend=BACKENDS)
def test_cholesky_solve_logdet_match_numpy(seed, shape, dtype, backend):
    batch, n = shape
    a = spd(seed, batch, n, dtype)
    rng = np.random.default_rng(seed + 1)
    b = rng.standard_normal(batch + (n,)).astype(dtype)
    B = rng.standard_normal(batch + (n, 2)).astype(dtype)
    L, status, x, X, ld = linalg_program(backend)(a, b, B)
    assert L.shape == a.shape and L.dtype == dtype and status.shape == batch
    assert np.all(np.asarray(status) == 0)
    a64 = a.astype(np.float64)
    tol = 50 * max(n, 1) * EPS[dtype]
    ref = np.linalg.cholesky(a64) if n else np.zeros(a.shape)
    assert rel_err(L, ref) < tol
    assert np.all(np.triu(np.asarray(L), 1) == 0)
    assert x.shape == b.shape and x.dtype == dtype and X.shape == B.shape
    if n:
        xref = np.linalg.solve(a64, b.astype(np.float64)[..., None])[..., 0]
        assert rel_err(x, xref) < 10 * tol
        assert rel_err(X, np.linalg.solve(a64, B.astype(np.float64))) < 10 * tol
    assert ld.shape == batch and ld.dtype == dtype
    sign, ref_ld = np.linalg.slogdet(a64) if n else (np.ones(batch), np.zeros(batch))
    assert np.all(sign == 1)
    assert np.allclose(np.asarray(ld, np.float64), ref_ld, rtol=tol, atol=tol * max(n, 1))


@pytest.mark.slow
@prop(30)
@given(seed=SEEDS, n=st.sampled_from([1, 2, 5, 8]), exponent=st.integers(-150, 150))
def test_scale_invariance_float64(seed, n, exponent):
    """An SPD matrix times 1e-150..1e150 factors in float64 (status 0) with a small
    relative residual, on both backends, as LAPACK does."""
    scale = 10.0**exponent
    a = spd(seed, (), n, np.float64, scale)
    assert lapack_info(a) == 0
    for backend in ("xla", "tiled"):
        L, status = chol_program(backend)(a)
        assert int(status) == 0, (backend, scale)
        L = np.asarray(L)
        res = np.max(np.abs(L @ L.T - a)) / np.max(np.abs(a))
        assert res < 50 * n * EPS[np.float64], (backend, scale, res)
        ld = 2 * np.sum(np.log(np.diag(L)))
        assert np.isclose(ld, np.linalg.slogdet(a)[1], rtol=1e-10, atol=1e-8)


@pytest.mark.slow
@prop(30)
@given(seed=SEEDS, n=st.sampled_from([1, 2, 5, 8]), exponent=st.integers(-150, 150))
def test_scale_status_float32_is_lapack_info(seed, n, exponent):
    """The same matrices in float32, where 1e-150..1e150 underflow or overflow: whatever
    happens, the status is LAPACK's ``spotrf`` info and a finite factor has a small
    relative residual."""
    a = spd(seed, (), n, np.float32, 10.0**exponent)
    ref = int(lapack_info(a))
    for backend in ("xla", "tiled"):
        L, status = chol_program(backend)(a)
        assert int(status) == ref, (backend, exponent, ref, int(status))
        L = np.asarray(L, np.float64)
        if ref != 0:
            assert np.all(np.isnan(L))
        elif np.all(np.isfinite(a)) and np.max(np.abs(a)) > 1e-30:
            res = np.max(np.abs(L @ L.T - a)) / np.max(np.abs(a))
            assert res < 50 * n * EPS[np.float32], (backend, exponent, res)


@pytest.mark.slow
@prop(30)
@given(
    seed=SEEDS,
    n=st.sampled_from([1, 2, 3, 8]),
    dtype=DTYPES,
    backend=BACKENDS,
    entries=st.lists(
        st.tuples(st.integers(0, 7), st.integers(0, 7), st.sampled_from([np.nan, np.inf, -np.inf])),
        min_size=1,
        max_size=3,
    ),
)
def test_non_finite_entries_status_is_lapack_info(seed, n, dtype, backend, entries):
    """NaN/inf anywhere (kept symmetric): no exception, status = LAPACK info, NaN factor
    when the status is non-zero; the likelihood is NaN or finite, never an error."""
    a = spd(seed, (), n, dtype)
    for i, j, v in entries:
        i, j = i % n, j % n
        a[i, j] = a[j, i] = v
    ref = int(lapack_info(a))
    L, status = chol_program(backend)(a)
    assert int(status) == ref, (a, ref, int(status))
    if ref != 0:
        assert np.all(np.isnan(np.asarray(L)))
    lp = mvn_program(backend)(np.zeros(n, dtype), np.zeros(n, dtype), a)
    assert lp.shape == () and lp.dtype == dtype
    if ref != 0:
        assert np.isnan(lp)


@pytest.mark.slow
@prop(20)
@given(
    seed=SEEDS,
    n=st.sampled_from([1, 4, 9]),
    dtype=DTYPES,
    fails=st.lists(st.one_of(st.none(), st.integers(1, 9)), min_size=4, max_size=4),
)
def test_failing_factorizations_under_vmap(seed, n, dtype, fails):
    """A batch where chosen elements fail at a chosen pivot (Schur complement -1 there):
    under jit(vmap) the status is LAPACK's info per element, for both backends."""
    a = spd(seed, (4,), n, np.float64)
    for k, p in enumerate(fails):
        if p is None:
            continue
        p = (p - 1) % n + 1
        L = np.linalg.cholesky(a[k])
        L[p - 1, p - 1] = 0.0
        b = L @ L.T
        b = np.tril(b) + np.tril(b, -1).T
        b[p - 1, p - 1] -= 1.0
        a[k] = b
    a = a.astype(dtype)
    ref = lapack_info(a)
    for backend in ("xla", "tiled"):
        L, status = vmap_program(backend)(a)
        assert np.asarray(status).tolist() == ref.tolist(), backend
        for k in range(4):
            assert np.all(np.isnan(L[k])) == (ref[k] != 0)


# ------------------------------------------------------------- Gaussian densities


@pytest.mark.slow
@prop(25)
@given(seed=SEEDS, shape=SHAPES, dtype=DTYPES, mean_scalar=st.booleans())
def test_mvn_logpdf_matches_numpy(seed, shape, dtype, mean_scalar):
    batch, n = shape
    cov = spd(seed, batch, n, dtype)
    rng = np.random.default_rng(seed + 2)
    y = rng.standard_normal(batch + (n,)).astype(dtype)
    mean = dtype(0.5) if mean_scalar else rng.standard_normal((n,)).astype(dtype)
    out = mvn_program("auto")(y, mean, cov)
    assert out.shape == batch and out.dtype == dtype
    c, r = cov.astype(np.float64), (y - mean).astype(np.float64)
    if n:
        quad = np.einsum("...i,...i->...", r, np.linalg.solve(c, r[..., None])[..., 0])
        ref = -0.5 * (quad + np.linalg.slogdet(c)[1] + n * math.log(2 * math.pi))
    else:
        ref = np.zeros(batch)
    tol = 100 * max(n, 1) * EPS[dtype]
    assert np.allclose(np.asarray(out, np.float64), ref, rtol=tol, atol=tol * max(n, 1))


def gp_reference(X, y, lengthscale, amp, noise):
    X, y = np.asarray(X, np.float64), np.asarray(y, np.float64)
    n = X.shape[0]
    if n == 0:
        return 0.0
    d2 = np.sum((X[:, None, :] - X[None, :, :]) ** 2, axis=-1)
    K = amp * np.exp(-0.5 * d2 / lengthscale**2) + noise * np.eye(n)
    L = np.linalg.cholesky(K)
    alpha = np.linalg.solve(K, y)
    return float(-0.5 * y @ alpha - np.sum(np.log(np.diag(L))) - 0.5 * n * math.log(2 * math.pi))


@functools.cache
def gp_program():
    return jax.jit(lambda g, y: g.log_marginal_likelihood_with_status(y))


@prop(20)
@given(
    seed=SEEDS,
    shape=st.sampled_from([(0, 1), (1, 1), (7, 3), (130, 2)]),
    dtype=DTYPES,
    lengthscale=st.floats(0.3, 3.0),
    amp=st.floats(0.1, 10.0),
    noise=st.floats(0.05, 1.0),
)
def test_gp_log_likelihood_matches_numpy(seed, shape, dtype, lengthscale, amp, noise):
    """GaussianProcess.log_marginal_likelihood (device path below n = 128, host LAPACK
    above) against a float64 NumPy reference, with status 0."""
    n, d = shape
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 5, (n, d)).astype(dtype)
    y = rng.standard_normal(n).astype(dtype)
    k = jnp.asarray(amp, dtype) * kernels.ExpSquared(jnp.asarray(lengthscale, dtype))
    gp = gpchol.GaussianProcess(k, X, noise=jnp.asarray(noise, dtype))
    value, status = gp_program()(gp, y)
    assert int(status) == 0 and value.shape == () and value.dtype == dtype
    ref = gp_reference(X, y, dtype(lengthscale), dtype(amp), dtype(noise))
    tol = (2e-3 if dtype == np.float32 else 1e-8) * max(1.0, abs(ref))
    assert abs(float(value) - ref) < tol, (float(value), ref)


# ------------------------------------------------------------------------- the CLI

NAMES = st.text(string.ascii_letters + "_ ", min_size=0, max_size=4)
CELLS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(-10, 10).map(lambda v: f"{v:.3f}"),
    st.sampled_from(["", "nan", "inf", "-inf", "abc", "1e400", "1e200", "-1e200", " ", '"']),
)


@st.composite
def csv_files(draw):
    ncols = draw(st.integers(1, 3))
    header = draw(
        st.lists(st.sampled_from(["t", "x", "y", "z", "", "t y"]), min_size=ncols, max_size=ncols)
    )
    nrows = draw(st.integers(0, 6))
    regular = draw(st.booleans())
    rows = []
    for i in range(nrows):
        if regular:
            rows.append([f"{i * 0.7 + j:.3f}" for j in range(ncols)])
        else:
            width = draw(st.integers(0, ncols + 1))
            rows.append(draw(st.lists(CELLS, min_size=width, max_size=width)))
    text = "\n".join([",".join(header)] + [",".join(r) for r in rows])
    if draw(st.booleans()):
        text += "\n"
    return text, header


def assert_clean_cli(rc, out, err):
    """Exit 0, or a non-zero exit with one error line: never a traceback."""
    assert "Traceback" not in out and "Traceback" not in err, err
    assert isinstance(rc, int)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert all(ln.startswith("gpchol:") for ln in lines), err
    if rc != 0:
        errors = [ln for ln in lines if ln.startswith("gpchol: error") or "internal" in ln]
        assert len(errors) == 1, err
        assert "internal error" not in errors[0], err


@pytest.mark.slow
@prop(25)
@given(
    csv=csv_files(),
    xcol=st.sampled_from(["t", "x", "t,x", "q", "", "t,t"]),
    ycol=st.sampled_from(["y", "z", "t", "", "nope"]),
    kernel=st.sampled_from([None, "rbf+white", "matern52*rbf", "rbf+", "nonsense", ""]),
    dropna=st.booleans(),
)
def test_cli_fit_on_generated_csv_never_tracebacks(
    tmp_path_factory, csv, xcol, ycol, kernel, dropna, capsys
):
    text, _ = csv
    d = tmp_path_factory.mktemp("cli")
    path = d / "data.csv"
    path.write_text(text)
    argv = [
        "fit",
        "--csv",
        str(path),
        "--x",
        xcol,
        "--y",
        ycol,
        "--steps",
        "2",
        "--no-plot",
        "--quiet",
        "--out",
        str(d / "model.json"),
    ]
    if kernel is not None:
        argv += ["--kernel", kernel]
    if dropna:
        argv.append("--dropna")
    capsys.readouterr()
    rc = cli_main(argv)
    out, err = capsys.readouterr()
    assert_clean_cli(rc, out, err)


@prop(15)
@given(
    args=st.lists(
        st.sampled_from(
            [
                "fit",
                "predict",
                "check",
                "--steps",
                "-1",
                "0",
                "x",
                "--csv",
                "--n",
                "1e9",
                "--model",
                "--tile-size",
                "--float32",
                "--nope",
                "/nonexistent/file.csv",
            ]
        ),
        min_size=1,
        max_size=4,
    )
)
def test_cli_bad_arguments_never_traceback(args, capsys):
    """Argument lists that are (almost always) wrong: no traceback; bad input gives a
    non-zero exit with one error line. ``check`` with a valid ``--n`` runs, so it is
    given a tiny ``--n`` whenever it would otherwise run a large default check, and
    ``fit`` always a ``--csv`` (the default CO2 fit takes minutes)."""
    if args[0] == "check" and "--n" not in args:
        args = [*args, "--n", "4"]
    if args[0] == "fit" and "--csv" not in args:  # not the default CO2 fit (minutes)
        args = [*args, "--csv", "/nonexistent/file.csv"]
    capsys.readouterr()
    rc = cli_main(args)
    out, err = capsys.readouterr()
    assert_clean_cli(rc, out, err)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__, "-q"]))
