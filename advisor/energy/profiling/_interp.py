"""Read a profile between its measured points: piecewise-linear interpolation."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence


def interp(xs: Sequence[float], ys: Sequence[float], x: float, log_x: bool = False) -> float:
    """Piecewise-linear interpolation; linear extrapolation from the end segments."""
    if len(xs) == 1:
        return ys[0]
    f = (lambda v: math.log2(v)) if log_x else (lambda v: v)
    i = min(max(bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1 = f(xs[i - 1]), f(xs[i])
    t = (f(x) - x0) / (x1 - x0)
    return ys[i - 1] + t * (ys[i] - ys[i - 1])
