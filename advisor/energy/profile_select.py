"""Which profile prices a plan: per-model profiles built or reused, shipped GPU profiles, fallbacks."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from advisor.energy.gemm_table import SCHEMA as GPU_SCHEMA
from advisor.energy.model_profile import profile_key
from advisor.energy.profile_store import ProfileStore
from advisor.errors import InputError, UnsupportedError
from advisor.estimate import EnergyEstimate, EnergyModel
from advisor.files import check_regular_file
from advisor.formats import GPU
from advisor.models.shape import ModelShape
from advisor.plan import Plan
from advisor.recipe.schema import Workload

__all__ = ["GPU_SCHEMA", "WithFallback", "ensure_model_profile", "profile_regime", "shipped_gpu_profile"]
log = logging.getLogger(__name__)


class WithFallback:
    """``primary`` where it can price a plan; ``fallback`` (labelled so) where it cannot, e.g. an FP8 KV
    cache or a format the profile's GPU does not run: a trial is priced, never aborted."""

    measured = False

    def __init__(self, primary: EnergyModel, fallback: EnergyModel) -> None:
        self.primary, self.fallback = primary, fallback
        self.label = primary.label

    def estimate(self, plan: Plan, workload: Workload) -> EnergyEstimate:
        try:
            return self.primary.estimate(plan, workload)
        except UnsupportedError as exc:
            est = self.fallback.estimate(plan, workload)
            return replace(est, source=f"{est.source} [not in {self.primary.label}: {exc}]")


def shipped_gpu_profile(gpu: GPU) -> dict[str, Any] | None:
    """The newest shipped GPU profile (GEMM tables, ``<gpu>_gemm_<date>.json``) for ``gpu``, or None."""
    folder = resources.files("advisor.energy") / "profiles"
    try:
        names = sorted(p.name for p in folder.iterdir() if p.name.startswith(f"{gpu.value}_gemm_"))
    except (FileNotFoundError, NotADirectoryError):
        return None
    return json.loads((folder / names[-1]).read_text()) if names else None


def _read_json_profile(path: Path) -> dict[str, Any]:
    check_regular_file(path, "profile", "give a profile JSON written by `advisor profile`")
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"cannot read profile {path}: {exc.strerror}; give a profile JSON written by "
                         "`advisor profile` (or leave energy_profile unset)") from None
    except ValueError as exc:
        raise InputError(f"profile {path} is not JSON ({exc}); give a profile JSON written by "
                         "`advisor profile`") from None


def read_any_profile(path: Path) -> dict[str, Any]:
    """A per-model, GPU or layer profile JSON, checked against its schema (InputError naming the file)."""
    from advisor.energy.gpu_costmodel import validate_gpu_profile
    from advisor.energy.model_profile import is_model_profile, validate_model_profile
    from advisor.energy.profile import validate_profile

    data = _read_json_profile(path)
    if is_model_profile(data):
        return validate_model_profile(data, f"profile {path}")
    if data.get("schema") == GPU_SCHEMA:
        return validate_gpu_profile(data, f"profile {path}")
    return validate_profile(data, f"profile {path}")


def dims_or_none(shape: ModelShape, model_config: Any):
    """The runtime's decoder of this model (its own layers from the config, else a Llama stand-in), or
    None where the runtime cannot build it (MoE, partial rotary, ...): then no per-model profile."""
    from advisor.energy.dims import DecoderDims

    try:
        return DecoderDims.from_config(model_config) if model_config is not None else DecoderDims.from_shape(shape)
    except UnsupportedError:
        return None


def profile_regime(workloads: Sequence[Workload]) -> dict[str, tuple[int, ...]]:
    """Batches, decode contexts and prompt lengths a per-model profile measures for these workloads: each
    workload's batch and input length, and the contexts their decode steps visit, from the shortest input to
    the longest input plus output (the cost model interpolates linearly between them).

    A wider bracket than the steps visit is not safer: a step's energy is not linear in the context over so
    wide a range, so a chord from half to twice the mean context put the profiled plans' batch-64 steps of
    Qwen2.5-0.5B 1.3-2.2% high at the mean (convex there), and Qwen2.5-1.5B's MLP-FP8 batch-16 step 4.8% low,
    where the contexts the workload visits priced them within 0.9% (H100s,
    reports/benchmarks/profile_point_trials.md)."""
    ws = list(workloads) or [Workload()]
    batches = sorted({w.batch_size for w in ws})
    lo = min(w.input_tokens for w in ws)
    hi = max(w.input_tokens + w.output_tokens for w in ws)
    return {"batches": tuple(batches), "contexts": (lo, hi),
            "prefill_lengths": tuple(sorted({w.input_tokens for w in ws}))}


def ensure_model_profile(measured, workloads: Sequence[Workload], store: ProfileStore) -> dict[str, Any] | None:
    """This model's profile on the GPU here: reused from ``store`` when its key matches (GPU unit, driver,
    power limit, model, runtime) and it covers ``workloads``, else measured now with ``measured``'s
    runtime, meter and weights, and stored. None where no per-model profile applies."""
    from advisor.energy import model_profile
    from advisor.energy.measure import Bench
    from advisor.energy.meter import EnergyMeter
    from advisor.energy.model_profile import profile_meter_config
    from advisor.formats import gpu_from_device_name

    dims = measured.dims
    state = measured.meter.counter.state()
    kind = gpu_from_device_name(state.name)
    regime = profile_regime(workloads)
    key = profile_key(state, dims.to_dict())
    found = store.find(key, kind.value if kind else str(None))
    if found is not None and covers(found, regime):
        log.info("reusing the per-model profile %s", store.path_for(found))
        return found
    if measured._bench is None:
        positions = max(regime["contexts"][-1] + 2, max(regime["prefill_lengths"]) + 1)
        measured._bench = Bench.create(dims, max_pos=max(8192, positions))
    meter = EnergyMeter(measured.meter.counter, profile_meter_config())
    prof = model_profile.measure_model_profile(dims, **regime, meter=meter, bench=measured._bench,
                                 command="advisor search (per-model profile)", log=log.info)
    store.save(prof)
    return prof


def covers(profile: dict[str, Any], regime: dict[str, tuple[int, ...]]) -> bool:
    """Whether a stored profile measured every batch and prompt length of ``regime`` and brackets its
    contexts."""
    d, p = profile["decode"], profile["prefill"]
    return (set(regime["batches"]) <= set(d["batches"]) and set(regime["prefill_lengths"]) <= set(p["lengths"])
            and min(d["contexts"]) <= min(regime["contexts"]) and max(regime["contexts"]) <= max(d["contexts"]))

