"""Statistics over accuracy results (numpy + scipy, no torch): paired intervals of a plan's
drop against BF16 on the same items, the per-look confidence of a sequential design, and
the calibration of the proxy (KL) against benchmark drops.

Paired intervals (why these methods: docs/architecture.md, "Accuracy decisions"):

* per-item outcomes that are all 0 or 1 (``acc``, ``exact_match``): Tango's score
  interval for the difference of two paired proportions;
* any other per-item metric: a BCa bootstrap over items, each item's pair resampled
  together (resampling the per-item differences).

``drop`` is always "reference minus plan" in the direction where positive is worse,
so one budget (``max_drop``) fits metrics where higher or lower is better.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

# the statistics of a proxy calibration that can be undefined (None, with the reason in ``undefined``)
FIT_STATISTICS = ("spearman", "spearman_ci", "slope", "slope_ci", "intercept")
TANGO = "Tango score interval (paired binary outcomes)"
BOOTSTRAP = "paired BCa bootstrap over items"
NO_ITEMS = "undefined: no items scored for both the plan and the reference"


@dataclass(frozen=True)
class PairedInterval:
    """A plan's drop against the reference on the same ``n_items`` items, with its interval."""

    n_items: int
    drop: float
    ci_low: float
    ci_high: float
    confidence: float  # the level of this interval (after any correction for repeated looks)
    method: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def spearman(proxy_values: Sequence[float], bench_values: Sequence[float]) -> float:
    """Spearman rank correlation (scipy; ties get average ranks); NaN when undefined."""
    if len(proxy_values) != len(bench_values):
        raise ValueError(f"{len(proxy_values)} proxy values but {len(bench_values)} benchmark values")
    if len(proxy_values) < 2:
        return math.nan
    from scipy.stats import spearmanr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a constant input is NaN, said once here
        return float(spearmanr(list(proxy_values), list(bench_values)).statistic)


def look_confidence(confidence: float, looks: int) -> float:
    """Per-look level so that the intervals of all ``looks`` looks hold together with
    probability >= ``confidence`` (Bonferroni over the looks of a sequential design)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if looks < 1:
        raise ValueError(f"looks must be >= 1, got {looks}")
    return 1.0 - (1.0 - confidence) / looks


def _z(confidence: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(0.5 + confidence / 2))


def tango_score(worse: int, better: int, n: int, delta: float) -> float:
    """Tango's (1998) score statistic for H0: drop == ``delta``.

    ``worse``: items the reference gets right and the plan wrong; ``better``: the reverse;
    ``n``: all items. The drop is P(worse) - P(better); the variance uses the maximum
    likelihood P(better) under H0 (closed form, root of a quadratic).
    """
    a = 2.0 * n
    b = -worse - better + (2.0 * n - worse + better) * delta
    c = -better * delta * (1.0 - delta)
    p_better = (math.sqrt(max(b * b - 4.0 * a * c, 0.0)) - b) / (2.0 * a)
    var = n * (2.0 * p_better + delta * (1.0 - delta))
    diff = worse - better - n * delta
    if var <= 0.0:
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return diff / math.sqrt(var)


def tango_interval(worse: int, better: int, n: int, confidence: float) -> tuple[float, float]:
    """The set of drops that Tango's score test does not reject at ``1 - confidence``."""
    if n < 1 or worse < 0 or better < 0 or worse + better > n:
        raise ValueError(f"need 0 <= worse + better <= n and n >= 1, got {worse}, {better}, {n}")
    from scipy.optimize import brentq

    z = _z(confidence)
    estimate = (worse - better) / n
    edge = 1.0 - 1e-12  # the statistic is undefined at +-1 exactly

    def upper(delta: float) -> float:
        return tango_score(worse, better, n, delta) + z

    def lower(delta: float) -> float:
        return tango_score(worse, better, n, delta) - z

    high = edge if upper(edge) >= 0 else brentq(upper, estimate, edge, xtol=1e-12)
    low = -edge if lower(-edge) <= 0 else brentq(lower, -edge, estimate, xtol=1e-12)
    return (max(low, -1.0), min(high, 1.0))


