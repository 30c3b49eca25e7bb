"""Shared test helpers (imported by the test modules)."""

import numpy as np


def random_spd(rng, n, batch=(), dtype=np.float64, cond=None):
    """Random well-conditioned SPD matrices of shape ``batch + (n, n)`` (float64 made)."""
    m = rng.standard_normal(batch + (n, n))
    a = m @ np.swapaxes(m, -1, -2) / max(n, 1) + np.eye(n)
    return a.astype(dtype)
