"""Size buckets: array sizes padded up so that programs compile once per bucket.

A compiled program depends on its arrays' shapes. A loop whose size grows by one (Bayesian
optimisation), cross-validation folds of ``n`` and ``n + 1`` points, or predictions at a
varying number of test points would each compile anew; padded to a bucket (with rows that
change no result: masked training rows, discarded test rows) they share one program.

Example:
    >>> from gpchol._base.buckets import bucket_size
    >>> bucket_size(33), bucket_size(257), bucket_size(513), bucket_size(100, 7)
    (64, 264, 528, 105)
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["BUCKET_MAX_N", "bucket_size", "pad_rows"]

#: Above this size arrays are not padded: the compile is then a small part of the work,
#: and a padded row costs more than it saves.
BUCKET_MAX_N = 4096


def bucket_size(n: int, bucket: bool | int = True) -> int:
    """The padded number of rows for ``n`` training points.

    Args:
        n: the number of training points.
        bucket: ``True``: multiples of 32 up to 256 (where a step's time is mostly not
            the factorization's, so a padded row costs little next to a compile), then
            multiples of ``2^(k-5)`` for ``2^k <= n < 2^(k+1)`` (at most 1/32 of ``n``
            added, the cubic work at most ~10% more) up to :data:`BUCKET_MAX_N`, ``n``
            itself above; ``False``: ``n``; an int ``m``: the next multiple of ``m``.
            Measured cost at the edges: ``benchmarks/bench_buckets.py``.

    Returns:
        The bucket's size, ``>= n``.
    """
    if bucket is False or n <= 0:
        return n
    if bucket is True:
        if n > BUCKET_MAX_N:
            return n
        step = 32 if n <= 256 else 2 ** (int(n).bit_length() - 6)
    else:
        step = int(bucket)
    return -(-n // step) * step


def pad_rows(a: Any, size: int, fill: Any) -> np.ndarray:
    """``a`` with copies of the row ``fill`` appended up to ``size`` rows (host arrays).

    The one way padded training rows are made (the fit programs, the estimator): the
    inputs padded with their first row (finite, and a distance the kernels know), a
    per-point noise with ones, the targets with zeros; the mask then leaves them out.

    Args:
        a: ``(n, ...)``.
        size: the rows wanted, ``>= n``.
        fill: one row, broadcast to ``a.shape[1:]``.

    Returns:
        ``(size, ...)``, ``a``'s dtype.

    Example:
        >>> from gpchol._base.buckets import pad_rows
        >>> pad_rows(np.array([[1.0, 2.0]]), 3, [1.0, 2.0]).tolist()
        [[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]]
    """
    a = np.asarray(a)
    pad = size - a.shape[0]
    if pad <= 0:
        return a
    row = np.broadcast_to(np.asarray(fill, a.dtype), (1, *a.shape[1:]))
    return np.concatenate([a, np.repeat(row, pad, axis=0)])