def bootstrap_interval(diffs: Sequence[float], confidence: float, seed: int = 0,
                       n_resamples: int = 9999) -> tuple[float, float]:
    """BCa bootstrap interval of the mean of per-item differences (scipy.stats.bootstrap)."""
    from scipy.stats import bootstrap

    data = np.asarray(diffs, dtype=float)
    if data.size < 2 or np.all(data == data[0]):
        return (float(data.mean()), float(data.mean()))  # no spread to resample
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = bootstrap((data,), np.mean, confidence_level=confidence, method="BCa",
                        n_resamples=n_resamples, random_state=np.random.default_rng(seed))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if math.isnan(low) or math.isnan(high):  # BCa undefined (e.g. one odd item): percentile
        low, high = (float(q) for q in np.quantile(res.bootstrap_distribution, [(1 - confidence) / 2,
                                                                                 (1 + confidence) / 2]))
    return (low, high)


def is_binary(values: Sequence[float]) -> bool:
    return all(v in (0, 1) for v in values)


def paired_drop(reference: Sequence[float], plan: Sequence[float], confidence: float,
                higher_is_better: bool = True, seed: int = 0) -> PairedInterval:
    """The plan's drop against the reference on the same items (same order), with an interval
    at ``confidence``: Tango's score interval for 0/1 outcomes, else a paired BCa bootstrap. Without items
    the drop and its interval are undefined (NaN, ``method`` says why)."""
    if len(reference) != len(plan):
        raise ValueError(f"{len(reference)} reference items but {len(plan)} plan items: pair them first")
    if not reference:  # undefined, not an error: the verdict is "undecided" and the record says why
        return PairedInterval(0, math.nan, math.nan, math.nan, confidence, NO_ITEMS)
    sign = 1.0 if higher_is_better else -1.0
    diffs = [sign * (r - p) for r, p in zip(reference, plan, strict=True)]
    drop = sum(diffs) / len(diffs)
    if is_binary(reference) and is_binary(plan):
        worse = sum(1 for d in diffs if d > 0)
        better = sum(1 for d in diffs if d < 0)
        low, high = tango_interval(worse, better, len(diffs), confidence)
        method = TANGO
    else:
        low, high = bootstrap_interval(diffs, confidence, seed=seed)
        method = BOOTSTRAP
    return PairedInterval(len(diffs), drop, min(low, drop), max(high, drop), confidence, method)


# ---------------------------------------------------------------- proxy calibration


@dataclass(frozen=True)
class ProxyCalibration:
    """How benchmark drops follow proxy KL over scored plans, with its uncertainty."""

    task: str
    n_plans: int
    spearman: float | None
    spearman_ci: tuple[float, float] | None  # bootstrap over plans
    slope: float | None  # drop per nat of KL (least squares)
    slope_ci: tuple[float, float] | None
    intercept: float | None
    contradicted_pairs: list[tuple[str, str]]  # (proxy's better, benchmark's clearly better)
    confidence: float
    undefined: dict[str, str] = field(default_factory=dict)  # statistic left None -> why it is undefined

    @property
    def disagrees(self) -> bool:
        """The rankings disagree beyond noise: a pair the proxy orders one way and the
        benchmark's intervals order the other way, or a rank correlation clearly below 0."""
        return bool(self.contradicted_pairs) or (self.spearman_ci is not None and self.spearman_ci[1] < 0)


def contradicted_pairs(labels: Sequence[str], kl: Sequence[float],
                       intervals: Sequence[tuple[float, float]]) -> list[tuple[str, str]]:
    """Pairs (a, b) where the proxy prefers a (lower KL) but b's drop interval lies wholly below
    a's: disjoint intervals, so the benchmark prefers b beyond noise."""
    out = []
    for i in range(len(labels)):
        for j in range(len(labels)):
            if kl[i] < kl[j] and intervals[j][1] < intervals[i][0]:
                out.append((labels[i], labels[j]))
    return out


