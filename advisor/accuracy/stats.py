"""Statistics over accuracy results (scipy), shared by the report and the lm-eval stage."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence


def spearman(proxy_values: Sequence[float], bench_values: Sequence[float]) -> float:
    """Spearman rank correlation (scipy; ties get average ranks); NaN when undefined.

    Sign convention: raw correlation. KL (lower is better) against accuracy (higher is
    better) is good when it is close to -1.
    """
    if len(proxy_values) != len(bench_values):
        raise ValueError(f"{len(proxy_values)} proxy values but {len(bench_values)} benchmark values")
    if len(proxy_values) < 2:
        return math.nan
    from scipy.stats import spearmanr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a constant input is NaN, said once here
        return float(spearmanr(list(proxy_values), list(bench_values)).statistic)
