"""Several GPUs metered as one: the energy of an engine that spreads a model over them (tensor parallelism).

The sum of their NVML counters is an :class:`~advisor.energy.meter.EnergyCounter`, so the meter's windows,
repeats and spread apply unchanged. Each GPU's counter ticks on its own clock, so the sum moves up to N times
per tick period and an edge of the sum is an edge of one GPU only: :func:`summed_config` asks N times the ticks
of a window, which keeps it as long as one GPU's (each other GPU's reading is at most one tick stale at either
edge, a share of the window that the length keeps small).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from advisor.energy.meter._meter import EnergyCounter, MeterConfig, torch_device_uuid
from advisor.energy.meter._nvml import GPUState, NvmlDevice, gpu_count
from advisor.errors import SetupError


def combined_state(states: Sequence[GPUState]) -> GPUState:
    """One state for the GPUs an engine uses: the power limits and draws summed, the slowest clocks, the hottest
    temperature (what throttles first), the names and UUIDs of all."""
    first = states[0]
    names = {s.name for s in states}
    name = f"{len(states)}x {first.name}" if len(names) == 1 else " + ".join(s.name for s in states)
    return GPUState(
        name=name if len(states) > 1 else first.name,
        index=first.index,
        driver=first.driver,
        power_limit_w=sum(s.power_limit_w for s in states),
        sm_clock_mhz=min(s.sm_clock_mhz for s in states),
        mem_clock_mhz=min(s.mem_clock_mhz for s in states),
        temperature_c=max(s.temperature_c for s in states),
        power_w=sum(s.power_w for s in states),
        uuid=",".join(s.uuid for s in states),
    )


class SummedCounter:
    """The energy of several GPUs (mJ, summed) and their :func:`combined_state`."""

    def __init__(self, counters: Sequence[EnergyCounter]) -> None:
        if not counters:
            raise SetupError("a summed energy counter needs at least one GPU")
        self.counters = list(counters)

    def energy_mj(self) -> int:
        return sum(c.energy_mj() for c in self.counters)

    def state(self) -> GPUState:
        return combined_state([c.state() for c in self.counters])


def summed_config(config: MeterConfig, gpus: int) -> MeterConfig:
    """``config`` for a counter summed over ``gpus`` GPUs: ``min_ticks`` per GPU, as the module doc says."""
    return config if gpus <= 1 else replace(config, min_ticks=config.min_ticks * gpus)


def open_gpus_counter(gpus: int) -> EnergyCounter:
    """The counter of torch's ``cuda:0`` .. ``cuda:{gpus-1}`` (each found in NVML by its UUID, as
    :func:`~advisor.energy.meter.open_meter` finds one): that GPU's own for one, their sum for more."""
    from advisor.energy.meter._nvml import NvmlDevice

    devices = [NvmlDevice(i, uuid=torch_device_uuid(i)) for i in range(gpus)]
    return devices[0] if gpus == 1 else SummedCounter(devices)


def nvml_devices(counter: EnergyCounter) -> list[NvmlDevice] | None:
    """The NVML devices behind ``counter`` (:func:`open_gpus_counter`'s: one :class:`NvmlDevice` or a
    :class:`SummedCounter` of them); None for a counter that is not NVML's."""
    devices = counter.counters if isinstance(counter, SummedCounter) else [counter]
    nvml = [d for d in devices if isinstance(d, NvmlDevice)]
    return nvml if len(nvml) == len(devices) else None


def gpus_busy(counter: EnergyCounter) -> Callable[[], float | None] | None:
    """The mean NVML utilization (%) of the GPUs behind ``counter`` (:func:`nvml_devices`) as one reading (None where
    any GPU does not say); None for a counter that is not NVML's."""
    devices = nvml_devices(counter)
    if devices is None:
        return None

    def read() -> float | None:
        values = [d.busy_pct() for d in devices]
        return None if any(v is None for v in values) else sum(values) / len(values)  # type: ignore[arg-type]

    return read


def other_gpus_busy(counter: EnergyCounter) -> Callable[[], float | None] | None:
    """The busiest NVML utilization (%) among this host's GPUs that ``counter`` does not meter, as one reading (None
    where none says): another job there shares the host's CPUs, memory and PCIe with the metered engine. None for a
    counter that is not NVML's, or a host with no other GPU NVML can read."""
    devices = nvml_devices(counter)
    if devices is None:
        return None
    mine = {d.index for d in devices}
    others = []
    for index in sorted(set(range(gpu_count())) - mine):
        try:
            others.append(NvmlDevice(index))
        except SetupError:  # a GPU whose counters NVML does not expose: nothing to read there
            continue
    if not others:
        return None

    def read() -> float | None:
        values = [v for v in (d.busy_pct() for d in others) if v is not None]
        return max(values) if values else None

    return read
