"""The one module that imports ``pynvml`` (from the nvidia-ml-py package).

It reads; it never sets. No function here changes clocks, power limits or modes.
NVML errors become :class:`~advisor.errors.SetupError` with the fix.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from advisor.errors import SetupError


@dataclass(frozen=True)
class GPUState:
    """What the GPU was when a measurement was taken (read, never set)."""

    name: str
    index: int
    driver: str
    power_limit_w: float
    sm_clock_mhz: int
    mem_clock_mhz: int
    temperature_c: int
    power_w: float
    uuid: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _pynvml() -> Any:
    try:
        import pynvml  # noqa: PLC0415 (lazy: keeps `advisor --help` instant)
    except ImportError as exc:
        raise SetupError(
            "NVML is not importable: install nvidia-ml-py (`pip install nvidia-ml-py`; "
            "uninstall the old `pynvml` package if present)"
        ) from exc
    if not hasattr(pynvml, "nvmlDeviceGetTotalEnergyConsumption"):
        raise SetupError(
            "the installed pynvml lacks nvmlDeviceGetTotalEnergyConsumption: uninstall pynvml and install nvidia-ml-py"
        )
    return pynvml


def normalize_uuid(uuid: str) -> str:
    """NVML writes ``GPU-8d1a...``, torch ``8d1a...``: compare them without prefix or case."""
    return uuid.lower().removeprefix("gpu-")


def _index_of_uuid(nv: Any, count: int, uuid: str) -> int:
    for i in range(count):
        raw = nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i))
        if normalize_uuid(raw.decode() if isinstance(raw, bytes) else str(raw)) == normalize_uuid(uuid):
            return i
    raise SetupError(f"NVML sees no GPU with UUID {uuid} (the one torch uses); the energy counter cannot be read")


def gpu_count() -> int:
    """How many GPUs NVML sees on this host (every one, whatever CUDA_VISIBLE_DEVICES hides from torch)."""
    nv = _pynvml()
    try:
        nv.nvmlInit()
        return int(nv.nvmlDeviceGetCount())
    except nv.NVMLError as exc:
        raise SetupError(f"NVML could not count this host's GPUs ({exc})") from exc


class NvmlDevice:
    """One GPU seen through NVML. ``energy_mj()`` is the total-energy counter."""

    def __init__(self, index: int = 0, uuid: str | None = None) -> None:
        nv = _pynvml()
        self._nv = nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise SetupError(
                f"NVML could not start ({exc}): no NVIDIA driver or GPU here; "
                "measured energy needs an NVIDIA GPU (use --energy predicted)"
            ) from exc
        try:
            count = nv.nvmlDeviceGetCount()
            if uuid is not None:
                index = _index_of_uuid(nv, count, uuid)
            if index >= count:
                raise SetupError(f"GPU index {index} does not exist: NVML sees {count} GPU(s)")
            self.index = index
            self._h = nv.nvmlDeviceGetHandleByIndex(index)
            name = nv.nvmlDeviceGetName(self._h)
            self.name = name.decode() if isinstance(name, bytes) else str(name)
            drv = nv.nvmlSystemGetDriverVersion()
            self.driver = drv.decode() if isinstance(drv, bytes) else str(drv)
            nv.nvmlDeviceGetTotalEnergyConsumption(self._h)
        except nv.NVMLError as exc:
            raise SetupError(
                f"NVML cannot read the energy counter of GPU {index} ({exc}); it needs a "
                "Volta or newer data-center GPU and a driver that exposes it"
            ) from exc

    def energy_mj(self) -> int:
        """Total energy since the driver loaded, in millijoules (ticks about every 100 ms)."""
        try:
            return int(self._nv.nvmlDeviceGetTotalEnergyConsumption(self._h))
        except self._nv.NVMLError as exc:
            raise SetupError(f"NVML energy read failed on GPU {self.index}: {exc}") from exc

    def busy_pct(self) -> float | None:
        """NVML's GPU utilization: the share of its last sample period (1/6 s to 1 s) in which a kernel ran, in %;
        None where the driver does not say. Below 100 under a steady load, the GPU waited on something else."""
        try:
            return float(self._nv.nvmlDeviceGetUtilizationRates(self._h).gpu)
        except self._nv.NVMLError:
            return None

    def power_w(self) -> float:
        try:
            return self._nv.nvmlDeviceGetPowerUsage(self._h) / 1000.0
        except self._nv.NVMLError:
            return float("nan")

    def state(self) -> GPUState:
        nv = self._nv

        def _read(fn, *args, default=-1):
            try:
                return fn(self._h, *args)
            except nv.NVMLError:
                return default

        limit = _read(nv.nvmlDeviceGetEnforcedPowerLimit)
        return GPUState(
            name=self.name,
            index=self.index,
            driver=self.driver,
            power_limit_w=limit / 1000.0 if limit > 0 else float("nan"),
            sm_clock_mhz=int(_read(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM)),
            mem_clock_mhz=int(_read(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM)),
            temperature_c=int(_read(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)),
            power_w=self.power_w(),
            uuid=str(_read(nv.nvmlDeviceGetUUID, default="")),
        )
