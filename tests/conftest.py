"""Test helpers: the seeded random generator and random SPD matrices.

The session set-up (8 simulated CPU devices, float64) is in the repository's top-level
``conftest.py``. Random inputs come from a fixed default seed, varied with the
environment variable ``GPCHOL_TEST_SEED`` (an integer); each test's seed mixes it with the
test's name and is printed, so pytest shows it with any failure.

Tiers: ``@pytest.mark.slow`` leaves a whole test out of the everyday tier
(``-m "not slow"``); ``@pytest.mark.slow_cases("id", ...)`` leaves out the named cases of a
parametrized test (the part of the node id in brackets), so the everyday tier still runs
its other cases. A name that matches no case is an error at collection.
"""

import os
import zlib

import jax
import numpy as np
import pytest


@pytest.fixture
def rng(request):
    """A random generator per test, seeded from ``GPCHOL_TEST_SEED`` (default 0) and the
    test's name; the seed is printed (pytest shows it when the test fails)."""
    base = int(os.environ.get("GPCHOL_TEST_SEED", "0"))
    seed = (base * 1_000_003 + zlib.crc32(request.node.nodeid.encode())) % (2**32)
    print(f"rng seed = {seed} (GPCHOL_TEST_SEED={base}, {request.node.nodeid})")
    return np.random.default_rng(seed)


@pytest.fixture
def without_session_jax_cache():
    """JAX's persistent compilation cache off for one test (the session turns it on in the
    top-level ``conftest.py``), for the tests of gpchol's own cache settings; restored
    after."""
    from jax.experimental.compilation_cache import compilation_cache as cc

    old = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    cc.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_compilation_cache_dir", old)
        cc.reset_cache()


@pytest.hookimpl(wrapper=True)
def pytest_pycollect_makeitem(collector, name, obj):
    """Marks ``slow`` the cases that a test's ``slow_cases`` markers name.

    Here every case of the test is at hand (``--lf``, ``-k``, ``-m`` and node-id selection
    filter later), so a name that matches none of them is always caught.
    """
    result = yield
    items = [x for x in (result if isinstance(result, list) else [result]) if x is not None]
    functions = [x for x in items if isinstance(x, pytest.Function)]
    if not functions:
        return result
    named = {a for m in functions[0].iter_markers("slow_cases") for a in m.args}
    if not named:
        return result
    cases = {f.callspec.id: f for f in functions if hasattr(f, "callspec")}
    missing = named - cases.keys()
    if missing:
        raise pytest.UsageError(
            f"slow_cases on {functions[0].nodeid.partition('[')[0]} names cases it does not "
            f"have: {sorted(missing)}; use the ids in brackets of its node ids "
            "(`pytest --collect-only -q`)."
        )
    for case in named:
        cases[case].add_marker(pytest.mark.slow)
    return result
