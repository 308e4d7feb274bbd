"""This model's per-model profile on the GPU here: reused from the store when it covers the workloads, else
measured now with the measured tier's runtime and meter, and stored."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from advisor.energy.profiling._model import profile_key
from advisor.energy.profiling._store import ProfileStore
from advisor.recipe.schema import Workload

log = logging.getLogger(__name__)


def profile_regime(workloads: Sequence[Workload]) -> dict[str, tuple[int, ...]]:
    """Batches, decode contexts and prompt lengths a per-model profile measures for these workloads: each
    workload's batch and input length, and the contexts their decode steps visit, from the shortest input to
    the longest input plus output (the cost model interpolates linearly between them).

    A wider bracket than the steps visit is not safer: a step's energy is not linear in the context over so
    wide a range (reports/benchmarks/profile_point_trials.md)."""
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
    from advisor.energy.meter import EnergyMeter
    from advisor.energy.profiling import _model as model_profile
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
    positions = max(regime["contexts"][-1] + 2, max(regime["prefill_lengths"]) + 1)
    meter = EnergyMeter(measured.meter.counter, model_profile.profile_meter_config())
    prof = model_profile.measure_model_profile(dims, **regime, meter=meter, bench=measured.bench(positions),
                                               command="advisor search (per-model profile)", log=log.info)
    store.save(prof)
    return prof


def covers(profile: dict[str, Any], regime: dict[str, tuple[int, ...]]) -> bool:
    """Whether a stored profile measured every batch and prompt length of ``regime`` and brackets its
    contexts."""
    d, p = profile["decode"], profile["prefill"]
    return (set(regime["batches"]) <= set(d["batches"]) and set(regime["prefill_lengths"]) <= set(p["lengths"])
            and min(d["contexts"]) <= min(regime["contexts"]) and max(regime["contexts"]) <= max(d["contexts"]))