def _spearman_ci(kl: np.ndarray, drop: np.ndarray, confidence: float, seed: int,
                 n_resamples: int = 2000) -> tuple[float, float] | None:
    """Percentile bootstrap over plans (vectorized: ranks within each resample, then Pearson)."""
    from scipy.stats import rankdata

    idx = np.random.default_rng(seed).integers(0, len(kl), (n_resamples, len(kl)))
    rx, ry = rankdata(kl[idx], axis=1), rankdata(drop[idx], axis=1)
    rx -= rx.mean(axis=1, keepdims=True)
    ry -= ry.mean(axis=1, keepdims=True)
    denom = np.sqrt((rx**2).sum(axis=1) * (ry**2).sum(axis=1))
    ok = denom > 0  # a resample with one distinct value has no rank correlation
    if ok.sum() < n_resamples // 2:
        return None
    values = (rx * ry).sum(axis=1)[ok] / denom[ok]
    low, high = np.quantile(values, [(1 - confidence) / 2, (1 + confidence) / 2])
    return (float(low), float(high))


def proxy_calibration(task: str, labels: Sequence[str], kl: Sequence[float], drops: Sequence[float],
                      intervals: Sequence[tuple[float, float]], confidence: float = 0.95,
                      seed: int = 0) -> ProxyCalibration:
    """Fit benchmark drop against proxy KL over the scored plans of one task.

    Spearman's rho (its interval: percentile bootstrap over plans), a least-squares line
    (slope interval: t quantile times scipy.stats.linregress's standard error) and the
    pairs whose order the benchmark's intervals contradict. A statistic that cannot be computed
    (fewer than 3 plans, one KL for all, or drops that tie) is None, and ``undefined`` says why.
    """
    from scipy.stats import linregress, t

    n = len(labels)
    pairs = contradicted_pairs(labels, kl, intervals)
    if n < 3 or len(set(kl)) < 2:
        why = (f"{n} plan{'s' if n != 1 else ''} scored on this task; a fit needs 3 or more" if n < 3
               else "every scored plan has the same KL: no line can be fitted")
        return ProxyCalibration(task, n, None, None, None, None, None, pairs, confidence,
                                dict.fromkeys(FIT_STATISTICS, why))
    x, y = np.asarray(kl, dtype=float), np.asarray(drops, dtype=float)
    fit = linregress(x, y)
    rho = spearman(x, y)
    half = float(t.ppf(0.5 + confidence / 2, n - 2) * fit.stderr)
    values = {"spearman": None if math.isnan(rho) else rho, "spearman_ci": _spearman_ci(x, y, confidence, seed),
              "slope": _finite(fit.slope), "intercept": _finite(fit.intercept),
              "slope_ci": (float(fit.slope) - half, float(fit.slope) + half) if math.isfinite(half) else None}
    tie = (f"every scored plan has the same drop ({float(y[0]):.4g}): the benchmark cannot rank them"
           if np.all(y == y[0]) else None)
    reasons = {
        "spearman": tie or "the ranks are undefined",
        "spearman_ci": tie or "most bootstrap resamples of the plans hold a single distinct KL or drop",
        "slope": "the least-squares fit is undefined", "intercept": "the least-squares fit is undefined",
        "slope_ci": (f"{tie}, so the line fits them exactly and its slope has no spread to estimate" if tie
                     else "the slope's standard error is undefined"),
    }
    return ProxyCalibration(task, n, values["spearman"], values["spearman_ci"], values["slope"], values["slope_ci"],
                            values["intercept"], pairs, confidence,
                            {k: reasons[k] for k in FIT_STATISTICS if values[k] is None})


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None
