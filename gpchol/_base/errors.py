"""Exceptions raised by gpchol."""

from __future__ import annotations

import numpy as np

__all__ = ["NotPositiveDefiniteError"]


class NotPositiveDefiniteError(np.linalg.LinAlgError):
    """A matrix that should be symmetric positive definite is not.

    Raised by :func:`gpchol.cholesky` with ``check=True`` (outside ``jit``). It is a
    subclass of :class:`numpy.linalg.LinAlgError` (and so of :class:`ValueError`).

    Attributes:
        pivot: 1-based index of the first failing pivot (LAPACK's ``info``), for the
            first failing batch element.
        batch_index: index (tuple) of that batch element; ``()`` for an unbatched input.
        min_diagonal: the smallest diagonal entry of the input matrix (of that element).
        jitter: the jitter values that were tried, if any.
    """

    def __init__(
        self,
        message: str,
        *,
        pivot: int,
        batch_index: tuple[int, ...] = (),
        min_diagonal: float | None = None,
        jitter: tuple[float, ...] = (),
    ) -> None:
        super().__init__(message)
        self.pivot = int(pivot)
        self.batch_index = tuple(batch_index)
        self.min_diagonal = min_diagonal
        self.jitter = tuple(jitter)

    def __reduce__(self) -> tuple:
        # BaseException pickles as ``cls(*args)``, which misses the keyword-only ``pivot``:
        # without this, the error raised in a worker process (a process pool, joblib) broke
        # the pool instead of reaching the caller, and ``copy.copy`` failed.
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(
    cls: type[NotPositiveDefiniteError], args: tuple, state: dict
) -> NotPositiveDefiniteError:
    """Unpickles a :class:`NotPositiveDefiniteError` (or subclass): its message and its
    attributes."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error
