"""One per-model profile from several GPU units' profiles of the same model: their mean, point by point.

GPUs of one kind differ: the same steps of a small model draw different energy on different units
(reports/benchmarks/energy_transfer*.md). A profile shipped for predicting on
other units of that kind is therefore the mean of several units' profiles rather than one unit's: every
metered number (step times, joules, powers, GEMM times, idle power) averaged over the units, the
structure (batches, contexts, prompt lengths, formats) required to be the same; a profiled point that some
units lack (the kind corner, the mixing or position point, added after they were profiled) is left out. It
records its ``units`` and leaves the GPU UUID of its key empty, so that it is never taken for a profile
of the user's own GPU. torch-free.
"""

from __future__ import annotations

from statistics import fmean
from typing import Any

from advisor.energy.profiling._model import POINTS, geometry_digest, validate_model_profile
from advisor.errors import InputError

#: top-level measured numbers that are averaged (the rest of the top level is metadata)
MEASURED = ("idle_power_w", "copy_bandwidth_gb_s", "profile_seconds")


def _mean(values: list[Any], where: str) -> Any:
    """Floats averaged; ints, strings and None (structure) must agree; dicts and lists point by point."""
    first = values[0]
    if isinstance(first, dict):
        keys = set(first)
        if any(set(v) != keys for v in values):
            raise InputError(f"the profiles differ in what they metered at {where}")
        return {k: _mean([v[k] for v in values], f"{where}.{k}") for k in first}
    if isinstance(first, list):
        if any(not isinstance(v, list) or len(v) != len(first) for v in values):
            raise InputError(f"the profiles differ in their points at {where}")
        return [_mean([v[i] for v in values], f"{where}[{i}]") for i in range(len(first))]
    if isinstance(first, float) and all(isinstance(v, int | float) for v in values):
        return fmean(values)
    if any(v != first for v in values):
        raise InputError(f"the profiles differ at {where} ({first!r} vs {next(v for v in values if v != first)!r})")
    return first


def mean_profile(profiles: list[dict[str, Any]], runtime: str, command: str) -> dict[str, Any]:
    """The mean of ``profiles`` (one per GPU unit, the same model geometry and GPU kind, metered at the same
    points), keyed for ``runtime``; ``command`` is what built it."""
    if not profiles:
        raise InputError("no profiles to average")
    for i, p in enumerate(profiles):
        validate_model_profile(p, f"profile {i + 1}")
    units = [p["key"]["gpu_uuid"] for p in profiles]
    if len(set(units)) != len(units):
        raise InputError("two of the profiles are of the same GPU unit: average one per unit")
    for field in ("gpu", "gpu_kind", "formats", "power_limit_w"):
        seen = sorted({repr(p["key"][field] if field == "power_limit_w" else p[field]) for p in profiles})
        if len(seen) > 1:
            raise InputError(f"the profiles differ in {field}: {', '.join(seen)}")
    if len({geometry_digest(p["model"]) for p in profiles}) > 1:
        raise InputError("the profiles are of models of different geometry")
    out = dict(profiles[0])
    for section in ("decode", "prefill"):
        # a point some units lack (profiled before it was added) is left out: the others average on the rest
        missing = {c for c in POINTS if any(c not in p[section] for p in profiles)}
        out[section] = _mean([{k: v for k, v in p[section].items() if k not in missing} for p in profiles], section)
    for field in MEASURED:
        if all(field in p for p in profiles):
            out[field] = fmean(p[field] for p in profiles)
    drivers = sorted({p["driver"] for p in profiles})
    out.update({
        "gpu_uuid": None,
        "driver": drivers[0] if len(drivers) == 1 else " / ".join(drivers),
        "date": max(p["date"] for p in profiles),
        "measured_at": max(p.get("measured_at", 0.0) for p in profiles),
        "runtime": runtime,
        "command": command,
        "units": [{"gpu_uuid": p["key"]["gpu_uuid"], "date": p["date"], "driver": p["driver"],
                   "runtime": p["key"]["runtime"], "command": p.get("command", "")} for p in profiles],
    })
    out.pop("soak", None)  # each unit's own thermal soak; the units list keeps where they ran
    out["key"] = {**profiles[0]["key"], "gpu_uuid": None, "driver": out["driver"], "runtime": runtime}
    return out

