"""Smoke test of the fresh-process refit benchmark (``benchmarks/bench_refit.py``).

Runs ``python -m benchmarks.bench_refit --quick --sections d --libs gpchol`` (four
warm-started refits in fresh processes: scikit-learn, gpchol on an empty and on a warm
compilation cache, one thread each) and checks its results JSON: the fields, finite
positive times, the LMLs of the last fit, and no XLA compilation on the warm cache.
Timings are not compared.
"""

import json
import math
import os
import subprocess
import sys

import pytest
from helpers import benchmark_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_bench_refit_quick(tmp_path):
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    out = tmp_path / "refit.json"
    env = benchmark_env()
    cmd = [sys.executable, "-m", "benchmarks.bench_refit", "--quick", "--sections", "d"]
    cmd += ["--libs", "gpchol", "--single-thread", "--out", str(out)]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    log = (p.stdout + p.stderr)[-3000:]
    assert p.returncode == 0, log
    assert out.with_suffix(".png").stat().st_size > 0, log
    res = json.loads(out.read_text())
    assert res["quick"] is True and res["repeats"] == 1
    for key in ("processor", "cpus", "python", "command"):
        assert key in res["machine"], key
    assert "bench_refit" in res["machine"]["command"]
    assert res["versions"]["gpchol"] and res["versions"]["scikit-learn"]
    rows = {r["library"]: r for r in res["sections"]["d"]["rows"]}
    gp_rows = {f"gpchol{ws}, {c} cache" for ws in ("", " warm_start") for c in ("cold", "warm")}
    assert set(rows) == {"scikit-learn", *gp_rows}, log
    for label, row in rows.items():
        assert row["runs"][0]["status"] == "ok", (label, log)
        for key in ("wall_s", "inner_s", "ratio", "lml"):
            assert math.isfinite(row[key]), (label, key, log)
        assert 0 < row["inner_s"] < row["wall_s"], (label, log)
    assert rows["scikit-learn"]["ratio"] == 1.0
    assert rows["gpchol, cold cache"]["xla_compiles"] > 0, log
    for label in ("gpchol, warm cache", "gpchol warm_start, warm cache"):
        assert rows[label]["xla_compiles"] == 0, (label, log)
        assert rows[label]["cache_hits"] > 0, (label, log)
    # the same optimum on these 15 points (three libraries' optimisers, one model)
    lml = rows["scikit-learn"]["lml"]
    for label in ("gpchol, cold cache", "gpchol warm_start, cold cache"):
        assert abs(rows[label]["lml"] - lml) <= 1e-4 * max(1.0, abs(lml)), (label, log)
