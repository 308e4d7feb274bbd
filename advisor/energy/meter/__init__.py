"""The energy meter: NVML's total-energy counter read over windows of CUDA-graph replays, repeated until
stable, with the GPU's state recorded; and a named window over every GPU of a run (``EnergyWindow``). The only
place that imports pynvml (``_nvml``); GPU checks refuse what this GPU cannot measure honestly."""

from advisor.energy.meter._gpu_checks import check_formats_supported, require_gpu
from advisor.energy.meter._meter import (
    EnergyCounter,
    EnergyMeter,
    Measurement,
    MeterConfig,
    Step,
    StepHandle,
    Window,
    coefficient_of_variation,
    open_meter,
    queue_depth,
    torch_device_uuid,
)
from advisor.energy.meter._nvml import GPUState, NvmlDevice, normalize_uuid
from advisor.energy.meter._series import fed_windows, steadiest_run
from advisor.energy.meter._summed import (
    SummedCounter,
    combined_state,
    gpus_busy,
    open_gpus_counter,
    other_gpus_busy,
    summed_config,
)
from advisor.energy.meter._window import CPU_WATTS_PER_CORE, EnergyWindow, WindowEnergy, visible_gpu_count

__all__ = [
    "CPU_WATTS_PER_CORE",
    "EnergyCounter",
    "EnergyMeter",
    "EnergyWindow",
    "GPUState",
    "Measurement",
    "MeterConfig",
    "NvmlDevice",
    "Step",
    "StepHandle",
    "SummedCounter",
    "Window",
    "WindowEnergy",
    "check_formats_supported",
    "coefficient_of_variation",
    "fed_windows",
    "combined_state",
    "gpus_busy",
    "other_gpus_busy",
    "normalize_uuid",
    "open_gpus_counter",
    "open_meter",
    "queue_depth",
    "require_gpu",
    "steadiest_run",
    "summed_config",
    "torch_device_uuid",
    "visible_gpu_count",
]
