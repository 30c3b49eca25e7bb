"""The factorization status is LAPACK's ``potrf`` ``info``, whatever the path (issue 14, item 2).

The reference is reference LAPACK's ``potrf`` ``info`` on the very matrix gpchol factors
(``(A + A^T) / 2``; every matrix here is exactly symmetric), in the same precision:
``scipy.linalg.lapack.{s,d}potrf(a, lower=1)[1]`` plus reference LAPACK's NaN-pivot test,
which SciPy's OpenBLAS ``potrf`` lacks (:func:`lapack_info`). It is checked on a table of
adversarial matrices (non-finite entries, pivots that fail only in float32, duplicated
kernel inputs with zero noise, rank-deficient Gram matrices, negative-definite matrices,
failures next to tile boundaries, tiny and huge scales) for both CPU backends and several
tile sizes, under ``jit``, on natively batched inputs and under ``vmap`` (batches mixing
good and bad matrices), without ``jit``, through ``cholesky(check=True)``'s error, and
through the Gaussian-process and ``mvn_logpdf`` likelihoods.

The factor is all NaN when the status is non-zero, and finite when the status is 0 and
the input is finite. A ``+inf`` diagonal entry is a positive pivot for LAPACK (status 0,
a factor with an ``inf``), so a status of 0 on a non-finite input says nothing more.

Compile time, not run time, is the cost here: one XLA program per (size, dtype, backend,
tile size), reused for every matrix of that size. gpchol's tiled backend unrolls one block
step per tile, so a tile of 1 is tried up to ``n = 8`` and a tile of 7 up to ``n = 65``
(at ``n = 64`` a tile of 1 takes over a minute to compile on the project's 2-core CPU).

The default run (CI) uses a reduced grid: sizes 1, 7, 33, 130 (a tile boundary crossed
at 33 and 130, the host-LAPACK size), the default tile for ``xla``, and the default, 7,
32 and ``n`` for ``tiled``; every recipe still runs at each size. ``GPCHOL_TEST_FULL=1``
in the environment runs the whole grid (sizes 1, 2, 7, 8, 33, 65, 130, 300; tiles None,
1, 7, 32, 64, n), about half an hour on 2 cores.
"""

import functools
import os
import re
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg.lapack as lapack
from helpers import lapack_info, patch_read_at_trace, random_spd

import gpchol
from gpchol import kernels

DTYPES = [np.float32, np.float64]
FULL = os.environ.get("GPCHOL_TEST_FULL", "") not in ("", "0")
SIZES = [1, 2, 7, 8, 33, 65, 130, 300] if FULL else [1, 7, 33, 130]
BASE_SEED = int(os.environ.get("GPCHOL_TEST_SEED", "0"))


# ------------------------------------------------------------------------- references


def lapack_factor(a):
    potrf = lapack.spotrf if a.dtype == np.float32 else lapack.dpotrf
    return np.tril(potrf(np.array(a), lower=1)[0])


def cast(a, dtype):
    """``a`` in ``dtype``; float32 overflows to inf (the huge-scale recipes), as intended."""
    with np.errstate(over="ignore"):
        return np.asarray(a).astype(dtype)


def symmetric(a):
    """The exactly symmetric matrix with ``a``'s lower triangle."""
    low = np.tril(a)
    return low + np.tril(a, -1).T


# ---------------------------------------------------------------------- the recipes
#
# Each recipe is ``(name, n) -> float64 (n, n) exactly symmetric``; the float32 case is its
# cast (which stays symmetric). ``seed(name, n)`` makes each one reproducible and varied by
# GPCHOL_TEST_SEED, printed in every assertion message.


def seed(*parts):
    return (BASE_SEED * 1_000_003 + zlib.crc32(repr(parts).encode())) % (2**32)


def spd(rng, n):
    m = rng.standard_normal((n, n))
    return symmetric(m @ m.T / n + np.eye(n))


def fail_at(rng, n, p):
    """SPD except that the Schur complement at pivot ``p`` is ``-1``: info = p exactly."""
    L = np.linalg.cholesky(spd(rng, n))
    L[p - 1, p - 1] = 0.0
    b = symmetric(L @ L.T)
    b[p - 1, p - 1] -= 1.0
    return b


def nonfinite(rng, n, value, i, j):
    a = spd(rng, n)
    a[i, j] = a[j, i] = value
    return a


