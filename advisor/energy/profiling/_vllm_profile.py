"""vLLM step profiles: what one vLLM version adds to the built-in runtime's step costs on one GPU kind (host time
per step and per sequence, the launches of PIECEWISE and eager passes, scales on the device's time and energy),
fitted from vLLM-served measurements by ``benchmarks/engine_true/vllm_step_fit.py`` and shipped as
``profiles/vllm/<gpu>.json``. A B200 profile also says what it is anchored on (``anchor``). torch-free.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from advisor.errors import InputError
from advisor.formats import GPU, Format

VLLM_SCHEMA = "precision-advisor/vllm-step-profile"
VLLM_VERSION = 1
#: the engine terms a profile holds (:class:`advisor.energy.prediction.EngineTerms`)
VLLM_PARAMS = ("host_ms", "per_seq_us", "piecewise_us_per_layer", "eager_us_per_layer", "device_time_scale",
               "device_energy_scale", "admission_steps", "gap_power_w")
_REQUIRED = ("schema", "version", "vllm_version", "gpu", "gpu_kind", "driver", "date", "source", "command", "params")


def validate_vllm_profile(data: dict[str, Any], where: str) -> dict[str, Any]:
    """``data`` when it is a vLLM step profile of this schema version with every engine term a finite number >= 0
    (the scales > 0), else an InputError naming ``where`` and what is wrong."""
    missing = [k for k in _REQUIRED if k not in data]
    if missing or data.get("schema") != VLLM_SCHEMA:
        raise InputError(f"{where} is not a vLLM step profile ({VLLM_SCHEMA}; missing {missing or 'the schema'}); "
                         "write one with benchmarks/engine_true/vllm_step_fit.py")
    if data["version"] != VLLM_VERSION:
        raise InputError(f"{where} is a version {data['version']} vLLM step profile; this advisor reads version "
                         f"{VLLM_VERSION}: fit it again with benchmarks/engine_true/vllm_step_fit.py")
    params = data["params"]
    bad = [k for k in VLLM_PARAMS if not isinstance(params.get(k), int | float) or not 0 <= params[k] < float("inf")
           or (k.endswith("_scale") and params[k] == 0)]
    if bad:
        raise InputError(f"{where}: engine terms {bad} missing or not finite numbers >= 0 (scales > 0); fit it again "
                         "with benchmarks/engine_true/vllm_step_fit.py")
    if data["gpu_kind"] not in {g.value for g in GPU}:
        raise InputError(f"{where}: gpu_kind {data['gpu_kind']!r} is not one of {', '.join(g.value for g in GPU)}")
    if "moe_kernels" in data:
        _check_moe_kernels(data["moe_kernels"], where)
    return data


def _check_moe_kernels(table: Any, where: str) -> None:
    """InputError unless ``table`` is vLLM's fused MoE measured (``moe_kernels``): its provenance, and rows of
    positive whole geometry and token counts, a weight format, and finite ms and J >= 0 a layer."""
    ints = ("experts", "top_k", "hidden", "intermediate", "tokens")
    rows = table.get("rows") if isinstance(table, dict) else None
    ok = isinstance(rows, list) and rows and all(isinstance(table.get(k), str) for k in ("gpu", "date", "vllm_version"))
    for r in rows or []:
        ok = ok and isinstance(r, dict) and all(isinstance(r.get(k), int) and r[k] > 0 for k in ints) \
            and r.get("format") in {f.value for f in Format} and all(
                isinstance(r.get(k), int | float) and 0 <= r[k] < float("inf") for k in ("ms_per_layer", "j_per_layer"))
    if not ok:
        raise InputError(f"{where}: moe_kernels is not a table of vLLM's fused MoE (gpu, date, vllm_version, and rows "
                         "of experts, top_k, hidden, intermediate, format, tokens, ms_per_layer, j_per_layer); write "
                         "it with benchmarks/engine_true/vllm_step_fit.py --moe-kernels")


def shipped_vllm_profile(gpu: GPU) -> dict[str, Any] | None:
    """The vLLM step profile shipped for ``gpu`` (``profiles/vllm/<gpu>.json``), or None."""
    path = resources.files("advisor.energy") / "profiles" / "vllm" / f"{gpu.value}.json"
    if not path.is_file():
        return None
    return validate_vllm_profile(json.loads(path.read_text()), f"shipped vLLM step profile {gpu.value}.json")
