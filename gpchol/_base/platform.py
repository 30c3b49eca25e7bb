"""Per-platform code paths, traced only where another platform is possible.

``jax.lax.platform_dependent`` traces, lowers and compiles every branch it is given, so
that one jitted function can run on the CPU and on a GPU. In a process whose only JAX
platform is the CPU (this project's CI, most laptops) the other branch can never run,
yet its tracing and lowering are paid by every program that holds it (a quarter of a GP's
tracing time: ``benchmarks/results/design-measurements.md``). :func:`platform_dependent` calls
the CPU branch directly there.

Example:
    >>> import jax.numpy as jnp
    >>> from gpchol._base.platform import platform_dependent
    >>> float(platform_dependent(jnp.ones(()), cpu=lambda x: x + 1, default=lambda x: x))
    2.0
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from jax import lax
from jax.extend import backend as jax_backend

__all__ = ["cpu_only", "platform_dependent"]


@functools.cache
def cpu_only() -> bool:
    """Whether this process's JAX has no platform but the CPU (read once: JAX sets up its
    backends once per process)."""
    return set(jax_backend.backends()) <= {"cpu"}


def platform_dependent(*args: Any, cpu: Callable[..., Any], default: Callable[..., Any]) -> Any:
    """``lax.platform_dependent(*args, cpu=cpu, default=default)``, or ``cpu(*args)`` alone
    when the CPU is the only platform of this process (the other branch is not traced).

    A program lowered here for another platform (``jax.export`` with ``platforms=``) would
    then hold the CPU branch: export from a process that has that platform.
    """
    if cpu_only():
        return cpu(*args)
    return lax.platform_dependent(*args, cpu=cpu, default=default)
