"""Which of a series' windows a measurement keeps (:class:`~advisor.energy.meter.EnergyMeter`'s last step): the
starved ones left out, then the steadiest ``repeats`` consecutive ones."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: a window this much below the steady level in both power and throughput was starved: on an H200 a host stall took
#: a steady FP8 load from 690 W and 9.3k tokens/s to 505 W and 6.1k for its last five windows, while a power-capped
#: FP8 load's windows moved 5-10% in throughput at one power (reports/benchmarks/verify_time.md, round 5)
STARVED_DROP = 0.10


@dataclass(frozen=True)
class Window:
    """One tick-aligned window: ``energy_j`` over ``time_s`` while ``steps`` finished."""

    energy_j: float
    time_s: float
    steps: int
    ticks: int
    began_s: float = 0.0  # the meter's clock when it opened (where a starved window lay, for the load's latencies)

    @property
    def j_per_step(self) -> float:
        return self.energy_j / self.steps if self.steps else float("nan")

    @property
    def s_per_step(self) -> float:
        return self.time_s / self.steps if self.steps else float("nan")

    @property
    def power_w(self) -> float:
        return self.energy_j / self.time_s


def coefficient_of_variation(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else float("inf")


def window_cv(windows: Sequence[Window]) -> float:
    return coefficient_of_variation([w.j_per_step for w in windows if w.steps]) if all(w.steps for w in windows) \
        else float("inf")


def fed_windows(windows: Sequence[Window], n: int) -> list[Window]:
    """``windows`` without the starved ones (:data:`STARVED_DROP`), where ``n`` or more remain; else all of them.
    The steady level is the highest median power of ``n`` consecutive windows: a stall that lasts most of the series
    must not become the level the rest are judged by."""
    timed = [w for w in windows if w.steps and w.time_s]
    if len(timed) <= n:
        return list(windows)
    runs = [timed[i:i + n] for i in range(len(timed) - n + 1)]
    level = max(runs, key=lambda r: statistics.median(w.power_w for w in r))
    power = statistics.median(w.power_w for w in level)
    speed = statistics.median(w.steps / w.time_s for w in level)
    fed = [w for w in windows if not (w.steps and w.time_s and w.power_w < (1 - STARVED_DROP) * power
                                      and w.steps / w.time_s < (1 - STARVED_DROP) * speed)]
    return fed if len(fed) >= n else list(windows)


def steadiest_run(windows: Sequence[Window], n: int) -> list[Window]:
    """The ``n`` consecutive windows of the lowest spread (the last such run where several tie)."""
    if len(windows) <= n:
        return list(windows)
    runs = [list(windows[i:i + n]) for i in range(len(windows) - n + 1)]
    return min(reversed(runs), key=window_cv)
