"""Regenerate docs/_static/bench-step.png from the committed benchmark results.

Left: wall time of one exact-GP value-and-gradient step (ExpSquared, d = 3, wrt amplitude,
lengthscale and noise; float64, median of 5, each library in its own process) against n,
from ``benchmarks/results/cpu-2026-11-30.json``. Right: the peak resident memory of that
step's process against n, from the same file (n = 4000) and from the largest-n searches
``cpu-scale-peers-2026-11-30.json`` and ``cpu-scale-gpchol-2026-11-30.json`` (one thread
each); a cross marks the first size at which a library ran out of the machine's memory.
Every number comes from those files, so the chart cannot drift from them. Usage, from the
repository root::

    python docs/scripts/plot_benchmarks.py
"""

from __future__ import annotations

import json
import pathlib
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
TARGET = ROOT / "docs" / "_static" / "bench-step.png"
SPEED = RESULTS / "cpu-2026-11-30.json"
SCALE = [RESULTS / "cpu-scale-peers-2026-11-30.json", RESULTS / "cpu-scale-gpchol-2026-11-30.json"]

LABELS = {
    "gpchol-gp": "gpchol GaussianProcess",
    "gpchol": "gpchol mvn_logpdf",
    "sklearn": "scikit-learn",
    "tinygp": "tinygp",
    "gpjax": "GPJax",
    "jax-default": "jnp.linalg.cholesky + JAX autodiff",
}
STYLE = {
    "gpchol-gp": dict(color="C0", marker="o", lw=2.2),
    "gpchol": dict(color="C0", marker="o", ls="--", lw=1.4, mfc="white"),
    "sklearn": dict(color="C1", marker="s"),
    "tinygp": dict(color="C2", marker="^"),
    "gpjax": dict(color="C3", marker="v"),
    "jax-default": dict(color="0.4", marker="D", ms=4),
}
GIB = 2.0**30


def memory_points(speed: dict, scales: list[dict]) -> dict[str, dict]:
    """Per library: completed (n, peak RSS in GiB) points and the first n out of memory."""
    out: dict[str, dict] = {lib: {"ok": [], "oom": None} for lib in LABELS}
    for rec in speed.get("memory") or []:
        if rec.get("status") == "ok" and rec["lib"] in out:
            out[rec["lib"]]["ok"].append((rec["n"], rec["peak_rss"] / GIB))
    # a later file's search of a library replaces an earlier one's (the same day's code
    # was measured twice for gpchol: the later search is the one the docs quote)
    searches = {}
    for scale in scales:
        searches.update(scale.get("scale") or {})
    for lib, found in searches.items():
        if lib not in out:
            continue
        for tried in found["tried"]:
            status = str(tried.get("status", ""))
            if status == "ok":
                out[lib]["ok"].append((tried["n"], tried["peak_rss"] / GIB))
            elif "memory" in status.lower() or "RESOURCE_EXHAUSTED" in status:
                oom = out[lib]["oom"]
                out[lib]["oom"] = tried["n"] if oom is None else min(oom, tried["n"])
    for rec in out.values():
        rec["ok"].sort()
    return out


def main() -> None:
    speed = json.loads(SPEED.read_text())
    scales = [json.loads(p.read_text()) for p in SCALE]
    sizes = [int(n) for n in speed["sizes"]]
    machine = speed["machine"]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))

    for lib in speed["libs"]:
        times = [statistics.median(speed["speed"][str(n)][lib]) for n in sizes]
        ax_t.plot(sizes, times, label=LABELS[lib], **STYLE[lib])
    ax_t.set(
        xscale="log",
        yscale="log",
        xlabel="n (training points)",
        ylabel="seconds per step",
        title="GP value-and-gradient step, median of 5",
    )
    ax_t.set_xticks(sizes, [f"{n:,}" for n in sizes])
    ax_t.minorticks_off()
    ax_t.grid(True, which="major", alpha=0.3)
    ax_t.legend(fontsize=8)

    mem = memory_points(speed, scales)
    for lib, rec in mem.items():
        if not rec["ok"]:
            continue
        ns, gib = zip(*rec["ok"], strict=True)
        ax_m.plot(ns, gib, label=LABELS[lib], **STYLE[lib])
        if rec["oom"] is not None:
            ax_m.plot(rec["oom"], machine["memory_gib"], "x", color=STYLE[lib]["color"], ms=9)
    for lib, rec in mem.items():
        if not rec["ok"] and rec["oom"] is not None:
            ax_m.plot(rec["oom"], machine["memory_gib"], "x", color=STYLE[lib]["color"], ms=9)
    ax_m.axhline(machine["memory_gib"], color="k", lw=0.8, ls=":")
    ax_m.text(4200, machine["memory_gib"] * 0.8, "this machine's memory (x: ran out)", fontsize=8)
    ax_m.set(
        xscale="log",
        yscale="log",
        xlabel="n (training points)",
        ylabel="peak RSS of the process [GiB]",
        title="memory, and the largest n that fits",
    )
    ticks = [4000, 8000, 16000, 32000]
    ax_m.set_xticks(ticks, [f"{n:,}" for n in ticks])
    ax_m.minorticks_off()
    ax_m.grid(True, which="major", alpha=0.3)

    fig.suptitle(
        f"float64, {machine['cpus']}-core {machine['processor']} CPU, "
        f"jax {speed['versions']['jax']}, {machine['date'][:10]} "
        "(benchmarks/results/cpu-2026-11-30*.json, cpu-scale-*-2026-11-30.json)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(TARGET, dpi=110)
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main()
