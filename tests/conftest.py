"""Test helpers: the seeded random generator and random SPD matrices.

The session set-up (8 simulated CPU devices, float64) is in the repository's top-level
``conftest.py``. Random inputs come from a fixed default seed, varied with the
environment variable ``GPCHOL_TEST_SEED`` (an integer); each test's seed mixes it with the
test's name and is printed, so pytest shows it with any failure.
"""

import os
import zlib

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
