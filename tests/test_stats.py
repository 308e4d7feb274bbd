"""Paired drop intervals against brute-force computations on fixed per-item data, and the proxy fit."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
from scipy.stats import norm

from advisor.search.stats import (
    BOOTSTRAP,
    TANGO,
    bootstrap_interval,
    contradicted_pairs,
    look_confidence,
    paired_drop,
    proxy_calibration,
    spearman,
    tango_interval,
)

# ---------------------------------------------------------------- Tango's interval for paired 0/1 items


def brute_force_score_interval(worse: int, better: int, n: int, confidence: float) -> tuple[float, float]:
    """Invert the score test on a grid of drops, with the constrained maximum likelihood found by
    searching the multinomial likelihood on a grid (no closed form)."""
    z = norm.ppf(0.5 + confidence / 2)
    same = n - worse - better
    accepted = []
    for delta in np.linspace(-0.9999, 0.9999, 4001):
        lo, hi = max(0.0, -delta), (1.0 - delta) / 2  # P(better) keeping every cell probability >= 0
        p = np.linspace(lo, hi, 2001)[1:-1]
        with np.errstate(divide="ignore", invalid="ignore"):
            loglik = (worse * np.log(p + delta) if worse else 0) + (better * np.log(p) if better else 0) \
                + (same * np.log(1 - 2 * p - delta) if same else 0)
        p_hat = p[np.nanargmax(np.where(np.isfinite(loglik), loglik, -np.inf))]
        if not better and not worse:
            p_hat = lo  # the likelihood then only grows toward the lower edge
        var = n * (2 * p_hat + delta * (1 - delta))
        diff = worse - better - n * delta
        if (abs(diff) <= z * math.sqrt(var)) if var > 0 else diff == 0:
            accepted.append(delta)
    return min(accepted), max(accepted)


@pytest.mark.parametrize(("worse", "better", "n"), [(7, 2, 150), (30, 10, 200), (3, 9, 60), (0, 0, 100),
                                                     (12, 0, 80), (40, 38, 400)])
def test_tango_interval_equals_brute_force_score_inversion(worse, better, n):
    got = tango_interval(worse, better, n, 0.95)
    want = brute_force_score_interval(worse, better, n, 0.95)
    step = 2 * 0.9999 / 4000
    assert got[0] == pytest.approx(want[0], abs=2 * step)
    assert got[1] == pytest.approx(want[1], abs=2 * step)
    assert got[0] <= (worse - better) / n <= got[1]


def test_tango_interval_without_discordant_items_is_not_zero_width():
    """100 items, plan and BF16 agree on all: the drop is 0 but 3.7 points are still possible."""
    low, high = tango_interval(0, 0, 100, 0.95)
    z2 = norm.ppf(0.975) ** 2
    assert high == pytest.approx(z2 / (100 + z2), rel=1e-6)  # closed form in this case
    assert low == pytest.approx(-high, rel=1e-6)


def test_tango_interval_covers_a_known_drop():
    """Simulated items with P(worse) = 0.08, P(better) = 0.03 (drop 0.05): 95% coverage +- noise."""
    rng = np.random.default_rng(7)
    n, reps, true = 150, 1500, 0.05
    cells = rng.multinomial(n, [0.08, 0.03, 0.89], size=reps)
    hits = sum(lo <= true <= hi for lo, hi in (tango_interval(int(w), int(b), n, 0.95) for w, b, _ in cells))
    assert 0.93 <= hits / reps <= 0.97


def test_tango_interval_rejects_impossible_counts():
    with pytest.raises(ValueError):
        tango_interval(60, 50, 100, 0.95)


# ---------------------------------------------------------------- bootstrap for non-binary items


def exact_bca(diffs: list[float], confidence: float) -> tuple[float, float]:
    """BCa from the exact bootstrap distribution: every multiset of n items with its multinomial weight."""
    n = len(diffs)
    means, weights = [], []
    for multiset in itertools.combinations_with_replacement(range(n), n):
        counts = Counter(multiset)
        means.append(sum(diffs[i] * c for i, c in counts.items()) / n)
        weights.append(math.factorial(n) / math.prod(math.factorial(c) for c in counts.values()) / n**n)
    means, weights = np.array(means), np.array(weights)
    order = np.argsort(means)
    means, cdf = means[order], np.cumsum(weights[order])
    theta = float(np.mean(diffs))
    z0 = norm.ppf(weights[order][means < theta - 1e-12].sum())
    jack = np.array([np.mean(np.delete(diffs, i)) for i in range(n)])
    d = jack.mean() - jack
    a = (d**3).sum() / (6 * ((d**2).sum()) ** 1.5)

    def quantile(alpha: float) -> float:
        zz = norm.ppf(alpha)
        level = norm.cdf(z0 + (z0 + zz) / (1 - a * (z0 + zz)))
        return float(means[np.searchsorted(cdf, level)])

    return quantile((1 - confidence) / 2), quantile((1 + confidence) / 2)


def test_bootstrap_interval_matches_the_exact_bootstrap_distribution():
    diffs = [0.30, -0.10, 0.55, 0.0, 0.20, -0.40, 0.90]
    want = exact_bca(diffs, 0.90)
    got = bootstrap_interval(diffs, 0.90, seed=3, n_resamples=40_000)
    spread = max(diffs) - min(diffs)
    assert got[0] == pytest.approx(want[0], abs=0.02 * spread)
    assert got[1] == pytest.approx(want[1], abs=0.02 * spread)


def test_paired_drop_picks_the_method_from_the_items_and_respects_direction():
    ref = [1, 1, 0, 1, 0, 1, 1, 0, 1, 1]
    plan = [1, 0, 0, 1, 0, 1, 0, 0, 1, 1]
    res = paired_drop(ref, plan, 0.95)
    assert res.method == TANGO and res.drop == pytest.approx(0.2) and res.n_items == 10
    assert (res.ci_low, res.ci_high) == pytest.approx(tango_interval(2, 0, 10, 0.95))

    ref_f = [0.5, 0.7, 0.2, 0.9, 0.4, 0.6]
    plan_f = [0.4, 0.7, 0.1, 0.8, 0.5, 0.5]
    res = paired_drop(ref_f, plan_f, 0.95, seed=1)
    assert res.method == BOOTSTRAP and res.drop == pytest.approx(0.05)
    # lower is better (say, a perplexity-like metric): the same numbers are a gain
    flipped = paired_drop(ref_f, plan_f, 0.95, higher_is_better=False, seed=1)
    assert flipped.drop == pytest.approx(-0.05) and flipped.ci_high <= res.ci_high

    with pytest.raises(ValueError, match="pair"):
        paired_drop([1, 0], [1], 0.95)


def test_pairing_is_what_narrows_the_interval():
    """Same accuracies, but the plan errs on the very items BF16 gets right vs on other items."""
    rng = np.random.default_rng(0)
    ref = rng.integers(0, 2, 400).tolist()
    plan_close = list(ref)
    for i in [i for i, v in enumerate(ref) if v][:8]:
        plan_close[i] = 0  # 8 flips: drop 0.02
    close = paired_drop(ref, plan_close, 0.95)
    shuffled = paired_drop(ref, rng.permutation(plan_close).tolist(), 0.95)
    assert close.ci_high - close.ci_low < (shuffled.ci_high - shuffled.ci_low) / 2


def test_look_confidence_is_bonferroni_over_looks():
    assert look_confidence(0.95, 1) == pytest.approx(0.95)
    assert look_confidence(0.95, 5) == pytest.approx(0.99)
    with pytest.raises(ValueError):
        look_confidence(1.0, 2)


# ---------------------------------------------------------------- proxy calibration


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([0.01, 0.02, 0.5], [0.4, 0.39, 0.1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)  # ties get average ranks
    assert math.isnan(spearman([1], [2]))
    with pytest.raises(ValueError):
        spearman([1, 2], [1])


def test_contradicted_pairs_need_disjoint_intervals():
    labels = ["a", "b", "c"]
    kl = [0.01, 0.02, 0.05]
    intervals = [(0.03, 0.08), (-0.01, 0.02), (0.0, 0.04)]  # b clearly below a; c overlaps both
    assert contradicted_pairs(labels, kl, intervals) == [("a", "b")]


def test_proxy_calibration_recovers_a_linear_relation_and_flags_disagreement():
    kl = [0.0, 0.01, 0.02, 0.05, 0.1, 0.2]
    drops = [0.0, 0.005, 0.01, 0.025, 0.05, 0.1]  # drop = 0.5 * KL
    narrow = [(d - 0.002, d + 0.002) for d in drops]
    fit = proxy_calibration("t", list("abcdef"), kl, drops, narrow)
    assert fit.slope == pytest.approx(0.5) and fit.slope_ci[0] == pytest.approx(0.5, abs=1e-9)
    assert fit.spearman == pytest.approx(1.0) and not fit.disagrees

    reversed_drops = drops[::-1]
    fit = proxy_calibration("t", list("abcdef"), kl, reversed_drops, [(d - 0.002, d + 0.002) for d in reversed_drops])
    assert fit.spearman == pytest.approx(-1.0) and fit.slope < 0 and fit.disagrees

    too_few = proxy_calibration("t", ["a", "b"], [0.0, 0.1], [0.0, 0.02], [(0, 0), (0.01, 0.03)])
    assert too_few.slope is None and too_few.spearman is None and not too_few.disagrees
