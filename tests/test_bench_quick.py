"""The benchmark suite's agreement check: every installed peer gives gpchol's values.

Runs ``python -m benchmarks --agreement-only --sizes 300`` in a fresh process (the suite
enables float64 itself and imports the peers, which this test session should not): the
exact GP log marginal likelihood and its gradient wrt (amplitude, lengthscale, noise) from
gpchol, the JAX-default path, tinygp, GPJax and scikit-learn on the same inputs must agree
with gpchol's within 1e-8 relative, and gpchol's with a SciPy reference. Peers that are not
installed are skipped by the suite with a message. Timings are not checked.
"""

import json
import os
import subprocess
import sys

import pytest
from helpers import benchmark_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# slow: a fresh process imports every installed peer and compiles the suite's programs
# (about 40 s on 2 cores)
@pytest.mark.slow
def test_bench_quick_agreement():
    pytest.importorskip("scipy")
    env = benchmark_env()
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--agreement-only", "--sizes", "300"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = p.stdout + p.stderr
    assert "gpchol vs SciPy reference" in p.stdout, out[-3000:]
    assert "DISAGREES" not in p.stdout, out[-3000:]
    assert p.returncode == 0, out[-3000:]
    # every library that ran printed one line; the skipped ones said why
    for line in p.stdout.splitlines():
        if line.startswith("SKIP"):
            print(line)


# slow: two fresh processes import JAX and gpchol
@pytest.mark.slow
def test_bench_eager_runs_and_counts_programs(tmp_path):
    """``benchmarks/bench_eager.py`` in fresh processes: a first eager ``cholesky`` compiles
    one program, its first eager derivative adds the transposed tangent and the seed's
    programs, and the same derivative at new values compiles nothing."""
    env = benchmark_env()
    out = tmp_path / "eager.json"
    cmd = ["-m", "benchmarks.bench_eager", "--cases", "cholesky", "--repeats", "1"]
    p = subprocess.run(
        [sys.executable, *cmd, "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    row = json.loads(out.read_text())["cases"]["cholesky"]
    assert row["value"]["programs"] == 1, row
    assert row["gradient"]["programs"] <= 4 and row["again"]["programs"] == 0, row
