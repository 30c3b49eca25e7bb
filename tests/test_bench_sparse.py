"""``python -m benchmarks.bench_sparse --quick`` runs and its libraries agree.

A fresh process (the benchmark enables float64 itself): the SGPR value-and-gradient step at
n = 20000, M = 64 and 128, each in its own child process, gpchol and GPJax where GPJax is
importable; the bound's values must agree to 1e-8 between them and every step complete.
Timings are not checked.
"""

import json
import os
import subprocess
import sys

import pytest
from helpers import benchmark_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# slow: four child processes at n = 20000 (about 3 minutes on 2 cores)
@pytest.mark.slow
def test_bench_sparse_quick(tmp_path):
    env = benchmark_env()
    out_json = tmp_path / "sparse.json"
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_sparse", "--quick", "--json", str(out_json)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    result = json.loads(out_json.read_text())
    rows = result["rows"]
    assert rows and all(r["ok"] for r in rows), out[-3000:]
    assert {r["M"] for r in rows} == {64, 128}
    assert "loadavg" in result["machine"]
    if "gpjax" not in result["not_run"]:
        assert len(result["agreement"]) == 2, out[-3000:]
        assert all(" agree " in line for line in result["agreement"]), out[-3000:]
