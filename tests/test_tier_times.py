"""``benchmarks/tier_times.py``: the report that lists which tests leave the everyday tier."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_report_suggests_the_tiers():
    """``benchmarks/tier_times.py``'s report: a slow test marked ``slow``, a parametrized
    test's slow cases named, its cheapest case kept unless even that is over the keep
    limit; docstring examples never suggested."""
    sys.path.insert(0, ROOT)
    try:
        from benchmarks.tier_times import suggest
    finally:
        sys.path.remove(ROOT)
    rows = [
        ["tests/test_a.py::test_one", 4.0, 3, 2.0],
        ["tests/test_a.py::test_fast", 0.1, 0, 0.0],
        ["tests/test_a.py::test_p[1]", 0.2, 1, 0.1],
        ["tests/test_a.py::test_p[2]", 2.0, 9, 1.5],
        ["tests/test_a.py::test_all[x]", 2.0, 1, 1.0],
        ["tests/test_a.py::test_all[y]", 2.5, 1, 1.0],
        ["tests/test_a.py::test_huge[x]", 5.0, 1, 1.0],
        ["tests/test_a.py::test_huge[y]", 6.0, 1, 1.0],
        ["gpchol/x.py::gpchol.x.f", 9.0, 5, 4.0],
    ]
    assert suggest(rows, over=1.5, keep_under=3.0) == {
        "tests/test_a.py::test_one": None,
        "tests/test_a.py::test_p": ["2"],
        "tests/test_a.py::test_all": ["y"],
        "tests/test_a.py::test_huge": None,
    }
