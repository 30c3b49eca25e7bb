"""The command line's start-up: JAX's persistent compilation cache and the compile clock.

A second ``gpchol fit`` of the same model needs none of the first one's XLA
compilations: they are read back from JAX's persistent compilation cache. The cache is
the command line's, never the library's (``import gpchol`` changes no setting):

* as the ``gpchol`` program it is on by default, in ``$XDG_CACHE_HOME/gpchol/jax``
  (``~/.cache/gpchol/jax`` without ``XDG_CACHE_HOME``);
* ``--cache-dir DIR`` moves it, ``--no-cache`` turns it off; the environment variable
  ``GPCHOL_CACHE_DIR`` does the same for every run (a directory, or ``off`` or empty for
  none). The option wins over the variable;
* called from Python (``gpchol.cli.main([...])``) it is used only with ``--cache-dir``
  (or ``GPCHOL_CACHE_DIR`` set to a directory), and JAX's settings are restored when
  the command returns; a cache the caller's process already configured is left alone;
* every program is cached, however small or quick to compile (JAX's default skips
  programs that compile in under a second, which is most of a fit's);
* a directory that cannot be created or written is reported in one warning and the
  command runs without the cache.

:class:`CompileClock` measures how much of a stretch of work was spent compiling
(tracing, lowering, XLA compilation or reading the cache), from JAX's own monitoring
events, so that ``gpchol fit`` reports compile time and step time apart.

Example:
    >>> resolve_cache_dir(None, no_cache=True, environ={}, program=True) is None
    True
    >>> resolve_cache_dir(None, no_cache=False, environ={"XDG_CACHE_HOME": "/c"},
    ...                   program=True)
    '/c/gpchol/jax'
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator

import jax

from gpchol._base.compile_cache import (
    ENV_VAR,
    SETTINGS,
    reset_jax_cache,
    resolve_cache_dir,
    unusable,
    use_cache_dir,
)

__all__ = ["ENV_VAR", "CompileClock", "compilation_cache", "resolve_cache_dir"]

#: JAX's monitoring events that together make up a compilation (their spans may nest).
_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


@contextlib.contextmanager
def compilation_cache(path: str | None) -> Iterator[str | None]:
    """Uses JAX's persistent compilation cache in ``path`` inside the ``with`` block.

    Yields the directory in use (``None``: no cache; the caller's own cache, if it set
    one, stays as it was). A directory that cannot be created or written gives one
    :class:`UserWarning` and no cache. JAX's settings are restored on exit.

    Example:
        >>> with compilation_cache(None) as used:
        ...     print(used)
        None
    """
    if path is None or getattr(jax.config, "jax_compilation_cache_dir"):  # noqa: B009
        yield None
        return
    why = unusable(path)
    if why is not None:
        warnings.warn(
            f"the compilation cache {path} cannot be used ({why}); running without it "
            f"(choose another with --cache-dir DIR or {ENV_VAR}=DIR, or pass --no-cache)",
            stacklevel=2,
        )
        yield None
        return
    saved = {k: getattr(jax.config, k) for k in SETTINGS}
    use_cache_dir(path)
    try:
        yield path
    finally:
        for k, v in saved.items():
            jax.config.update(k, v)
        reset_jax_cache()


class CompileClock:
    """Wall time spent compiling inside a ``with`` block (tracing, lowering, XLA's
    compilation or the persistent cache's read), from JAX's monitoring events.

    Nested events (a jitted function traced inside another) are counted once: the
    union of their time spans is taken.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> with CompileClock() as clock:
        ...     _ = jax.jit(lambda x: x + 1)(jnp.ones(2)).block_until_ready()
        >>> clock.seconds > 0.0
        True
    """

    def __init__(self) -> None:
        self._spans: list[tuple[float, float]] = []
        self.wall = 0.0

    def _listen(self, event: str, start_time: float, end_time: float, **kwargs: str | int) -> None:
        if event in _COMPILE_EVENTS:
            self._spans.append((start_time, end_time))

    def __enter__(self) -> CompileClock:
        self._t0 = time.perf_counter()
        jax.monitoring.register_event_time_span_listener(self._listen)
        return self

    def __exit__(self, *exc: object) -> None:
        jax.monitoring.unregister_event_time_span_listener(self._listen)
        self.wall = time.perf_counter() - self._t0

    @property
    def seconds(self) -> float:
        """Seconds of the block spent compiling (the union of the compile events' spans)."""
        total, end = 0.0, -float("inf")
        for a, b in sorted(self._spans):
            if b <= end:
                continue
            total += b - max(a, end)
            end = b
        return total
