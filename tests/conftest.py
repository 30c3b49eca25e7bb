"""Test helpers: the seeded random generator and random SPD matrices.

The session set-up (8 simulated CPU devices, float64) is in the repository's top-level
``conftest.py``. Random inputs come from a fixed default seed, varied with the
environment variable ``GPCHOL_TEST_SEED`` (an integer); each test's seed mixes it with the
test's name and is printed, so pytest shows it with any failure.
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
