"""Numeric formats, what each costs in bytes, and which GPUs run them natively.

The ModelOpt quantizer settings for each format live in ``quantize.py``; this module
holds only facts that need no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Format(str, Enum):
    """A per-layer numeric format. Values are what recipes and plans spell."""

    BF16 = "bf16"
    FP8 = "fp8"
    NVFP4 = "nvfp4"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class FormatSpec:
    """Storage and compute facts of one format (W = weights, A = activations)."""

    name: Format
    weight_bits: float
    activation_bits: float
    # Bytes per weight element including scales: NVFP4 stores one FP8 scale per
    # 16 elements (0.5 + 1/16 bytes); FP8 per-tensor scales are negligible.
    weight_bytes_per_element: float
    description: str

    @property
    def effective_bits(self) -> float:
        return self.weight_bytes_per_element * 8


FORMAT_SPECS: dict[Format, FormatSpec] = {
    Format.BF16: FormatSpec(Format.BF16, 16, 16, 2.0, "BF16 weights and activations"),
    Format.FP8: FormatSpec(
        Format.FP8, 8, 8, 1.0, "FP8 E4M3 W8A8, per-tensor scales (ModelOpt FP8_DEFAULT_CFG)"
    ),
    Format.NVFP4: FormatSpec(
        Format.NVFP4,
        4,
        4,
        0.5 + 1 / 16,
        "NVFP4 E2M1 W4A4, 16-element blocks with FP8 scales (ModelOpt NVFP4_DEFAULT_CFG)",
    ),
}


# KV-cache formats the advisor searches: BF16, or FP8 E4M3 with per-tensor k/v scales (ModelOpt
# FP8_KV_CFG; TensorRT-LLM kv_cache_config.dtype fp8, vLLM/SGLang --kv-cache-dtype fp8).
KV_CACHE_FORMATS = (Format.BF16, Format.FP8)
# Bytes per cached K or V element.
KV_CACHE_BYTES = {Format.BF16: 2.0, Format.FP8: 1.0}


class GPU(str, Enum):
    """Target GPUs the advisor knows."""

    H100 = "h100"
    H200 = "h200"
    B200 = "b200"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class GPUSpec:
    """Datasheet numbers (dense tensor-core throughput, SXM parts).

    Sources: NVIDIA H100 and H200 datasheets, NVIDIA DGX/HGX B200 datasheet.
    ``tensor_tflops`` holds only formats that run natively; a missing format
    cannot run on that GPU's tensor cores.
    """

    name: GPU
    marketing_name: str
    compute_capability: tuple[int, int]
    memory_bandwidth_tb_s: float
    tdp_w: float
    idle_w: float
    tensor_tflops: dict[Format, float]
    memory_gb: float  # HBM capacity (weights and the KV cache share it)

    def supports(self, fmt: Format) -> bool:
        return fmt in self.tensor_tflops

    def supports_kv_cache(self, fmt: Format) -> bool:
        """An FP8 KV cache needs FP8 attention kernels (Hopper, Ada, Blackwell: where FP8 runs)."""
        return fmt in KV_CACHE_FORMATS and self.supports(fmt)


GPU_SPECS: dict[GPU, GPUSpec] = {
    GPU.H100: GPUSpec(
        GPU.H100, "NVIDIA H100 SXM", (9, 0), 3.35, 700.0, 70.0,
        {Format.BF16: 989.0, Format.FP8: 1979.0}, 80.0,
    ),
    GPU.H200: GPUSpec(
        GPU.H200, "NVIDIA H200 SXM", (9, 0), 4.8, 700.0, 75.0,
        {Format.BF16: 989.0, Format.FP8: 1979.0}, 141.0,
    ),
    GPU.B200: GPUSpec(
        GPU.B200, "NVIDIA B200 SXM", (10, 0), 8.0, 1000.0, 120.0,
        {Format.BF16: 2250.0, Format.FP8: 4500.0, Format.NVFP4: 9000.0}, 180.0,
    ),
}


def gpu_from_device_name(name: str) -> GPU | None:
    """Map an NVML/torch device name ('NVIDIA H100 80GB HBM3') to a known GPU."""
    lowered = name.lower()
    for gpu in GPU:
        if gpu.value in lowered:
            return gpu
    return None
