"""NumPyro's own distribution tests, run against ``gpchol.numpyro.MultivariateNormal``.

NumPyro's ``test/test_distributions.py`` ships in its source distribution (not in the
installed wheel). ``.ci/run`` downloads the sdist of the installed NumPyro version into
``.ci/cache/``; set ``GPCHOL_NUMPYRO_SDIST`` to the ``.tar.gz`` (or to a folder holding
it) to use another copy. Without it this test SKIPS and says why.

The test extracts ``test/`` and NumPyro's ``pyproject.toml`` (its pytest settings,
warnings as errors included) into a temporary folder, adds a ``conftest.py`` that replaces
``numpyro.distributions.MultivariateNormal`` by gpchol's class before NumPyro's test module
is imported, and runs, in a subprocess with ``JAX_ENABLE_X64=1`` as NumPyro's CI does (so
x64 never leaks into this process)::

    pytest test/test_distributions.py -k "MultivariateNormal and not LowRank and not
    MultivariateStudentT"

It passes when no case fails or errors and every skipped case is skipped by NumPyro's
own test for a reason listed in ``NOT_APPLICABLE`` (the same cases NumPyro skips for its
own class). Measured with NumPyro 0.22.0: gpchol before issue 31, 7 passed, 299 failed,
6 skipped; after, 219 passed, 93 skipped (NumPyro's own class: 219 passed, 93 skipped).
About 1.5-2 minutes on the 2-core CI machine, so it is marked ``slow``.
"""

import json
import os
import re
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers import FRESH_PYTEST_ARGS, child_xla_flags, fresh_pytest_env

numpyro = pytest.importorskip("numpyro")

ROOT = Path(__file__).resolve().parent.parent
SELECT = "MultivariateNormal and not LowRank and not MultivariateStudentT"

# Skip messages of NumPyro's test module that mean "this check does not apply to a
# multivariate normal" (NumPyro skips the same cases for its own class).
NOT_APPLICABLE = {
    r"batching not allowed in multivariate distns": "the test batches univariate draws",
    r"batched samples cannot be scored by multivariate distributions": "univariate only",
    r"skip testing cdf/icdf methods of multivariate distributions": "no cdf for MVN",
    r"MultivariateNormal\.(cdf|icdf|mode|enumerate_support) is not implemented": (
        "NumPyro's MultivariateNormal does not define it either (NotImplementedError)"
    ),
    r"sampling method taken from upstream, no need to test generated samples": (
        "NumPyro skips its goodness-of-fit test of the sampler for this distribution"
    ),
}

# Loaded by pytest (the rootdir's conftest) before NumPyro's test module is imported: every
# `dist.MultivariateNormal` that module reads (test cases, the scipy map) is gpchol's.
CONFTEST = """\
import json
import os

import numpyro.distributions as dist

from gpchol.numpyro import MultivariateNormal

dist.MultivariateNormal = MultivariateNormal


def pytest_collection_finish(session):
    used = {
        f"{c.__module__}.{c.__qualname__}"
        for c in (item.module.dist.MultivariateNormal for item in session.items)
    }
    with open(os.environ["GPCHOL_UPSTREAM_MARKER"], "w") as f:
        json.dump({"classes": sorted(used), "items": len(session.items)}, f)
"""


def _sdist() -> Path | None:
    """The NumPyro sdist of the installed version: ``GPCHOL_NUMPYRO_SDIST`` or .ci/cache."""
    name = f"numpyro-{numpyro.__version__}.tar.gz"
    where = os.environ.get("GPCHOL_NUMPYRO_SDIST")
    path = Path(where) if where else ROOT / ".ci" / "cache"
    if path.is_dir():
        path = path / name
    return path if path.is_file() else None


def _extract(sdist: Path, dest: Path) -> Path:
    """Extract ``test/``, ``pyproject.toml`` and ``LICENSE.md`` of the sdist into ``dest``."""
    with tarfile.open(sdist) as tar:
        members = [
            m
            for m in tar.getmembers()
            if m.isfile()
            and len(Path(m.name).parts) >= 2
            and (
                Path(m.name).parts[1] == "test"
                or Path(m.name).parts[1:] in (("pyproject.toml",), ("LICENSE.md",))
            )
        ]
        for m in members:  # the sdist's own paths, none outside its top folder
            assert not Path(m.name).is_absolute() and ".." not in Path(m.name).parts, m.name
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4
            tar.extractall(dest, members=members, filter="data")
        else:
            tar.extractall(dest, members=members)
    (top,) = {Path(m.name).parts[0] for m in members}
    return dest / top


def _outcomes(report: Path) -> dict[str, list[tuple[str, str]]]:
    """``{outcome: [(test id, message)]}`` from a JUnit XML report."""
    out: dict[str, list[tuple[str, str]]] = {"passed": [], "failed": [], "skipped": []}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name", "")
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        skip = case.find("skipped")
        if bad is not None:
            out["failed"].append((name, (bad.get("message") or "")[:300]))
        elif skip is not None:
            out["skipped"].append((name, skip.get("message") or ""))
        else:
            out["passed"].append((name, ""))
    return out


@pytest.mark.slow
def test_numpyro_test_distributions_on_gpchol_multivariate_normal(tmp_path):
    sdist = _sdist()
    if sdist is None:
        reason = (
            f"NumPyro {numpyro.__version__}'s source distribution was not found (its "
            "test/test_distributions.py is not in the wheel): run .ci/run, or `pip download "
            f"--no-deps --no-binary :all: numpyro=={numpyro.__version__} -d .ci/cache`, "
            "or set GPCHOL_NUMPYRO_SDIST to the .tar.gz"
        )
        print("SKIPPED:", reason)
        pytest.skip(reason)
    top = _extract(sdist, tmp_path)
    assert (top / "test" / "test_distributions.py").is_file(), sorted(top.rglob("*"))
    (top / "conftest.py").write_text(CONFTEST)
    marker, report = tmp_path / "marker.json", tmp_path / "report.xml"
    env = dict(os.environ, JAX_ENABLE_X64="1", GPCHOL_UPSTREAM_MARKER=str(marker))
    env = child_xla_flags(env)  # not this suite's 8 simulated devices: NumPyro's runs on one
    env = fresh_pytest_env(env)
    cmd = [sys.executable, "-m", "pytest", "test/test_distributions.py", "-k", SELECT]
    cmd += [
        *FRESH_PYTEST_ARGS,
        "-o",
        "addopts=",
        "-q",
        "--color=no",
    ]
    cmd += [f"--junitxml={report}"]
    p = subprocess.run(cmd, cwd=top, env=env, capture_output=True, text=True, timeout=900)
    log = (p.stdout + p.stderr)[-4000:]
    assert report.is_file() and marker.is_file(), log
    used = json.loads(marker.read_text())
    assert used["classes"] == ["gpchol.numpyro.MultivariateNormal"], used
    res = _outcomes(report)
    counts = {k: len(v) for k, v in res.items()}
    print(f"NumPyro {numpyro.__version__} test_distributions.py -k {SELECT!r}: {counts}")
    assert not res["failed"], "\n".join(f"{n}: {m}" for n, m in res["failed"])
    unexplained = [
        (n, m) for n, m in res["skipped"] if not any(re.search(r, m) for r in NOT_APPLICABLE)
    ]
    assert not unexplained, unexplained
    assert counts["passed"] >= 100 and counts["passed"] + counts["skipped"] == used["items"]
    assert p.returncode == 0, log
