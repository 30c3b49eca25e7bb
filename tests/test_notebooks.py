"""The notebooks in ``notebooks/``: stored clean, public API only, and they run.

The ``.ipynb`` files are the source (edited in Jupyter); they are stored without outputs,
execution counts or per-machine metadata, and their code cells import no private gpchol
module (parsed with :mod:`ast`).

Every notebook is executed at small sizes; an error in any cell fails.
Each notebook runs in a fresh ``python3`` Jupyter kernel (nbclient) whose environment has
``GPCHOL_NOTEBOOK_SMALL=1`` (the notebooks read it in their first cell and pick small
sizes) and ``MPLBACKEND=Agg`` (plots are drawn, not shown). The session's simulated devices are
removed from the kernel's ``XLA_FLAGS`` so each notebook sees the devices it sets up itself
(the sharded notebook asks for 8 CPU devices in its first cell); the session's LLVM level
stays (``tests/helpers.py`` ``child_xla_flags``). The kernel's working
directory is a temporary folder, so nothing a notebook writes lands in the repository.
"""

from __future__ import annotations

import ast
import os
import pathlib
import time

import pytest
from helpers import child_xla_flags

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK_DIR = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 240


def test_notebooks_exist():
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOK_DIR}"


def test_notebooks_are_stored_without_outputs():
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                assert not cell.get("outputs"), f"{path.name}: cell {i} has stored outputs"
                assert cell.get("execution_count") is None, f"{path.name}: cell {i} numbered"


def test_notebook_metadata_is_minimal():
    """Only the kernel's name and the language's name: nothing that changes per machine."""
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        assert set(nb.metadata) <= {"kernelspec", "language_info"}, f"{path.name}: {nb.metadata}"
        assert set(nb.metadata.get("language_info", {})) <= {"name"}, path.name
        for i, cell in enumerate(nb.cells):
            extra = set(cell.metadata) - {"tags"}
            assert not extra, f"{path.name}: cell {i} has metadata {sorted(extra)}"


def private_gpchol_uses(source: str) -> list[str]:
    """Private gpchol modules or names that a code cell's ``source`` imports or reaches.

    Private: any dotted component after ``gpchol`` that starts with one underscore
    (``gpchol._linalg``, ``from gpchol.kernels import _library``, ``gpchol._routing`` via
    an alias); dunder names such as ``gpchol.__version__`` are public. IPython magics and
    shell lines (``%``, ``!``) are skipped before parsing.
    """
    lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    tree = ast.parse("\n".join(lines))

    def private(name: str) -> bool:
        return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))

    found, aliases = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "gpchol":
                    if any(private(p) for p in parts):
                        found.append(a.name)
                    aliases.add(a.asname or "gpchol")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] == "gpchol":
                if any(private(p) for p in parts):
                    found.append(node.module)
                for a in node.names:
                    if private(a.name):
                        found.append(f"{node.module}.{a.name}")
                    else:
                        aliases.add(a.asname or a.name)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and private(node.attr)
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import gpchol\nL = gpchol.cholesky(a)\nprint(gpchol.__version__)", []),
        ("from gpchol import distributed as gd, kernels\nimport gpchol.numpyro as gnp", []),
        ("%matplotlib inline\nimport gpchol._linalg.cholesky", ["gpchol._linalg.cholesky"]),
        ("from gpchol._routing import cholesky", ["gpchol._routing"]),
        ("from gpchol.kernels import _library", ["gpchol.kernels._library"]),
        ("import gpchol as g\ng._linalg.solve.logdet(L)", ["g._linalg"]),
        ("from gpchol import distributed as gd\ngd._core.potrf(a)", ["gd._core"]),
    ],
)
def test_private_use_detector(source, expected):
    assert private_gpchol_uses(source) == expected


def test_notebooks_use_only_public_gpchol():
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                uses = private_gpchol_uses(cell.source)
                assert not uses, f"{path.name}: cell {i} uses private gpchol names {uses}"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.setenv("GPCHOL_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    flags = child_xla_flags(os.environ).get("XLA_FLAGS")  # the LLVM level, not the devices
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    if flags:
        monkeypatch.setenv("XLA_FLAGS", flags)
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")

    def run() -> None:
        client = nbclient.NotebookClient(
            nbformat.read(path, as_version=4),
            timeout=CELL_TIMEOUT_S,
            kernel_name="python3",
            resources={"metadata": {"path": str(tmp_path)}},
            allow_errors=False,
        )
        client.execute(env=dict(os.environ), cwd=str(tmp_path))

    start = time.perf_counter()
    try:
        run()
    except nbclient.exceptions.CellExecutionError as err:
        pytest.fail(f"{path.name}: a cell raised:\n{err}")
    elapsed = time.perf_counter() - start
    print(f"{path.name}: {elapsed:.1f} s")
