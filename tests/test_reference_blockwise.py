"""``benchmarks/reference_blockwise.py`` (the one-buffer SciPy reference of the scale runs).

Its value and gradient must equal the textbook several-buffer reference
(``benchmarks._common.reference_numpy``) on the scale problem, at sizes that are and are not
multiples of the block, so that the largest-n runs are checked against something right.
"""

import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import _common as C  # noqa: E402
from benchmarks import reference_blockwise as R  # noqa: E402

SEED = int(os.environ.get("GPCHOL_TEST_SEED", "0"))


@pytest.mark.parametrize(("n", "block"), [(300, 64), (257, 257), (200, 1024)])
def test_matches_textbook_reference(n, block):
    X, y = C.problem(n, seed=SEED)
    value, grad = R.value_and_grad(X, y, block=block, grad=True)
    ref_value, ref_grad = C.reference_numpy(X, y)
    msg = f"seed {SEED} (GPCHOL_TEST_SEED), n = {n}, block = {block}"
    np.testing.assert_allclose(value, ref_value, rtol=1e-12, err_msg=msg)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-11, err_msg=msg)
    value_only, none = R.value_and_grad(X, y, block=block)
    assert none is None
    np.testing.assert_allclose(value_only, ref_value, rtol=1e-12, err_msg=msg)


def test_posterior_matches_dense_formulas():
    n = 240
    X, y = C.problem(n, seed=SEED)
    Xs = C.problem(50, seed=SEED + 1)[0]
    _, grad, (mean, var) = R.value_and_grad(X, y, block=64, test=Xs)
    assert grad is None
    a, _, s = C.THETA
    K = R.cross(X, X, C.THETA) + s * np.eye(n)
    Ks = R.cross(Xs, X, C.THETA)
    msg = f"seed {SEED} (GPCHOL_TEST_SEED)"
    np.testing.assert_allclose(mean, Ks @ np.linalg.solve(K, y), rtol=1e-9, atol=1e-12, err_msg=msg)
    ref_var = a - np.einsum("ij,ji->i", Ks, np.linalg.solve(K, Ks.T))
    np.testing.assert_allclose(var, ref_var, rtol=1e-8, atol=1e-12, err_msg=msg)
