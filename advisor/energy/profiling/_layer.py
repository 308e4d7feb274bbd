"""Layer profiles: per-format costs of one Llama layer measured once on a GPU (or derived from a datasheet).

A profile (schema ``precision-advisor/energy-profile``, version 1) holds, for one
GPU and one model shape (Llama-3.1-8B by default):

* ``decode.gemm_ms[fmt][kind]``: time of ONE layer's GEMM of each kind (qkv, o,
  gate_up, down) at each decode batch, from CUDA-graph replays of all layers' GEMMs
  of that kind (distinct weights, so the L2 cache does not help);
* ``decode.step_ms[fmt][context][i]``: the whole decode step of the all-``fmt``
  plan at each batch and context; the step minus its GEMMs is the non-GEMM part
  (attention, norms, rope, quantization, lm_head, gaps);
* ``decode.power_w[fmt][i]``: the step's mean power from the NVML meter at the
  batches in ``decode.energy_batches``;
* ``prefill``: the same per prompt length (batch 1).

The predicted tier's fallback: it prices what the per-model and GPU profiles cannot (a GPU kind with only
a layer profile, such as the datasheet-derived B200; MoE models without a per-model profile; an FP8 KV
cache). The per-model and GPU profiles replaced it for measuring: the shipped layer profiles are read,
never measured again. ``measurement_header`` is what every measured profile records.
"""

from __future__ import annotations

import time
from typing import Any

from advisor.energy.profiling._schemas import LAYER_SCHEMA as SCHEMA
from advisor.energy.profiling._schemas import LAYER_VERSION as VERSION
from advisor.errors import InputError
from advisor.plan import DENSE_GROUP_KINDS

KINDS = DENSE_GROUP_KINDS


def measurement_header(state: Any, idle_w: float, copy_bw_gb_s: float, command: str, torch_version: str) -> dict:
    """What every measured file records about where and how it was measured."""
    return {
        "gpu": state.name,
        "gpu_uuid": state.uuid,
        "driver": state.driver,
        "power_limit_w": state.power_limit_w,
        "idle_power_w": idle_w,
        "copy_bandwidth_gb_s": copy_bw_gb_s,
        "date": time.strftime("%Y-%m-%d"),
        "command": command,
        "torch": torch_version,
    }


def validate_profile(data: dict[str, Any], origin: str = "profile") -> dict[str, Any]:
    if data.get("schema") != SCHEMA or data.get("version") != VERSION:
        raise InputError(
            f"{origin} is not an energy profile of schema {SCHEMA} version {VERSION} "
            f"(got {data.get('schema')!r} version {data.get('version')!r})"
        )
    for key in ("gpu", "gpu_kind", "driver", "date", "command", "model", "decode", "prefill", "formats"):
        if key not in data:
            raise InputError(f"{origin} lacks the field {key!r}")
    return data
