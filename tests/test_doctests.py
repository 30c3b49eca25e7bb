"""The runnable examples in the docstrings of the linear-algebra core."""

import doctest

import jax
import pytest

import gpchol._linalg.cholesky
import gpchol._linalg.solve


@pytest.mark.parametrize(
    "module", [gpchol._linalg.cholesky, gpchol._linalg.solve], ids=lambda m: m.__name__
)
def test_docstring_examples_run(module):
    # The examples show the default configuration (float32); the test session has x64 on.
    with jax.enable_x64(False):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0