def singular_in_f32(rng, n):
    """Integer matrix ``B B^T`` of rank ``n - 1`` (``B`` unit lower-triangular with entries
    in {-1, 0, 1}, last row replaced by a combination of the others) plus ``delta`` on the
    last diagonal entry, below half an ulp in float32 and well above float64's rounding.

    Every step of ``potrf`` is exact on it in both precisions (integers, unit pivots), so
    float32 fails exactly at the last pivot (Schur complement 0) and float64 succeeds
    (Schur complement ``delta``).
    """
    B = np.tril(rng.integers(-1, 2, (n, n)).astype(float), -1) + np.eye(n)
    if n > 1:
        B[-1] = 0.0
        B[-1, :-1] = rng.integers(-1, 2, n - 1)
    a = B @ B.T
    if n == 1:
        a[0, 0] = 0.0
    a[-1, -1] += 2.0**-30 * max(a[-1, -1], 1.0)
    return symmetric(a)


def last_pivot_by_rounding(rng, n):
    """Dense ``[[M, M w], [w^T M, w^T M w (1 + 1e-9)]]``: the last Schur complement is
    ``1e-9 w^T M w`` exactly, so float64 succeeds and float32 fails or not by rounding."""
    M = spd(rng, n - 1)
    w = rng.standard_normal(n - 1)
    a = np.zeros((n, n))
    a[:-1, :-1] = M
    a[:-1, -1] = a[-1, :-1] = M @ w
    a[-1, -1] = (w @ M @ w) * (1 + 1e-9)
    return symmetric(a)


