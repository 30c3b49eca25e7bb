"""Runs every script in ``examples/``: ``--help``, then one real run with tiny arguments.

Each script runs in a subprocess (so an example's own ``XLA_FLAGS`` or
``jax.distributed`` set-up never touches this test session), from a temporary working
directory (files an example writes land there), with ``MPLBACKEND=Agg`` and without the
test session's simulated devices (its LLVM level kept: ``tests/helpers.py``
``child_xla_flags``). A non-zero exit status or a traceback fails the test.

Files whose names start with ``_`` are helpers, not examples. A new example is run with
no arguments (its small defaults) until it gets an entry in ``TINY_ARGS``.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
from helpers import child_xla_flags

EXAMPLES_DIR = pathlib.Path(__file__).resolve().parent.parent / "examples"
EXAMPLES = sorted(p for p in EXAMPLES_DIR.glob("*.py") if not p.name.startswith("_"))

# The smallest arguments that still exercise each example end to end.
TINY_ARGS: dict[str, list[str]] = {
    "fit_co2.py": ["--steps", "3", "--every", "12"],
    "fit_csv.py": ["--n", "20", "--steps", "3", "--outdir", "out"],
    "numpyro_gp.py": [
        "--n", "16", "--warmup", "10", "--samples", "10", "--chains", "1", "--only-gpchol",
    ],
    "potrf_direct.py": ["--launch", "2", "--local-devices", "2", "--n", "64", "--tile", "16"],
    "potrf_caller_jit.py": [
        "--launch", "2", "--local-devices", "2", "--n", "64", "--tile", "16",
    ],
    "sharded_gp.py": [
        "--n", "32", "--tile", "8", "--steps", "1", "--devices", "4", "--mesh", "2x2",
    ],
}  # fmt: skip
# Scripts that start several processes (jax.distributed on 127.0.0.1, CPU collectives).
MULTI_PROCESS = {"potrf_direct.py", "potrf_caller_jit.py"}
HELP_TIMEOUT_S = 120
RUN_TIMEOUT_S = 300


def _env():
    env = dict(os.environ)
    env = child_xla_flags(env)
    env["MPLBACKEND"] = "Agg"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run(args, cwd, timeout):
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit status {proc.returncode}:\n{out[-6000:]}"
    assert "Traceback (most recent call last)" not in out, out[-6000:]
    return out


def _ids(paths):
    return [p.stem for p in paths]


def test_examples_exist():
    assert EXAMPLES, f"no examples found in {EXAMPLES_DIR}"


@pytest.mark.parametrize("path", EXAMPLES, ids=_ids(EXAMPLES))
def test_example_help(path, tmp_path):
    out = _run([str(path), "--help"], tmp_path, HELP_TIMEOUT_S)
    assert "usage" in out.lower(), out


def _run_params():
    params = []
    for path in EXAMPLES:
        marks = [pytest.mark.slow]
        if path.name in MULTI_PROCESS:
            marks.append(pytest.mark.multiprocess)
        params.append(pytest.param(path, marks=marks, id=path.stem))
    return params


@pytest.mark.parametrize("path", _run_params())
def test_example_runs(path, tmp_path):
    args = TINY_ARGS.get(path.name, [])
    _run([str(path), *args], tmp_path, RUN_TIMEOUT_S)
