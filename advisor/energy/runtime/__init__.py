"""The serving runtime the measured tier and the profiles run: a plan's decoder with real BF16/FP8 kernels
(cuBLASLt GEMMs, fused Triton kernels in ``kernels``), replayed as CUDA graphs.

:class:`DecoderDims` (what the runtime builds, layer by layer) is torch-free and imported eagerly; the
rest needs torch and a GPU and is imported on first use, so that pricing a plan never loads torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from advisor.energy.runtime._dims import (
    ACTIVATIONS,
    DEFAULT_ROPE,
    AttentionSpec,
    DecoderDims,
    LayerSpec,
    MoESpec,
)

if TYPE_CHECKING:
    from advisor.energy.runtime._attention_torch import attention_over_cache
    from advisor.energy.runtime._cuda_tools import (
        CapturedStep,
        GraphReplay,
        capture,
        copy_bandwidth_gb_s,
        graph_ms,
        kernel_names,
        release_cuda_memory,
    )
    from advisor.energy.runtime._moe import Dispatch, RoutedExperts
    from advisor.energy.runtime._rope import RopeTables, rope_tables
    from advisor.energy.runtime._runtime import (
        FP8_MAX,
        DecoderRuntime,
        GroupLinear,
        calibrate,
        group_formats,
        layer_kinds,
    )
    from advisor.energy.runtime._weights import DecoderWeights

#: name -> the private module that defines it (imported on first use: they need torch)
_LAZY = {
    **dict.fromkeys(("attention_over_cache",), "_attention_torch"),
    **dict.fromkeys(("CapturedStep", "GraphReplay", "capture", "copy_bandwidth_gb_s", "graph_ms", "kernel_names",
                     "release_cuda_memory"), "_cuda_tools"),
    **dict.fromkeys(("Dispatch", "RoutedExperts"), "_moe"),
    **dict.fromkeys(("RopeTables", "rope_tables"), "_rope"),
    **dict.fromkeys(("FP8_MAX", "DecoderRuntime", "GroupLinear", "calibrate", "group_formats", "layer_kinds"),
                    "_runtime"),
    **dict.fromkeys(("DecoderWeights",), "_weights"),
}

__all__ = [
    "ACTIVATIONS", "DEFAULT_ROPE", "FP8_MAX", "AttentionSpec", "CapturedStep", "DecoderDims", "DecoderRuntime",
    "DecoderWeights", "Dispatch", "GraphReplay", "GroupLinear", "LayerSpec", "MoESpec", "RopeTables", "RoutedExperts",
    "attention_over_cache", "calibrate", "capture", "copy_bandwidth_gb_s", "graph_ms", "group_formats",
    "kernel_names", "layer_kinds", "release_cuda_memory", "rope_tables",
]


def __getattr__(name: str) -> Any:
    # looked up at every access (not cached), so a test that patches the private module is seen here
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
