"""A counter of JAX's compilations for the benchmarks and the test-time recorder.

Standard library only (JAX is imported when a counter is made): a benchmark's child
process imports it before its timed part without timing anything else.
"""

from __future__ import annotations

import math

_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
_BACKEND = "/jax/core/compile/backend_compile_duration"
_HIT = "/jax/compilation_cache/cache_hits"


class CompileCounter:
    """Counts JAX's compilations in this process from its monitoring events, from its
    creation on: ``programs`` (XLA backend compilations, those read back from the
    persistent cache included), ``hits`` (of them, read back), ``backend_s`` (their
    seconds), and the union of the tracing, lowering and compiling spans (:meth:`summary`).
    """

    def __init__(self) -> None:
        import jax.monitoring as mon

        self.programs = 0
        self.hits = 0
        self.backend_s = 0.0
        self.spans: list[tuple[float, float]] = []
        mon.register_event_duration_secs_listener(self._duration)
        mon.register_event_listener(self._event)
        mon.register_event_time_span_listener(self._span)

    def _duration(self, event: str, duration: float, **kwargs) -> None:
        if event == _BACKEND:
            self.programs += 1
            self.backend_s += duration

    def _event(self, event: str, **kwargs) -> None:
        if event == _HIT:
            self.hits += 1

    def _span(self, event: str, start: float, end: float, **kwargs) -> None:
        if event in _COMPILE_EVENTS:
            self.spans.append((start, end))

    def summary(self) -> dict:
        total, reach = 0.0, -math.inf
        for a, b in sorted(self.spans):  # the union of the (possibly nested) spans
            if b > reach:
                total += b - max(a, reach)
                reach = b
        return {
            "programs": self.programs,
            "cache_hits": self.hits,
            "xla_compiles": self.programs - self.hits,
            "backend_s": self.backend_s,
            "compile_s": total,
        }
