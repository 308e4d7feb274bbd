"""What the search cost in energy, and how long the recommendation takes to pay it back.

On a GPU the search's joules are NVML's energy counter of GPU 0 over the whole run (every process on that
GPU counts). Without one they are estimated, and labelled so: the CPU seconds of the run and its worker
children times :data:`CPU_WATTS_PER_CORE`, a stated draw of one busy server core.
"""

from __future__ import annotations

import resource
import time
from dataclasses import asdict, dataclass
from typing import Any

CPU_WATTS_PER_CORE = 10.0  # a busy core of a current server CPU, package power shared over its cores
SECONDS_PER_DAY = 86_400


@dataclass(frozen=True)
class SearchEnergy:
    joules: float
    seconds: float
    source: str
    measured: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def plus(self, other: SearchEnergy | None) -> SearchEnergy:
        """This run's energy added to an earlier run's of the same study (a resumed search)."""
        if other is None:
            return self
        measured = self.measured and other.measured
        source = self.source if self.source == other.source else f"{self.source}; earlier: {other.source}"
        return SearchEnergy(self.joules + other.joules, self.seconds + other.seconds, source, measured)


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class SearchEnergyMeter:
    """Started before the search, read after it: NVML where a GPU is, else the CPU estimate."""

    def __init__(self) -> None:
        from advisor.errors import SetupError

        self._t0, self._cpu0 = time.perf_counter(), _cpu_seconds()
        try:
            from advisor.energy.meter import NvmlDevice

            self._gpu: Any = NvmlDevice(0)
            self._mj0 = self._gpu.energy_mj()
        except SetupError:
            self._gpu = None

    def read(self) -> SearchEnergy:
        seconds = time.perf_counter() - self._t0
        if self._gpu is not None:
            joules = (self._gpu.energy_mj() - self._mj0) / 1e3
            return SearchEnergy(joules, seconds, f"measured (NVML, {self._gpu.name}, whole run)", True)
        cpu = _cpu_seconds() - self._cpu0
        return SearchEnergy(cpu * CPU_WATTS_PER_CORE, seconds,
                            f"estimated ({cpu:.0f} CPU seconds x {CPU_WATTS_PER_CORE:g} W per busy core; no GPU)",
                            False)


@dataclass(frozen=True)
class Payback:
    """The recommendation's saving against BF16 at ``requests_per_s`` and the days it takes to repay the search
    (None: it saves nothing, so it never pays back)."""

    search_j: float
    search_source: str
    workload: str
    requests_per_s: float
    tokens_per_day: float
    saved_j_per_token: float
    saved_j_per_day: float
    days: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def payback(search: SearchEnergy, workload: str, requests_per_s: float, output_tokens: int,
            bf16_j_per_token: float, recommended_j_per_token: float) -> Payback:
    """Joules saved per day serving ``requests_per_s`` requests of ``output_tokens`` tokens with the
    recommendation instead of BF16, and the days until they equal the search's joules."""
    tokens_per_day = requests_per_s * SECONDS_PER_DAY * output_tokens
    saved = bf16_j_per_token - recommended_j_per_token
    per_day = saved * tokens_per_day
    days = search.joules / per_day if per_day > 0 else None
    return Payback(search.joules, search.source, workload, requests_per_s, tokens_per_day, saved, per_day, days)


def describe_days(days: float | None) -> str:
    if days is None:
        return "never (the recommendation saves no energy against BF16)"
    if days * 24 < 1:
        return f"{days * 24 * 60:.1f} minutes"
    if days < 2:
        return f"{days * 24:.1f} hours"
    return f"{days:.1f} days"
