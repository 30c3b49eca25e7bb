r"""Memory and time estimates of an exact GP on ``n`` points, printed before a large fit.

An exact GP step (the log marginal likelihood and its gradient) holds a few ``n x n``
matrices at once: the covariance, its Cholesky factor and the adjoint of the backward
pass (measured: about two of them in float64 beside the runtime's own half GiB; three
are counted, for headroom), and costs a few ``n^3`` flops. :func:`estimate` turns that
into bytes and seconds on this machine (its speed measured by a short matrix product),
:func:`machine_memory` gives the memory the process may use (physical memory, or a
smaller cgroup limit), and :func:`check_memory` refuses, naming the override flag, a
computation that cannot fit.

Example:
    >>> from gpchol.cli.resources import estimate, format_bytes
    >>> e = estimate(20_000, 1, itemsize=8, matrices=3, flops_per_eval=3.0, rate=1e10)
    >>> format_bytes(e.bytes), round(e.seconds_per_eval)
    ('9.4 GiB', 2400)
"""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np

from gpchol.cli.errors import CLIError

__all__ = [
    "FIT_FLOPS",
    "FIT_MATRICES",
    "LARGE_N",
    "MEMORY_FLAG",
    "RUNTIME_BYTES",
    "Estimate",
    "check_memory",
    "estimate",
    "format_bytes",
    "format_seconds",
    "machine_memory",
    "matmul_rate",
]

LARGE_N = 2000
"""From this many points on, the estimate is printed before the work starts."""
FIT_MATRICES = 3
"""``n x n`` matrices counted for a fit step (measured: about 2 at once; one more for
headroom)."""
FIT_FLOPS = 3.0
"""Flops of one loss-and-gradient evaluation, in units of ``n^3`` (measured: 2 to 4x a
matrix product's rate; Cholesky, the triangular solves and the backward pass)."""
RUNTIME_BYTES = 512 * 2**20
"""Memory of the Python and JAX runtime itself, beside the matrices."""
MEMORY_FLAG = "--no-memory-check"
"""The flag that overrides the memory refusal."""


def machine_memory() -> int | None:
    """Bytes of memory this process may use: physical memory, or a smaller cgroup limit.

    Returns:
        The smallest of ``SC_PHYS_PAGES * SC_PAGE_SIZE`` and the cgroup (v2 or v1) memory
        limit where one is set; ``None`` where neither can be read.
    """
    sizes: list[int] = []
    try:
        sizes.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        pass
    for path in (
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ):
        try:
            with open(path, encoding="ascii") as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < 2**60:  # "max" or a huge number: no limit
            sizes.append(int(text))
    sizes = [s for s in sizes if s > 0]
    return min(sizes) if sizes else None


def matmul_rate(size: int = 512, repeat: int = 3) -> float:
    """This machine's float64 matrix-product speed in flop/s (best of ``repeat``).

    Takes a few milliseconds to a few tenths of a second on a loaded machine.
    """
    a = np.random.default_rng(0).standard_normal((size, size))
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t0)
    return 2.0 * size**3 / max(best, 1e-9)


@dataclasses.dataclass(frozen=True)
class Estimate:
    """The cost of an exact GP computation on ``n`` points.

    Attributes:
        n: number of points.
        bytes: the memory it needs, runtime included.
        seconds_per_eval: the time of one evaluation (of the loss and its gradient).
        rate: the matrix-product speed (flop/s) the time is based on.
    """

    n: int
    bytes: int
    seconds_per_eval: float
    rate: float


def estimate(
    n: int,
    d: int,
    *,
    itemsize: int,
    matrices: float,
    flops_per_eval: float,
    rate: float | None = None,
) -> Estimate:
    """The memory and time of an exact GP computation on ``n`` points of ``d`` inputs.

    Args:
        n: number of points.
        d: number of input columns.
        itemsize: bytes per number (8 in float64, 4 in float32).
        matrices: ``n x n`` matrices held at once.
        flops_per_eval: flops of one evaluation in units of ``n^3``.
        rate: the machine's matrix-product speed in flop/s (default: measured now).

    Returns:
        An :class:`Estimate`.
    """
    rate = matmul_rate() if rate is None else rate
    data = 4 * n * (d + 1) * 8  # raw, standardized and device copies of X and y
    need = int(matrices * n * n * itemsize) + data + RUNTIME_BYTES
    return Estimate(n, need, flops_per_eval * float(n) ** 3 / rate, rate)


def format_bytes(n: float) -> str:
    """``n`` bytes in KiB, MiB, GiB or TiB, e.g. ``'9.4 GiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def format_seconds(s: float) -> str:
    """A duration, e.g. ``'0.3 s'``, ``'12 min'``, ``'3.1 h'``, ``'2.0 days'``."""
    if s < 60:
        return f"{s:.2g} s" if s < 10 else f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    if s < 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def check_memory(what: str, need: int, override: bool) -> None:
    """Refuses a computation that needs more memory than the machine has.

    Args:
        what: the computation, for the message (e.g. ``"the fit of 40000 rows"``).
        need: its estimated bytes.
        override: the user passed :data:`MEMORY_FLAG` (then nothing is refused).

    Raises:
        CLIError: ``need`` exceeds :func:`machine_memory`; the message names the flag.
    """
    have = machine_memory()
    if override or have is None or need <= have:
        return
    raise CLIError(
        f"{what} needs about {format_bytes(need)} of memory but this machine has "
        f"{format_bytes(have)}; use fewer rows (or float32), or pass {MEMORY_FLAG} to try "
        "anyway"
    )
