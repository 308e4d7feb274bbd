"""The study key: the settings that make two trials' numbers comparable.

Stored with the study when it is created; a `--resume` or a worker whose key differs is
refused with the fields that differ, so one study never mixes numbers that cannot be
compared (another model, other tokens, another budget, another energy method, other
library versions). Trial count, time limit, sampler and seed may change on resume.
"""

from __future__ import annotations

import json
import os
from typing import Any

from advisor.engines import DEFAULT_ENGINE
from advisor.errors import InputError
from advisor.formats import Format
from advisor.recipe.schema import Recipe

KEY_ATTR = "study_key"
# Recipe fields that change what a trial's numbers mean.
COMPARABLE = ("model", "target", "formats", "workloads", "calibration", "accuracy", "benchmark", "energy",
              "energy_profile", "device")
# benchmark.max_candidates only says how many plans get lm-eval; it changes no number.
POLICY_ONLY = {("benchmark", "max_candidates")}
OBJECTIVE_FIELDS = ("tpot_ms", "ttft_ms", "percentile", "max_concurrency")
VERSIONED = ("torch", "transformers", "nvidia-modelopt", "lm_eval")


# Fields that name local files, compared as absolute paths (a run resolves them once, at its start).
PATH_FIELDS = ("model.source", "calibration.source", "energy_profile")


def absolute_local_path(value: str) -> str:
    """``value`` as an absolute path when it names a file or folder here (a hub id, ``self`` or ``demo:...``
    stays as it is); a ``chat:`` or ``set:`` prefix is kept (``set:NAME`` names a shipped set, not a file)."""
    prefix = next((p for p in ("chat:", "set:") if value.startswith(p)), "")
    if prefix == "set:" and not value.endswith((".yaml", ".yml")):
        return value
    path = os.path.expanduser(value.removeprefix(prefix))
    return prefix + os.path.abspath(path) if os.path.exists(path) else value


def study_key(recipe: Recipe, versions: dict[str, str], energy_tier: str | None = None,
              predicted_steps: str | None = None) -> dict[str, Any]:
    """``energy_tier``: what the run's ``energy`` setting resolved to here (``auto`` becomes ``measured``
    or ``predicted``), so two runs that asked differently for the same tier compare equal. ``predicted_steps``: the
    step model the predicted tier prices plans by (None: the built-in runtime's profiles; another is keyed, so a
    study priced by the runtime's steps, as every study made before the vLLM step model was, is not resumed with
    vLLM's)."""
    data = recipe.model_dump(mode="json")
    key: dict[str, Any] = {field: data[field] for field in COMPARABLE}
    if energy_tier is not None:
        key["energy"] = energy_tier
    for section, name in POLICY_ONLY:
        key[section].pop(name, None)
    for workload in key["workloads"]:  # an objective prices no trial: the report's operating points follow it
        for name in OBJECTIVE_FIELDS:
            workload.pop(name, None)
    if data["kv_cache"] != [Format.BF16.value]:  # only then: studies made before it keep their key
        key["kv_cache"] = data["kv_cache"]
    if data["engine"] != DEFAULT_ENGINE:  # measured numbers of two engines are not comparable
        key["engine"] = data["engine"]
    if predicted_steps is not None:
        key["predicted_steps"] = predicted_steps
    if data.get("gpus") not in (None, 1):  # J/token over N GPUs: not comparable with one GPU's
        key["gpus"] = data["gpus"]
    key["versions"] = {p: versions.get(p, "not installed") for p in VERSIONED}
    return json.loads(json.dumps(key))


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def key_differences(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``field: stored -> current`` for every leaf that differs (local paths compared as absolute ones)."""
    a, b = _flatten(stored), _flatten(current)
    for flat in (a, b):
        for name in PATH_FIELDS:
            if isinstance(flat.get(name), str):
                flat[name] = absolute_local_path(flat[name])
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def check_same_key(stored: dict[str, Any] | None, current: dict[str, Any], study: str, action: str,
                   asked_energy: str | None = None) -> None:
    """``asked_energy``: the ``energy`` setting as given; a study made before keys held the resolved tier
    stored ``auto``, which an ``auto`` run matches."""
    if stored is None:
        raise InputError(f"{action}: study {study!r} has no study key (made by an older advisor); "
                         "start a new study with another --name")
    if stored.get("energy") == "auto" and asked_energy == "auto":
        current = {**current, "energy": "auto"}
    diffs = key_differences(stored, current)
    if diffs:
        shown = "; ".join(diffs[:6]) + (f"; and {len(diffs) - 6} more" if len(diffs) > 6 else "")
        raise InputError(f"{action}: study {study!r} was run with other settings, so its numbers cannot be "
                         f"mixed with this run's ({shown}); use the study's own settings, or start a new "
                         "study with another --name")


def check_same_model(stored_fingerprint: str | None, fingerprint: str, study: str) -> None:
    if stored_fingerprint and stored_fingerprint != fingerprint:
        raise InputError(f"study {study!r} was run on model weights {stored_fingerprint}; this model's are "
                         f"{fingerprint}: start a new study with another --name (or `advisor recheck` it)")


def check_same_scoring(stored: str | None, current: str, study: str, action: str) -> None:
    """A study scores accuracy in one place and arithmetic (``cuda``, ``cpu``, ``cpu (float32 arithmetic)``):
    KL values computed otherwise are not comparable with its own."""
    if stored and stored != current:
        raise InputError(f"{action}: study {study!r} scores accuracy on {stored}, this process on {current}; "
                         f"their KL values are not comparable: run it on a host that scores on {stored}, or "
                         "start a new study with another --name")
