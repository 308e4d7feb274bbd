"""A named begin/end window of energy over every GPU this process sees, the way Zeus's ``ZeusMonitor`` measures a
stretch of work (``begin_window(name)`` ... ``end_window(name)``): each GPU's NVML total-energy counter read at the
two ends and summed (:func:`~advisor.energy.meter.open_gpus_counter`), whatever ran on those GPUs in between (this
process, its workers, other processes). A run's own stretch (a whole search) is minutes long, so a counter tick
(about 100 ms) at either end is noise and no repeat is needed.

Without an NVIDIA GPU the window is an estimate, labelled so: the CPU seconds of this process and its finished
children times :data:`CPU_WATTS_PER_CORE`, a stated draw of one busy server core.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from typing import Any

from advisor.errors import SetupError

CPU_WATTS_PER_CORE = 10.0  # a busy core of a current server CPU, package power shared over its cores


@dataclass(frozen=True)
class WindowEnergy:
    name: str
    joules: float
    seconds: float
    source: str  # what measured it, or how it was estimated
    measured: bool


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def visible_gpu_count() -> int:
    """The CUDA GPUs this process sees (torch's ``cuda:0`` ..; 0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class EnergyWindow:
    """``EnergyWindow("search").begin()`` ... ``.end()``: the energy between the two calls (module docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._counter: Any = None
        self._gpus = 0

    def begin(self) -> EnergyWindow:
        from advisor.energy.meter._summed import open_gpus_counter

        self._t0, self._cpu0 = time.perf_counter(), cpu_seconds()
        self._gpus = visible_gpu_count()
        try:
            self._counter = open_gpus_counter(self._gpus) if self._gpus else None
            self._mj0 = self._counter.energy_mj() if self._counter is not None else 0
        except SetupError:  # a GPU without a readable counter: the estimate, as without a GPU
            self._counter = None
        return self

    def end(self) -> WindowEnergy:
        seconds = time.perf_counter() - self._t0
        if self._counter is not None:
            joules = (self._counter.energy_mj() - self._mj0) / 1e3
            name = self._counter.state().name
            return WindowEnergy(self.name, joules, seconds, f"measured (NVML, {name}, whole run)", True)
        cpu = cpu_seconds() - self._cpu0
        return WindowEnergy(self.name, cpu * CPU_WATTS_PER_CORE, seconds,
                            f"estimated ({cpu:.0f} CPU seconds x {CPU_WATTS_PER_CORE:g} W per busy core; no GPU)",
                            False)
