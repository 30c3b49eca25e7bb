"""Session set-up for the whole test run (``tests/`` and the docstring examples in ``gpchol/``).

* ``XLA_FLAGS`` gets 8 simulated CPU devices and LLVM's ``-O0`` (below); it must be set
  before JAX is imported, so it is set here, in the first conftest pytest loads (the
  package itself never touches the environment or enables x64).
* float64 is enabled for the tests; the docstring examples run in JAX's default
  configuration (float32), as a user would run them.
* JAX's persistent compilation cache is on for the session (below), in
  ``.jax-test-cache/``: a rerun compiles only what changed.
* Docstring examples of the public API (the objects in the ``__all__`` of ``gpchol`` and
  of its public submodules, their methods, and those modules' own docstrings) run in every
  tier; the examples of private helpers are marked ``slow``: each compiles its own XLA
  programs, and what they show is also checked by a test.
"""

import os

_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
# XLA's LLVM back end at -O0 for the tests, unless XLA_FLAGS names a level: compilation is
# most of the suite's time (each test compiles its own small programs) and LLVM's
# optimisation about a fifth of a selection's wall time. Results differ from the default
# level by rounding alone (contracted multiply-adds, vectorised math functions: 5e-16
# relative at the median, 6e-13 at most), inside every test's tolerance
# (benchmarks/results/test-suite-times.md). GPCHOL_TEST_XLA_OPT=default keeps XLA's
# default level, as users run it.
_level = "--xla_backend_optimization_level"
if os.environ.get("GPCHOL_TEST_XLA_OPT", "").lower() != "default" and _level not in (
    os.environ.get("XLA_FLAGS", "")
):
    os.environ["XLA_FLAGS"] = (os.environ["XLA_FLAGS"] + " " + _level + "=0").strip()

import importlib  # noqa: E402
import pkgutil  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)

# A persistent compilation cache for the test session: XLA compilation is most of the
# suite's time (each test compiles its own small programs), and a rerun reads back the
# programs of the code it has not changed (a changed program has a new key: it is compiled
# again, never served stale). The directory is `.jax-test-cache/` at the repository's
# root, or the one GPCHOL_TEST_JAX_CACHE names ("off": no cache). Tests of the cache
# settings themselves turn it off (`without_session_jax_cache` in tests/conftest.py).
_test_cache = os.environ.get(
    "GPCHOL_TEST_JAX_CACHE",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), ".jax-test-cache"),
)
if _test_cache.lower() not in ("", "0", "off"):
    import gpchol

    gpchol.enable_compile_cache(_test_cache)  # every program cached, however quick


@pytest.fixture(autouse=True)
def _docstring_examples_in_float32(request):
    """Docstring examples (``--doctest-modules``) run with x64 off, as a user's would."""
    if isinstance(request.node, pytest.DoctestItem):
        with jax.enable_x64(False):
            yield
    else:
        yield


def _public_api() -> tuple[set[str], set[int]]:
    """The public modules' names and the ids of the objects in their ``__all__``."""
    import gpchol

    names = {"gpchol"}
    names |= {f"gpchol.{m.name}" for m in pkgutil.iter_modules(gpchol.__path__)}
    names = {n for n in names if not n.split(".")[-1].startswith("_")}
    objects = set()
    for name in names:
        module = importlib.import_module(name)
        objects |= {id(getattr(module, a)) for a in getattr(module, "__all__", ())}
    return names, objects


def _documents_public_api(dotted: str, modules: set[str], objects: set[int]) -> bool:
    """Whether the doctest named ``dotted`` (``module[.object[.member]]``) documents a public
    module or an object (or a member of one) in a public ``__all__``."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = sys.modules.get(".".join(parts[:i]))
        if module is not None:
            rest = parts[i:]
            if not rest:
                return module.__name__ in modules
            return id(getattr(module, rest[0], None)) in objects
    return False


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Marks the docstring examples of private helpers ``slow`` (before ``-m`` selects)."""
    doctests = [item for item in items if isinstance(item, pytest.DoctestItem)]
    if not doctests:
        return
    modules, objects = _public_api()
    for item in doctests:
        if not _documents_public_api(item.name, modules, objects):
            item.add_marker(pytest.mark.slow)