def kernel_matrix(rng, n, *, duplicates, dims=2):
    X = rng.uniform(0.0, 5.0, (n, dims))
    if duplicates and n > 1:
        X[n // 2] = X[0]
        X[-1] = X[min(1, n - 2)]
    K = np.asarray(kernels.ExpSquared(1.5)(jnp.asarray(X), jnp.asarray(X)), np.float64)
    return symmetric(K)


def gram(rng, n, rank, integer):
    if integer:
        Y = rng.integers(-2, 3, (n, rank)).astype(float)
    else:
        Y = rng.standard_normal((n, rank))
    return symmetric(Y @ Y.T)


def recipes(n):
    """``{name: builder()}`` of the adversarial matrices of order ``n``."""
    out = {}
    pivots = sorted({1, (n + 1) // 2, n} | {p for p in (32, 33, 64, 65, 128, 129) if p <= n})
    for p in pivots:
        out[f"fail_at_{p}"] = functools.partial(fail_at, p=p)
    for p in sorted({1, (n + 1) // 2, n}):
        for label, v in (("inf", np.inf), ("-inf", -np.inf), ("nan", np.nan)):
            out[f"diag_{label}_at_{p}"] = functools.partial(nonfinite, value=v, i=p - 1, j=p - 1)
            if n > 1:
                q = p - 1 if p > 1 else 2  # off the diagonal, row p and an earlier/later column
                i, j = max(p, q) - 1, min(p, q) - 1
                out[f"off_{label}_at_{i + 1},{j + 1}"] = functools.partial(
                    nonfinite, value=v, i=i, j=j
                )
    out["singular_in_f32"] = singular_in_f32
    if n > 1:
        out["last_pivot_by_rounding"] = last_pivot_by_rounding
        out["kernel_duplicates_zero_noise"] = functools.partial(kernel_matrix, duplicates=True)
        out["kernel_1d_dense_zero_noise"] = functools.partial(
            kernel_matrix, duplicates=False, dims=1
        )
        out["gram_rank1_integer"] = functools.partial(gram, rank=1, integer=True)
    if n > 3:
        out["gram_rank3_integer"] = functools.partial(gram, rank=3, integer=True)
        out["gram_rank3_random"] = functools.partial(gram, rank=3, integer=False)
    out["spd"] = spd
    out["negative_definite"] = lambda rng, n: -spd(rng, n)
    out["zero"] = lambda rng, n: np.zeros((n, n))
    out["tiny_scale_1e-300"] = lambda rng, n: spd(rng, n) * 1e-300
    out["huge_scale_1e300"] = lambda rng, n: spd(rng, n) * 1e300
    out["near_overflow"] = lambda rng, n: spd(rng, n) * (np.finfo(np.float64).max / (2 * n + 2))
    return out


@functools.cache
def matrix(name, n):
    a = recipes(n)[name](np.random.default_rng(seed(name, n)), n)
    assert a.shape == (n, n) and np.array_equal(a, a.T, equal_nan=True), name
    a.setflags(write=False)
    return a


def case_ids(n):
    return list(recipes(n))


def tiles_for(n, backend):
    """Tile sizes tried: (None, 1, 7, 32, 64, n), as effective (clipped) tiles, deduplicated;
    1 only up to n = 8 and 7 only up to n = 65 for the tiled backend (compile time)."""
    # the xla forward is LAPACK's own: the tile must not matter, a few suffice
    if FULL:
        wanted = [None, 7, n] if backend == "xla" else [None, 1, 7, 32, 64, n]
    else:
        wanted = [None] if backend == "xla" else [None, 7, 32, n]
    out, seen = [], set()
    for t in wanted:
        if t == 1 and n > 8:
            continue
        if t == 7 and n > 65:
            continue
        eff = "default" if t is None else min(t, n)
        if eff not in seen:
            seen.add(eff)
            out.append(t)
    return out


COMBOS = [
    (n, backend, tile)
    for n in SIZES
    for backend in ("xla", "tiled")
    for tile in tiles_for(n, backend)
]
# n >= 130 compiles for tens of seconds per combination: marked slow (they still run)
COMBO_PARAMS = [
    pytest.param(n, b, t, id=f"n{n}-{b}-tile{t}", marks=[pytest.mark.slow] if n >= 130 else [])
    for n, b, t in COMBOS
]


def describe(name, n, dtype, backend, tile):
    return (
        f"recipe {name!r}, n={n}, {np.dtype(dtype).name}, backend={backend!r}, tile_size={tile} "
        f"(seed {seed(name, n)}, GPCHOL_TEST_SEED={BASE_SEED})"
    )


@functools.cache
def jitted(backend, tile):
    return jax.jit(lambda a: gpchol.cholesky_with_status(a, backend=backend, tile_size=tile))


@functools.cache
def vmapped(backend, tile):
    return jax.jit(
        jax.vmap(lambda a: gpchol.cholesky_with_status(a, backend=backend, tile_size=tile))
    )


def residual(L, a):
    """``max |L L^T - A| / max |A|`` in float64."""
    r = np.asarray(L, np.float64)
    a = np.asarray(a, np.float64)
    return float(np.max(np.abs(r @ r.T - a)) / max(float(np.max(np.abs(a))), 1e-300))


def check_factor(a, L, status, what):
    """NaN factor where the status is non-zero; where it is 0 on a finite input, a finite
    factor whose residual is that of LAPACK's own factor up to rounding. XLA's CPU runtime
    flushes subnormal numbers to zero, so at tiny scales (``tiny_scale_1e-300``) products
    below the smallest normal number are lost: the bound allows ``n * tiny`` per entry."""
    L = np.asarray(L)
    assert L.shape == a.shape and L.dtype == a.dtype, what
    if status != 0:
        assert np.all(np.isnan(L)), f"{what}: status {status} but the factor is not all NaN"
    elif np.all(np.isfinite(a)) and a.shape[-1]:
        assert np.all(np.isfinite(L)), f"{what}: status 0 but the factor is not finite"
        n = a.shape[-1]
        fi = np.finfo(a.dtype)
        ftz = 100 * n * float(fi.tiny) / float(np.max(np.abs(a)))
        tol = max(100 * n * float(fi.eps), 10 * residual(lapack_factor(a), a), ftz)
        err = residual(L, a)
        assert err < tol, f"{what}: residual {err:.3g} >= {tol:.3g} (LAPACK's factor's x10)"


# ------------------------------------------------------------------------- the table


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n, backend, tile", COMBO_PARAMS)
def test_status_is_lapack_info_under_jit(n, backend, tile, dtype):
    """Every recipe of order n, one matrix at a time through one jitted program."""
    f = jitted(backend, tile)
    wrong = []
    for name in case_ids(n):
        a = cast(matrix(name, n), dtype)
        ref = int(lapack_info(a))
        L, status = f(a)
        what = describe(name, n, dtype, backend, tile)
        if int(status) != ref:
            wrong.append(f"{what}: LAPACK info {ref}, gpchol status {int(status)}")
            continue
        check_factor(a, L, int(status), what)
    assert not wrong, "status differs from LAPACK potrf's info:\n" + "\n".join(wrong)


@pytest.mark.slow_cases("n33-tiled-tile7-float32")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n, backend, tile", COMBO_PARAMS)
def test_status_is_lapack_info_batched_and_vmapped(n, backend, tile, dtype):
    """All recipes of order n in one batch (good and bad mixed): natively batched input
    under jit and the same batch under jit(vmap) give LAPACK's info per element."""
    names = case_ids(n)
    a = cast(np.stack([matrix(name, n) for name in names]), dtype)
    ref = lapack_info(a)
    assert (ref == 0).any() and (ref != 0).any()  # the batch mixes good and bad
    for label, f in (("batched", jitted(backend, tile)), ("vmap", vmapped(backend, tile))):
        L, status = f(a)
        status = np.asarray(status)
        assert status.shape == (len(names),) and status.dtype == np.int32
        wrong = [
            f"{describe(nm, n, dtype, backend, tile)} [{label}]: LAPACK info {r}, gpchol status {s}"
            for nm, r, s in zip(names, ref, status, strict=True)
            if r != s
        ]
        assert not wrong, "status differs from LAPACK potrf's info:\n" + "\n".join(wrong)
        for k, nm in enumerate(names):
            check_factor(a[k], L[k], int(status[k]), describe(nm, n, dtype, backend, tile))


@pytest.mark.slow_cases("65-xla-float32")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n, backend", [(7, "xla"), (7, "tiled"), (65, "xla")])
def test_status_eager_matches_jit(n, backend, dtype):
    """Without jit (op by op) the status is the same LAPACK info (xla; tiled at one tile:
    op-by-op execution of the tiled backend costs minutes at larger n)."""
    for tile in [None if backend == "xla" else n]:
        for name in case_ids(n):
            a = cast(matrix(name, n), dtype)
            ref = int(lapack_info(a))
            L, status = gpchol.cholesky_with_status(a, backend=backend, tile_size=tile)
            what = describe(name, n, dtype, backend, tile) + " [eager]"
            assert int(status) == ref, f"{what}: LAPACK info {ref}, gpchol status {int(status)}"
            check_factor(a, L, int(status), what)


# --------------------------------------------------------- the recipes themselves


def test_recipes_are_adversarial_as_described():
    """The recipes do what their names say (so the table above tests what it claims)."""
    for n in (2, 8, 65, 300):
        a = matrix("singular_in_f32", n)
        assert lapack_info(a.astype(np.float32)) == n
        assert lapack_info(a) == 0
        for p in (1, (n + 1) // 2, n):
            assert lapack_info(matrix(f"fail_at_{p}", n)) == p
    # the rounding-decided last pivot: float64 always succeeds, float32 fails somewhere
    f64 = [lapack_info(matrix("last_pivot_by_rounding", n)) for n in SIZES[1:]]
    f32 = [lapack_info(matrix("last_pivot_by_rounding", n).astype(np.float32)) for n in SIZES[1:]]
    assert all(i == 0 for i in f64) and any(i != 0 for i in f32)
    # exactly singular kernel matrices (duplicated rows, zero noise)
    K = matrix("kernel_duplicates_zero_noise", 65)
    assert np.array_equal(K[0], K[32])


# ------------------------------------------------------------------ the raised error


def error_cases():
    out = []
    for n in (1, 7, 65) if FULL else (7,):
        for name in case_ids(n):
            for dtype in DTYPES:
                if lapack_info(cast(matrix(name, n), dtype)) != 0:
                    out.append((n, name, dtype))
    return out


ERROR_CASES = error_cases()


@pytest.mark.parametrize("backend", ["xla", "tiled"])
@pytest.mark.parametrize(
    "n, name, dtype",
    ERROR_CASES,
    ids=[f"n{n}-{name}-{np.dtype(d).name}" for n, name, d in ERROR_CASES],
)
def test_error_names_lapack_minor(n, name, dtype, backend):
    a = cast(matrix(name, n), dtype)
    ref = int(lapack_info(a))
    with pytest.raises(gpchol.NotPositiveDefiniteError) as e:
        gpchol.cholesky(a, check=True, backend=backend, tile_size=None if backend == "xla" else n)
    what = describe(name, n, dtype, backend, None)
    assert e.value.pivot == ref, f"{what}: error names pivot {e.value.pivot}, LAPACK {ref}"
    assert f"leading minor of order {ref} " in str(e.value), f"{what}: {e.value}"
    assert f"(pivot {ref}, 1-based)" in str(e.value), f"{what}: {e.value}"
    assert e.value.batch_index == ()


@pytest.mark.parametrize("backend", ["xla", "tiled"])
def test_error_in_batch_names_first_failing_element(backend):
    names = ["spd", "singular_in_f32", "fail_at_4", "kernel_duplicates_zero_noise"]
    a = cast(np.stack([matrix(nm, 7) for nm in names]), np.float32)
    ref = lapack_info(a)
    first = int(np.flatnonzero(ref)[0])
    with pytest.raises(gpchol.NotPositiveDefiniteError) as e:
        gpchol.cholesky(a, check=True, backend=backend)
    assert e.value.batch_index == (first,)
    assert e.value.pivot == ref[first]
    assert re.search(rf"leading minor of order {ref[first]}\b", str(e.value))
    assert f"{int(np.count_nonzero(ref))} failed in all" in str(e.value)


def test_error_survives_pickle_and_copy():
    # BaseException pickles as cls(*args), which missed the keyword-only pivot: a process
    # pool (which pickles what a worker raises) broke instead of handing the error back,
    # and copy.copy raised TypeError.
    import copy
    import pickle

    a = matrix("fail_at_4", 7)
    with pytest.raises(gpchol.NotPositiveDefiniteError) as e:
        gpchol.cholesky(a, check=True, jitter=[1e-12])
    for other in (pickle.loads(pickle.dumps(e.value)), copy.copy(e.value), copy.deepcopy(e.value)):
        assert type(other) is type(e.value) and str(other) == str(e.value)
        assert (other.pivot, other.batch_index, other.min_diagonal, other.jitter) == (
            e.value.pivot,
            e.value.batch_index,
            e.value.min_diagonal,
            e.value.jitter,
        )


def test_error_not_raised_where_lapack_succeeds():
    for n in (7, 65):
        for name in case_ids(n):
            a = matrix(name, n)
            if lapack_info(a) == 0 and np.all(np.isfinite(a)):
                L = gpchol.cholesky(a, check=True)
                assert np.all(np.isfinite(L)), describe(name, n, np.float64, "auto", None)


# ------------------------------------------------------ the likelihoods' status


# device path below 128, host LAPACK (chol_solve) from 128 on
GP_SIZES = [5, 40, 127, 128, 200] if FULL else [40, 127, 200]


def gp_inputs(n, dtype, kind, s):
    rng = np.random.default_rng(seed("gp", n, kind, s))
    X = rng.uniform(0.0, 5.0, (n, 2))
    if kind == "duplicates":
        X[n // 2] = X[0]
        X[-1] = X[1]
    elif kind == "all_same":
        X[:] = X[0]
    elif kind == "clustered":
        X = X[0] + 1e-5 * rng.standard_normal((n, 2))
    y = rng.standard_normal(n)
    return X.astype(dtype), y.astype(dtype)


@functools.cache
def gp_lml(backend, tile, batched):
    def one(X, y):
        gp = gpchol.GaussianProcess(
            kernels.ExpSquared(jnp.asarray(1.5, X.dtype)),
            X,
            noise=jnp.zeros((), X.dtype),
            backend=backend,
            tile_size=tile,
        )
        return gp.log_marginal_likelihood_with_status(y)

    return jax.jit(jax.vmap(one) if batched else one)


@jax.jit
def _gp_cov(X):
    gp = gpchol.GaussianProcess(
        kernels.ExpSquared(jnp.asarray(1.5, X.dtype)), X, noise=jnp.zeros((), X.dtype)
    )
    return gp.covariance_matrix()


def gp_cov(X):
    """``k(X, X) + diag(noise)`` as the likelihood builds it: under ``jit``. The eager
    ``gp.covariance_matrix()`` can differ by an ulp (XLA fuses the kernel differently),
    which on these near-singular matrices changes LAPACK's info (e.g. n = 127 float64
    'distinct': 0 eager, 118 jitted)."""
    return np.asarray(_gp_cov(X))


def gp_info(K):
    """The likelihood reads the lower triangle of k(X, X) as it is (no symmetrization)."""
    return lapack_info(np.tril(K) + np.tril(K, -1).swapaxes(-1, -2))


GP_KINDS = ["duplicates", "all_same", "clustered", "distinct"]


@pytest.mark.slow_cases("127-tiled-32-float64", "200-tiled-32-float32", "200-tiled-32-float64")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("backend, tile", [("auto", None), ("tiled", None), ("tiled", 32)])
@pytest.mark.parametrize("n", GP_SIZES)
def test_gp_likelihood_status_is_lapack_info(n, backend, tile, dtype):
    """Zero noise with duplicated/clustered inputs: the likelihood's status is LAPACK's
    info of the covariance; the value is NaN exactly where the status is non-zero. One
    element at a time and the same inputs as one vmapped batch."""
    Xs, ys = zip(*(gp_inputs(n, dtype, k, 0) for k in GP_KINDS), strict=True)
    f = gp_lml(backend, tile, False)
    got = []
    for kind, X, y in zip(GP_KINDS, Xs, ys, strict=True):
        K = gp_cov(X)
        ref = int(gp_info(K))
        value, status = f(X, y)
        what = f"GP kind={kind} n={n} {np.dtype(dtype).name} backend={backend} tile={tile}"
        assert int(status) == ref, f"{what}: LAPACK info {ref}, status {int(status)}"
        assert bool(np.isnan(value)) == (ref != 0), f"{what}: value {value}, status {ref}"
        got.append(ref)
    values, status = gp_lml(backend, tile, True)(np.stack(Xs), np.stack(ys))
    assert np.asarray(status).tolist() == got, f"vmapped GP n={n} {np.dtype(dtype).name}"
    assert np.isnan(np.asarray(values)).tolist() == [s != 0 for s in got]


@pytest.mark.parametrize("n", [40, 200])
def test_gp_check_error_names_lapack_minor(n):
    X, y = gp_inputs(n, np.float64, "all_same", 0)
    gp = gpchol.GaussianProcess(kernels.ExpSquared(1.5), X, noise=0.0)
    ref = int(gp_info(gp_cov(X)))
    assert ref != 0
    with pytest.raises(gpchol.NotPositiveDefiniteError) as e:
        gp.log_marginal_likelihood(y, check=True)
    assert e.value.pivot == ref
    assert f"leading minor of order {ref} " in str(e.value)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [7, 33, 130])
def test_mvn_logpdf_nan_exactly_where_lapack_fails(n, dtype):
    names = [nm for nm in case_ids(n) if np.all(np.isfinite(matrix(nm, n)))]
    cov = cast(np.stack([matrix(nm, n) for nm in names]), dtype)
    ref = lapack_info(cov)
    y = np.zeros((len(names), n), dtype)
    out = np.asarray(jax.jit(gpchol.mvn_logpdf)(y, np.zeros((), dtype), cov))
    bad = [
        f"{nm}: LAPACK info {r}, logpdf {v}"
        for nm, r, v in zip(names, ref, out, strict=True)
        if np.isnan(v) != (r != 0)
    ]
    assert not bad, f"n={n} {np.dtype(dtype).name}:\n" + "\n".join(bad)


# ------------------------------------------------- the handlers' two layouts agree


def test_handlers_take_empty_matrices_in_either_layout():
    # XLA's CPU compiler divided by zero on a column-major empty operand (SIGFPE)
    from gpchol._internal import cpu_ffi

    if cpu_ffi.cpu_unavailable_reason() is not None:
        pytest.skip(cpu_ffi.cpu_unavailable_reason())
    for batch in ((), (3,)):
        K, r = np.zeros((*batch, 0, 0)), np.zeros((*batch, 0))
        for cm in (False, True):
            L, alpha, quad, logdet, status = cpu_ffi.chol_solve(K, r, column_major=cm)
            assert L.shape == K.shape and alpha.shape == r.shape
            assert np.all(quad == 0) and np.all(logdet == 0) and np.all(status == 0)
            assert cpu_ffi.potri(K, column_major=cm).shape == K.shape
        assert cpu_ffi.trsm(K, r[..., None], left=True, lower=True, transpose=False).size == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [7, 65, 130])
def test_chol_solve_column_major_is_the_same_call(n, dtype):
    """``chol_solve(..., column_major=True)`` (K and L column-major: no relayout pass) is
    the very same LAPACK potrf call as the row-major default: equal factor, log-det and
    status (LAPACK's ``info``) on every adversarial matrix (junk above the diagonal
    ignored), the solves equal to rounding, and ``potri`` of its factor in place gives the
    symmetric inverse."""
    from gpchol._internal import cpu_ffi

    if cpu_ffi.cpu_unavailable_reason() is not None:
        pytest.skip(cpu_ffi.cpu_unavailable_reason())
    names = case_ids(n)
    a = np.stack([matrix(name, n) for name in names]).astype(dtype)
    rng = np.random.default_rng(seed("layouts", n))
    # only the lower triangle is read: junk above it must not matter in either layout
    junk = np.triu(rng.standard_normal(a.shape), 1).astype(dtype)
    a = np.tril(a) + junk
    r = rng.standard_normal(a.shape[:-1]).astype(dtype)
    rows = jax.jit(lambda a, r: cpu_ffi.chol_solve(a, r))(a, r)
    cols = jax.jit(lambda a, r: cpu_ffi.chol_solve(a, r, column_major=True))(a, r)
    rows, cols = [np.asarray(x) for x in rows], [np.asarray(x) for x in cols]
    sym = np.tril(a) + np.swapaxes(np.tril(a, -1), -1, -2)
    np.testing.assert_array_equal(cols[4], lapack_info(sym))
    for i in (0, 3, 4):  # the factor, log-det and status: bit for bit
        np.testing.assert_array_equal(rows[i], cols[i])
    # the solves: BLAS trsv on L (column-major) rather than on L^T, so rounding may differ
    tol = 1e-12 if dtype == np.float64 else 1e-4
    for i in (1, 2):
        atol = tol * np.nanmax(np.abs(rows[i]))
        np.testing.assert_allclose(rows[i], cols[i], rtol=tol, atol=atol)
    ok = cols[4] == 0
    assert ok.any() and (~ok).any(), "the cases should mix successes and failures"
    # symmetric=True (no mirror pass) on a matrix that is symmetric: the same call exactly
    plain = jax.jit(lambda a, r: cpu_ffi.chol_solve(a, r))(sym, r)
    fast = jax.jit(lambda a, r: cpu_ffi.chol_solve(a, r, symmetric=True))(sym, r)
    for x, y in zip(plain, fast, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

    # potri of the column-major factor, in place, against NumPy (well-conditioned inputs:
    # the adversarial ones above are near-singular, their inverses meaningless)
    b = random_spd(np.random.default_rng(seed("layouts-inv", n)), n, (3,)).astype(dtype)

    def inverse(a):
        L = cpu_ffi.chol_solve(a, jnp.zeros(a.shape[:-1], a.dtype), column_major=True)[0]
        return cpu_ffi.potri(L, column_major=True)

    got = np.asarray(jax.jit(inverse)(b))
    np.testing.assert_array_equal(got, np.swapaxes(got, -1, -2))
    want = np.linalg.inv(b.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e3 * tol, atol=1e3 * tol * np.abs(want).max())


def test_openblas_thread_functions_are_found_and_work():
    # without the BLAS-3 routines of the split factor, the handlers run potrf/potri above
    # n = 8192 on one OpenBLAS thread (SciPy's OpenBLAS 0.3.30 segfaults in its threaded
    # dsyrk, and so dpotrf, at n = 23,100 on this project's machine); they need OpenBLAS's
    # own get/set_num_threads, found here
    import ctypes
    import sys

    from gpchol._internal import cpu_ffi as ffi

    if ffi.cpu_unavailable_reason() is not None or not sys.platform.startswith("linux"):
        pytest.skip("the compiled CPU handlers or /proc/self/maps are not available")
    import scipy

    funcs = ffi._openblas_thread_functions()
    if funcs is None:
        pytest.skip(f"SciPy {scipy.__version__} does not ship its own OpenBLAS here")
    get = ctypes.CFUNCTYPE(ctypes.c_int)(funcs[0])
    set_ = ctypes.CFUNCTYPE(None, ctypes.c_int)(funcs[1])
    before = get()
    assert before >= 1
    try:
        set_(1)
        assert get() == 1
    finally:
        set_(before)
    assert get() == before


# ------------------------------------- the handlers' split factor and inverse (large n)


@pytest.mark.slow_cases("300-299-float64", "300-64-float32")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n, split_above", [(101, 1), (130, 7), (130, 64), (300, 64), (300, 299)])
def test_split_factor_and_inverse_match_lapack(n, split_above, dtype):
    """Above ``split_above`` the handlers factor and invert by halving (BLAS-3 on blocks:
    SciPy's OpenBLAS crashes in its threaded syrk/potrf from order ~23,000 on); forced here
    at small n, the factor, log-det, solve and inverse agree with one LAPACK call, and the
    status is LAPACK's ``info`` where the failing pivot is clear-cut (a negative or NaN
    pivot in either half, or at the halves' border)."""
    from gpchol._internal import cpu_ffi

    if cpu_ffi.cpu_unavailable_reason() is not None:
        pytest.skip(cpu_ffi.cpu_unavailable_reason())
    s = seed("split", n, split_above, np.dtype(dtype).name)
    rng = np.random.default_rng(s)
    msg = f"n={n} split_above={split_above} {np.dtype(dtype).name} seed={s}"
    tol = 1e-12 if dtype == np.float64 else 2e-5
    a = random_spd(rng, n, (3,)).astype(dtype)
    r = rng.standard_normal((3, n)).astype(dtype)
    whole = [np.asarray(x) for x in jax.jit(lambda a, r: cpu_ffi.chol_solve(a, r))(a, r)]
    for column_major in (False, True):

        def run(a, r, cm=column_major):
            return cpu_ffi.chol_solve(a, r, column_major=cm, split_above=split_above)

        split = [np.asarray(x) for x in jax.jit(run)(a, r)]
        np.testing.assert_array_equal(split[4], 0, err_msg=msg)
        for i in range(4):  # L, alpha, quad, logdet
            scale = np.abs(whole[i]).max()
            np.testing.assert_allclose(split[i], whole[i], rtol=tol, atol=tol * scale, err_msg=msg)
        np.testing.assert_array_equal(np.triu(split[0], 1), 0, err_msg=msg)

    # the inverse from the factor, in each of the handler's layouts, against NumPy
    L = np.linalg.cholesky(a.astype(np.float64)).astype(dtype)
    want = np.linalg.inv(a.astype(np.float64))
    got = {
        "lower": cpu_ffi.potri(jnp.asarray(L), split_above=split_above),
        "upper": cpu_ffi.potri(
            jnp.asarray(np.swapaxes(L, -1, -2)), upper=True, split_above=split_above
        ),
        "column-major": jax.jit(
            lambda f: cpu_ffi.potri(f, column_major=True, split_above=split_above)
        )(jnp.asarray(L)),
    }
    for name, inv in got.items():
        inv = np.asarray(inv)
        np.testing.assert_array_equal(inv, np.swapaxes(inv, -1, -2), err_msg=f"{msg} {name}")
        np.testing.assert_allclose(
            inv, want, rtol=1e3 * tol, atol=1e3 * tol * np.abs(want).max(), err_msg=f"{msg} {name}"
        )
    # a factor with an exact zero on its diagonal: NaN, as potri's info > 0
    L0 = L[0].copy()
    L0[n - 1 - n // 3, n - 1 - n // 3] = 0
    assert np.isnan(np.asarray(cpu_ffi.potri(jnp.asarray(L0), split_above=split_above))).all()

    # clear-cut failures: the pivot k is negative (or NaN) whatever the order of the sums
    n1 = n // 2
    for k in sorted({0, max(n1 - 1, 0), n1, n - 1}):
        for bad in (-1.0, np.nan):
            b = random_spd(rng, n).astype(dtype)
            if np.isnan(bad):
                b[k, : k + 1] = np.nan  # row k of the lower triangle
            else:
                b[k, k] = bad
            want_info = k + 1
            got_solve = int(
                cpu_ffi.chol_solve(jnp.asarray(b), jnp.zeros(n, dtype), split_above=split_above)[4]
            )
            got_info = int(
                cpu_ffi.potrf_info(jnp.asarray(b), jnp.asarray(True), split_above=split_above)
            )
            assert (got_solve, got_info) == (want_info, want_info), f"{msg} k={k} bad={bad}"
            assert int(lapack_info(symmetric(b))) == want_info, f"{msg} k={k}: the reference"


def test_split_above_must_be_a_positive_int():
    from gpchol._internal import cpu_ffi

    if cpu_ffi.cpu_unavailable_reason() is not None:
        pytest.skip(cpu_ffi.cpu_unavailable_reason())
    for bad in (0, -5, True):
        with pytest.raises(ValueError, match="split_above"):
            cpu_ffi.potri(jnp.eye(3), split_above=bad)


@pytest.mark.slow_cases("float32")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_large_cpu_factor_goes_through_the_handlers(monkeypatch, request, dtype):
    """``gpchol.cholesky`` on the CPU above ``HOST_FACTOR_ABOVE`` factors by the handlers
    (the same LAPACK potrf, split: one threaded OpenBLAS potrf call crashed the process at
    n = 24,000 here); forced at n = 130: the same factor, LAPACK's status (NaN pivot
    included) and gradient as jax.lax.linalg.cholesky's path."""
    from gpchol._internal import cpu_ffi, host_lapack

    if cpu_ffi.cpu_unavailable_reason() is not None:
        pytest.skip(cpu_ffi.cpu_unavailable_reason())
    n = 130
    s = seed("large-cpu-factor", np.dtype(dtype).name)
    rng = np.random.default_rng(s)
    a = random_spd(rng, n, (2,)).astype(dtype)
    bad = a.copy()
    bad[1, 70, 70] = -1.0  # the second matrix fails at pivot 71
    bad[0, 100, :101] = np.nan  # the first at pivot 101 (NaN)
    bad[0, :101, 100] = np.nan

    def run():
        f = jax.jit(lambda a: gpchol.cholesky_with_status(a))
        # the routing is seen on one matrix: a batch is factored by the handlers on either
        # path (gpchol._linalg.triangular.cholesky, one matrix after another)
        return [np.asarray(x) for x in (*f(a), *f(bad))], f.lower(a[0]).as_text()

    def route_above(n: int) -> None:
        patch_read_at_trace(monkeypatch, request, host_lapack, "HOST_FACTOR_ABOVE", n)

    (L_xla, st_xla, Lb_xla, stb_xla), hlo_xla = run()
    route_above(64)
    (L_host, st_host, Lb_host, stb_host), hlo_host = run()
    # the XLA path factors by jaxlib's potrf (and holds the handler only in its rare
    # branch, a factor that failed where the status search did not); the host path never
    assert "gpchol_cpu_chol_solve" in hlo_host
    assert "lapack_" in hlo_xla and "lapack_" not in hlo_host
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(L_host, L_xla, rtol=tol, atol=tol, err_msg=f"seed={s}")
    np.testing.assert_array_equal(st_host, 0)
    np.testing.assert_array_equal(stb_host, [101, 71], err_msg=f"seed={s}")
    np.testing.assert_array_equal(st_xla, 0)
    np.testing.assert_array_equal(stb_host, stb_xla)
    assert np.isnan(Lb_host).all() and np.isnan(Lb_xla).all()
    # the rule around the forward is unchanged: the same gradient
    w = jnp.asarray(rng.standard_normal((n, n)).astype(dtype))

    def loss(a):
        return jnp.sum(w * gpchol.cholesky(a))

    g_host = np.asarray(jax.jit(jax.grad(loss))(a[0]))
    route_above(10**9)
    g_xla = np.asarray(jax.jit(jax.grad(loss))(a[0]))
    np.testing.assert_allclose(g_host, g_xla, rtol=1e3 * tol, atol=1e3 * tol * np.abs(g_xla).max())
