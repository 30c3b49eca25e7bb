"""Per-test wall time and XLA compilations of a pytest run, and the tier they suggest.

The everyday tier (``python -m pytest -n auto -m "not slow"``) leaves out what is marked
``slow`` (a whole test) or named by ``slow_cases`` (some cases of a parametrized test;
``tests/conftest.py``). Which tests those are is measured, not guessed: run the tier with
this module as a pytest plugin on an empty compilation cache, then list what took longer
than the threshold::

    GPCHOL_TEST_JAX_CACHE=$(mktemp -d) GPCHOL_TEST_TIMES=times.json \\
        python -m pytest -p benchmarks.tier_times -n 2 -m "not slow" -q
    python -m benchmarks.tier_times times.json [--over 1.5] [--keep-under 3]

Each worker writes ``times.json.<worker>``: ``[node id, seconds, XLA compilations, seconds
compiling]`` per test (setup, call and teardown; a program compiled by one test is not
compiled again by the next one in the same worker, so times depend a little on the order).
The report prints, per test function, the cases over ``--over`` seconds: a function whose
every case is over is suggested ``slow`` unless its cheapest case is under ``--keep-under``
seconds (then that case stays in the tier, so each parametrized test keeps one case there).
Docstring examples are never suggested (those of the public API stay in every tier).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from glob import escape, glob

import pytest

from benchmarks._compiles import CompileCounter


class _Recorder:
    """The pytest plugin: one row per test, written at the session's end."""

    def __init__(self, path: str) -> None:
        self.path, self.rows, self.compiles = path, [], CompileCounter()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        c, t0 = self.compiles, time.perf_counter()
        n0, s0 = c.programs, c.backend_s
        yield
        self.rows.append([item.nodeid, time.perf_counter() - t0, c.programs - n0, c.backend_s - s0])

    def pytest_sessionfinish(self, session) -> None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        tmp = f"{self.path}.{worker}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.rows, f)
        os.replace(tmp, f"{self.path}.{worker}")


def pytest_configure(config) -> None:
    """Registers the recorder when ``GPCHOL_TEST_TIMES`` names the output path."""
    path = os.environ.get("GPCHOL_TEST_TIMES")
    if not path:
        return
    if "PYTEST_XDIST_WORKER" not in os.environ:  # the run's own process: an earlier run's
        for name in glob(escape(path) + ".*"):  # files (other workers) would be mixed in
            os.remove(name)
    config.pluginmanager.register(_Recorder(path), "gpchol_tier_times")


def load(path: str) -> list[list]:
    """The rows of every worker's file ``path.<worker>``."""
    rows: list[list] = []
    for name in sorted(glob(escape(path) + ".*")):
        if not name.endswith(".tmp"):
            with open(name) as f:
                rows += json.load(f)
    if not rows:
        raise SystemExit(f"no {path}.<worker> files: run pytest with GPCHOL_TEST_TIMES={path}")
    return rows


def suggest(rows: list[list], over: float, keep_under: float) -> dict[str, list[str] | None]:
    """``{test function: None (mark it slow) or [case ids to name in slow_cases]}``."""
    cases: dict[str, list[tuple[float, str | None]]] = defaultdict(list)
    for nodeid, seconds, *_ in rows:
        if not nodeid.startswith("tests/"):
            continue  # docstring examples
        base, _, rest = nodeid.partition("[")
        cases[base].append((seconds, rest[:-1] if rest else None))
    out: dict[str, list[str] | None] = {}
    for base, cs in sorted(cases.items()):
        cs.sort(key=lambda c: c[0])
        heavy = [c for c in cs if c[0] >= over]
        if not heavy:
            continue
        every = len(heavy) == len(cs)
        if cs[0][1] is None or (every and cs[0][0] >= keep_under):  # not parametrized, or
            out[base] = None  # even its cheapest case is too slow to keep
        elif len(heavy) > every:  # the cheapest case (heavy[0] when every) stays
            out[base] = sorted(str(i) for _, i in heavy[every:])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", help="the GPCHOL_TEST_TIMES path of the run")
    ap.add_argument("--over", type=float, default=1.5, help="seconds (default 1.5)")
    ap.add_argument("--keep-under", type=float, default=3.0, help="seconds (default 3)")
    args = ap.parse_args(argv)
    rows = load(args.path)
    total = sum(r[1] for r in rows)
    print(
        f"{len(rows)} tests, {total:.0f} s of test time, {sum(r[2] for r in rows)} XLA "
        f"compilations ({sum(r[3] for r in rows):.0f} s)"
    )
    for base, ids in suggest(rows, args.over, args.keep_under).items():
        print(f"{base}: " + ("slow" if ids is None else "slow_cases(" + ", ".join(ids) + ")"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
