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


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects
def pytest_collection_modifyitems(config, items):
    """Marks ``slow`` the cases that a test's ``slow_cases`` marker names."""
    named: dict[object, set[str]] = {}
    seen: dict[object, set[str]] = {}
    for item in items:
        marker = item.get_closest_marker("slow_cases")
        if marker is None:
            continue
        fn = getattr(item, "function", None)
        named.setdefault(fn, set(marker.args))
        case = getattr(item, "callspec", None)
        if case is not None and case.id in marker.args:
            item.add_marker(pytest.mark.slow)
            seen.setdefault(fn, set()).add(case.id)
    if any("::" in str(arg) for arg in config.args):
        return  # tests picked by node id: their siblings are not collected
    for fn, ids in named.items():
        missing = ids - seen.get(fn, set())
        if missing:
            raise pytest.UsageError(
                f"slow_cases on {fn.__module__}.{fn.__qualname__} names cases it does not "
                f"have: {sorted(missing)}; use the ids in brackets of its node ids "
                "(`pytest --collect-only -q`)."
            )
