"""Executes every notebook in ``notebooks/`` at small sizes; an error in any cell fails.

Each notebook runs in a fresh ``python3`` Jupyter kernel (nbclient) whose environment has
``GPCHOL_NOTEBOOK_SMALL=1`` (the notebooks read it in their first cell and pick small
sizes) and ``MPLBACKEND=Agg`` (plots are drawn, not shown). ``XLA_FLAGS`` is removed from
the kernel's environment so each notebook sees exactly what it sets up itself (the
sharded notebook asks for 8 CPU devices in its first cell). The kernel's working
directory is a temporary folder, so nothing a notebook writes lands in the repository.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

import pytest

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


def test_notebooks_match_their_generator():
    """The stored notebooks are what ``notebooks/build_notebooks.py`` writes."""
    proc = subprocess.run(
        [sys.executable, str(NOTEBOOK_DIR / "build_notebooks.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.setenv("GPCHOL_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
        allow_errors=False,
    )
    start = time.perf_counter()
    try:
        client.execute(env=dict(os.environ), cwd=str(tmp_path))
    except nbclient.exceptions.CellExecutionError as err:
        pytest.fail(f"{path.name}: a cell raised:\n{err}")
    elapsed = time.perf_counter() - start
    print(f"{path.name}: {elapsed:.1f} s")
