"""The package's layout rules, checked on the source (see README "Architecture").

* No module of ``gpchol`` imports another module's underscore names (``from m import
  _x`` where ``_x`` is not a module): shared helpers in private packages have plain names.
* Tests, benchmarks, examples and notebooks reach internals only through the one
  documented namespace, ``gpchol._internal``; everything else they use is public.
* The layer contract itself (each layer imports only the ones below it) is checked by
  ``lint-imports`` in ``.ci/run`` (``[tool.importlinter]`` in ``pyproject.toml``); here a
  test runs it too when import-linter is installed.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gpchol"


def _is_module(dotted: str) -> bool:
    try:
        return importlib.util.find_spec(dotted) is not None
    except (ImportError, ValueError):
        return False


def _imports(tree: ast.AST):
    """``(module, name, lineno)`` for every ``from module import name`` and
    ``(module, None, lineno)`` for every ``import module``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                yield node.module, alias.name, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno


def _private_names(source: str):
    """Underscore names (not modules) imported from gpchol modules in ``source``."""
    bad = []
    for module, name, line in _imports(ast.parse(source)):
        if not module.startswith("gpchol") or name is None:
            continue
        if name.startswith("_") and not _is_module(f"{module}.{name}"):
            bad.append(f"line {line}: from {module} import {name}")
    return bad


def _private_modules(source: str):
    """Imports of private gpchol modules other than the internal namespace."""
    bad = []
    for module, name, line in _imports(ast.parse(source)):
        if not module.startswith("gpchol"):
            continue
        dotted = (
            module if name is None or not _is_module(f"{module}.{name}") else (f"{module}.{name}")
        )
        parts = dotted.split(".")
        if dotted == "gpchol._internal" or dotted.startswith("gpchol._internal."):
            continue
        if any(p.startswith("_") for p in parts[1:]):
            bad.append(f"line {line}: {dotted}")
    return bad


def test_the_checks_can_fail():
    assert _private_names("from gpchol._linalg.blocks import _x\n") == [
        "line 1: from gpchol._linalg.blocks import _x"
    ]
    assert _private_names("from gpchol.distributed import _api\n") == []  # a module
    assert _private_modules("from gpchol._linalg.blocks import trsm\n")
    assert _private_modules("import gpchol._base.io as io\n")
    assert not _private_modules("from gpchol._internal import io\n")
    assert not _private_modules("from gpchol import kernels\nimport gpchol.numpyro\n")


@pytest.mark.parametrize(
    "path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_no_module_imports_private_names(path):
    bad = _private_names(path.read_text())
    assert not bad, f"{path.relative_to(ROOT)} imports private names: {bad}"


def _outside_sources():
    for folder in ("tests", "benchmarks", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield str(path.relative_to(ROOT)), path.read_text()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = json.loads(path.read_text())
        code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
        yield str(path.relative_to(ROOT)), code


_OUTSIDE = list(_outside_sources())


@pytest.mark.parametrize("name,source", _OUTSIDE, ids=[name for name, _ in _OUTSIDE])
def test_internals_only_through_the_internal_namespace(name, source):
    if name == "tests/test_layout.py":
        return  # this file names private modules in its own checks
    bad = _private_modules(source)
    assert not bad, f"{name} imports private gpchol modules (use gpchol._internal): {bad}"


# slow: lint-imports builds the import graph of the whole package in a fresh process
# (.ci/run also runs it as a step of its own)
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("lint-imports") is None, reason="import-linter not installed")
def test_layer_contract():
    proc = subprocess.run(["lint-imports"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
