"""Session set-up for the whole test run (``tests/`` and the docstring examples in ``gpchol/``).

* ``XLA_FLAGS`` gets 8 simulated CPU devices; it must be set before JAX is imported, so it
  is set here, in the first conftest pytest loads (the package itself never touches the
  environment or enables x64).
* float64 is enabled for the tests; the docstring examples run in JAX's default
  configuration (float32), as a user would run them.
"""

import os

_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)


@pytest.fixture(autouse=True)
def _docstring_examples_in_float32(request):
    """Docstring examples (``--doctest-modules``) run with x64 off, as a user's would."""
    if isinstance(request.node, pytest.DoctestItem):
        with jax.enable_x64(False):
            yield
    else:
        yield
