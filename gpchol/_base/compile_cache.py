"""JAX's persistent compilation cache: where it lives and how it is turned on.

A compiled program depends only on a model's structure, dtypes and (bucketed) shapes, so
the programs of one process serve the next: with the persistent cache on, a fit in a new
process reads its programs back instead of compiling them. The library never turns the
cache on by itself (``import gpchol`` changes no setting); :func:`enable_compile_cache`
is the one call that does, and the ``gpchol`` command line uses the same directory rule
(:func:`resolve_cache_dir`).

Example:
    >>> resolve_cache_dir(None, no_cache=False, environ={"GPCHOL_CACHE_DIR": "off"},
    ...                   program=True) is None
    True
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping

import jax

__all__ = [
    "ENV_VAR",
    "SETTINGS",
    "enable_compile_cache",
    "reset_jax_cache",
    "resolve_cache_dir",
    "unusable",
    "use_cache_dir",
]

#: The environment variable that moves (a directory) or turns off (``off`` or empty) the
#: command line's compilation cache.
ENV_VAR = "GPCHOL_CACHE_DIR"

_OFF = ("", "off", "none", "0", "false", "no")


def resolve_cache_dir(
    option: str | None,
    *,
    no_cache: bool,
    environ: Mapping[str, str] | None = None,
    program: bool = True,
) -> str | None:
    """The compilation cache's directory for this run, or ``None`` for no cache.

    Args:
        option: ``--cache-dir`` (``None`` when not given; empty turns the cache off).
        no_cache: ``--no-cache`` was given.
        environ: the environment (default ``os.environ``).
        program: run as the ``gpchol`` program (the default location is then used);
            from Python only an explicit directory turns the cache on.

    Returns:
        An absolute or user-relative path (``~`` expanded), or ``None``.
    """
    env = os.environ if environ is None else environ
    if no_cache:
        return None
    if option is not None:
        return os.path.expanduser(option) if option.strip() else None
    value = env.get(ENV_VAR)
    if value is not None:
        return None if value.strip().lower() in _OFF else os.path.expanduser(value)
    if not program:
        return None
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gpchol", "jax")


def unusable(path: str) -> str | None:
    """Why ``path`` cannot hold the cache (created if missing), or ``None``."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".gpchol-probe-"):
            pass
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


def reset_jax_cache() -> None:
    # JAX decides once per process whether its cache is used (at the first compilation);
    # a changed directory takes effect only after this reset.
    from jax.experimental.compilation_cache import compilation_cache as cc

    cc.reset_cache()


SETTINGS = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)


def enable_compile_cache(path: str | os.PathLike[str] | None = None) -> str | None:
    """Turns on JAX's persistent compilation cache for the rest of this process.

    gpchol's programs are keyed by structure (a model's tree, dtypes and size bucket), so
    a fit, prediction or estimator call in a new process finds the programs an earlier
    process compiled and skips their compilation (on this machine: a CO2 ``gpchol fit``
    compiles in about a second, which a warm cache removes). Every program is cached,
    however quick to compile. JAX decides where its cache is once per process: call this
    before the first computation, or it resets JAX's cache to take effect.

    Args:
        path: the cache's directory (created if missing). ``None``: the environment
            variable ``GPCHOL_CACHE_DIR`` when set (a directory; ``off`` or empty turns
            nothing on), else ``$XDG_CACHE_HOME/gpchol/jax`` (``~/.cache/gpchol/jax``),
            the directory the ``gpchol`` command uses.

    Returns:
        The directory in use, or ``None`` when ``GPCHOL_CACHE_DIR`` says ``off``.

    Raises:
        OSError: the directory cannot be created or written (the message names it).

    Example:
        >>> import tempfile, gpchol
        >>> d = gpchol.enable_compile_cache(tempfile.mkdtemp())  # doctest: +SKIP
    """
    where = (
        resolve_cache_dir(None, no_cache=False, program=True)
        if path is None
        else os.path.expanduser(os.fspath(path))
    )
    if where is None:
        return None
    why = unusable(where)
    if why is not None:
        raise OSError(
            f"the compilation cache directory {where} cannot be used ({why}); pass another "
            f"path, or set {ENV_VAR}=DIR"
        )
    use_cache_dir(where)
    return where


def use_cache_dir(path: str) -> None:
    """Points JAX's persistent cache at ``path`` and caches every program, however quick
    to compile (JAX's default skips programs that compile in under a second: most of a
    fit's). The :data:`SETTINGS` it changes are JAX's; the caller saves them to restore."""
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    reset_jax_cache()
