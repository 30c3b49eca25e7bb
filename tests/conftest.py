"""Test configuration: 8 simulated CPU devices and float64 enabled for the test session.

``XLA_FLAGS`` must be set before JAX is imported for the simulated devices to exist, so
it is set here, at the top of conftest (the package itself never touches the
environment or enables x64).
"""

import os

_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)


@pytest.fixture
def rng():
    """A fresh random generator per test; the seed is printed (shown when a test fails)."""
    seed = int(np.random.SeedSequence().entropy % (2**32))
    print(f"rng seed = {seed}")
    return np.random.default_rng(seed)


def random_spd(rng, n, batch=(), dtype=np.float64, cond=None):
    """Random well-conditioned SPD matrices of shape ``batch + (n, n)`` (float64 made)."""
    m = rng.standard_normal(batch + (n, n))
    a = m @ np.swapaxes(m, -1, -2) / max(n, 1) + np.eye(n)
    return a.astype(dtype)
