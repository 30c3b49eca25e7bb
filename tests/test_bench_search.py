"""Smoke test of the optimisers' work count (``benchmarks/bench_search.py``).

Runs ``python -m benchmarks.bench_search --quick`` (bench_refit's quick sizes, one
process) and checks its record: each library's fits, steps and evaluations counted, at
least one evaluation per step, and the two libraries' log marginal likelihoods equal to
1e-4 where the fits reach one optimum (the diabetes fit and the refit loop; a fold may
end in another local optimum). The counts themselves are not compared.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import benchmark_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_bench_search_quick(tmp_path):
    pytest.importorskip("sklearn")
    out = tmp_path / "search.json"
    cmd = [sys.executable, "-m", "benchmarks.bench_search", "--quick", "--json", str(out)]
    p = subprocess.run(
        cmd, cwd=ROOT, env=benchmark_env(), capture_output=True, text=True, timeout=300
    )
    log = (p.stdout + p.stderr)[-3000:]
    assert p.returncode == 0, log
    res = json.loads(out.read_text())
    assert res["quick"] is True and "bench_search" in res["machine"]["command"]
    want_fits = {"a": 1, "b": 5, "d": res["sizes"]["d_fits"]}
    for section, rows in res["sections"].items():
        for lib, row in rows.items():
            assert row["fits"] == want_fits[section] == len(row["lml"]), (section, lib, log)
            assert 0 < row["steps"] <= row["evaluations"], (section, lib, log)
        assert ("gpchol warm_start" in rows) == (section == "d"), (section, log)
        for lib in set(rows) - {"scikit-learn"} if section in "ad" else ():
            np.testing.assert_allclose(
                rows[lib]["lml"], rows["scikit-learn"]["lml"], rtol=1e-4, err_msg=lib + log
            )
