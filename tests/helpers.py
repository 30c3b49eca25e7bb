"""Shared test helpers (imported by the test modules)."""

import os
import re

import numpy as np
import scipy.linalg.lapack as lapack
from threadpoolctl import threadpool_limits

from gpchol._internal import cpu_ffi


def benchmark_env() -> dict:
    """``os.environ`` for a benchmark run as a child process (``python -m benchmarks...``):
    the repository on ``PYTHONPATH``, and none of the session's ``XLA_FLAGS``: one CPU
    device and XLA's default level, as a user runs the benchmarks."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("XLA_FLAGS", None)
    return env


def child_xla_flags(env: dict) -> dict:
    """``env`` for a child process (a notebook, an example, an upstream test suite): the
    session's ``XLA_FLAGS`` without its 8 simulated devices (the child sets up its own
    devices, one by default), with the session's LLVM level kept (``-O0`` unless
    ``GPCHOL_TEST_XLA_OPT=default``; the top-level ``conftest.py``)."""
    env = dict(env)
    flags = [f for f in env.pop("XLA_FLAGS", "").split() if "device_count" not in f]
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    return env


def random_spd(rng, n, batch=(), dtype=np.float64, cond=None):
    """Random well-conditioned SPD matrices of shape ``batch + (n, n)`` (float64 made)."""
    m = rng.standard_normal(batch + (n, n))
    a = m @ np.swapaxes(m, -1, -2) / max(n, 1) + np.eye(n)
    return a.astype(dtype)


def lapack_info(a):
    """Reference LAPACK ``potrf``'s ``info`` for each matrix of ``a`` (``(..., n, n)``).

    SciPy's ``?potrf(a, lower=1)`` in the same precision, plus reference LAPACK's NaN
    test (``dpotrf2``: a pivot fails when ``ajj <= 0`` or ``ajj`` is NaN), which the
    OpenBLAS ``potrf`` shipped with SciPy lacks: where it reports success, the first NaN
    on its factor's diagonal is the first failing pivot. (After a NaN pivot every later
    pivot is NaN, so OpenBLAS cannot have failed later for another reason.)
    """
    a = np.asarray(a)
    if a.shape[-1] == 0:
        return np.zeros(a.shape[:-2], int)
    potrf = lapack.spotrf if a.dtype == np.float32 else lapack.dpotrf
    # OpenBLAS's threads as gpchol's handlers use them: where a pivot fails only by
    # rounding, which one LAPACK reports can depend on the thread count
    threads = 1 if a.shape[-1] <= cpu_ffi.one_thread_max_n() else None
    out = []
    with threadpool_limits(threads, user_api="blas"):
        infos = [potrf(np.array(m), lower=1) for m in a.reshape((-1,) + a.shape[-2:])]
    for c, info in infos:
        if info == 0:
            nan = np.flatnonzero(np.isnan(np.diagonal(c)))
            info = int(nan[0]) + 1 if nan.size else 0
        out.append(int(info))
    return np.asarray(out, int).reshape(a.shape[:-2])


def backend_compiles(run) -> list[str]:
    """Names of the XLA programs compiled (by the backend) while ``run()`` runs, from JAX's
    monitoring events. A program read back from the session's persistent compilation
    cache counts too (JAX reports the read inside the same event): what is counted is each
    program that JAX's in-memory caches did not hold."""
    import jax

    names: list[str] = []

    def listen(event: str, secs: float, **kw: object) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            names.append(str(kw.get("fun_name")))

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        run()
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    return names


def patch_read_at_trace(monkeypatch, request, target, name, value) -> None:
    """``monkeypatch.setattr(target, name, value)`` for something gpchol reads when it traces
    a program (a routing switch, a rule looked up by name): JAX's caches are cleared now,
    since gpchol's module-level compiled programs would keep what they traced, and again
    when the test ends, so that the tests after it do not keep the patched programs."""
    import jax

    monkeypatch.setattr(target, name, value)
    jax.clear_caches()
    request.addfinalizer(jax.clear_caches)


#: pytest options of an upstream suite run in a subprocess: its own session, without this
#: suite's cache, xdist or pytest-benchmark (where installed, it read the xdist worker's
#: variables and turned its "xdist is active" warning into an error under upstream filters)
FRESH_PYTEST_ARGS = ("-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:benchmark")


def fresh_pytest_env(env: dict) -> dict:
    """``env`` without the ``PYTEST_*`` variables of this (possibly xdist worker) session."""
    return {k: v for k, v in env.items() if not k.startswith("PYTEST_")}


#: what depends only on the content of a saved file's arrays: an arrays file's name
#: (``<stem>.<16 hex>.npz``), its size, and SHA-256 digests
_CONTENT_ADDRESS = re.compile(r'[0-9a-f]{64}|\.[0-9a-f]{16}\.npz"|"bytes": \d+')


def assert_same_saved_files(new, old) -> None:
    """The JSON file ``new`` and its arrays file equal ``old`` and its arrays file.

    The arrays files hold the same arrays (names, order, dtypes, shapes, bytes); the JSON
    files are equal byte for byte but for content addresses (the arrays file's name and
    size, SHA-256 digests), which follow from the arrays file's bytes. Where those bytes
    are equal too (same NumPy and zip writer), the JSON files are equal byte for byte.
    """
    new_text, old_text = new.read_text(), old.read_text()
    npz = re.compile(r'"([^"/]+\.[0-9a-f]{16}\.npz)"')
    new_npz, old_npz = set(npz.findall(new_text)), set(npz.findall(old_text))
    assert len(new_npz) == len(old_npz) <= 1, (new_npz, old_npz)
    for n, o in zip(new_npz, old_npz, strict=True):
        with np.load(new.parent / n, allow_pickle=False) as a:
            with np.load(old.parent / o, allow_pickle=False) as b:
                assert a.files == b.files, (a.files, b.files)
                for k in a.files:
                    x, y = a[k], b[k]
                    assert (x.dtype, x.shape) == (y.dtype, y.shape), k
                    assert x.tobytes() == y.tobytes(), k
        if (new.parent / n).read_bytes() == (old.parent / o).read_bytes():
            assert new_text == old_text
    assert _CONTENT_ADDRESS.sub("#", new_text) == _CONTENT_ADDRESS.sub("#", old_text)
    if not new_npz:
        assert new_text == old_text
