"""Per-group sensitivity: proxy damage when only one group runs in a lower format.

Also the per-group energy change of the same one-group plans, from the run's energy
model, so that the knapsack in ``proposals.py`` has both tables. Results are cached in
the run directory, keyed by the model fingerprint and the calibration settings.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from advisor.files import write_text_atomically
from advisor.formats import Format
from advisor.plan import KV_CACHE_KEY, LayerGroup, Plan


@dataclass
class Sensitivity:
    damage: dict[str, dict[Format, float]]  # group -> format -> proxy KL (only that group quantized)
    energy: dict[str, dict[Format, float]]  # group -> format -> J/token change vs all-BF16 (primary workload)
    tokens: int
    time_s: float

    def to_json(self) -> dict:
        def enc(t: dict[str, dict[Format, float]]) -> dict:
            return {g: {f.value: v for f, v in row.items()} for g, row in t.items()}

        return {"damage": enc(self.damage), "energy": enc(self.energy), "tokens": self.tokens, "time_s": self.time_s}

    @classmethod
    def from_json(cls, data: dict) -> Sensitivity:
        def dec(t: dict) -> dict[str, dict[Format, float]]:
            return {g: {Format(f): v for f, v in row.items()} for g, row in t.items()}

        return cls(dec(data["damage"]), dec(data["energy"]), data["tokens"], data["time_s"])

    def most_sensitive(self, n: int = 10) -> list[tuple[str, Format, float]]:
        rows = [(g, f, v) for g, row in self.damage.items() for f, v in row.items() if f != Format.BF16]
        return sorted(rows, key=lambda r: -r[2])[:n]


class Split(Protocol):
    """The ranks of a node sharing the probes (``advisor.models.replicas.Ranks``): which probes this process
    scores, and every rank's results put together."""

    def indices(self, n: int) -> Sequence[int]: ...

    def merged(self, part: dict[Any, Any]) -> dict[Any, Any]: ...


def measure(
    groups: Sequence[LayerGroup],
    formats: Sequence[Format],
    damage_of: Callable[[Plan], float],
    energy_of: Callable[[Plan], float],
    on_step: Callable[[int, int], None] | None = None,
    kv_cache: Sequence[Format] = (Format.BF16,),
    split: Split | None = None,
) -> Sensitivity:
    """One evaluation per (group, non-BF16 format), all other groups BF16; and, when the KV cache
    is searched, one per non-BF16 KV-cache format with every group BF16 (the ``kv_cache`` row).
    With ``split``, this process scores its share of them (``on_step`` counts that share) and the
    tables hold every rank's."""
    t0 = time.perf_counter()
    base = {g.name: Format.BF16 for g in groups}
    e_bf16 = energy_of(Plan(base))
    damage = {g.name: {Format.BF16: 0.0} for g in groups}
    energy = {g.name: {Format.BF16: 0.0} for g in groups}
    lower = [f for f in formats if f != Format.BF16]
    kv_lower = [f for f in kv_cache if f != Format.BF16]
    one_group = [(g.name, f, Plan({**base, g.name: f})) for g in groups for f in lower]
    if kv_lower:
        damage[KV_CACHE_KEY], energy[KV_CACHE_KEY] = {Format.BF16: 0.0}, {Format.BF16: 0.0}
    steps = one_group + [(KV_CACHE_KEY, f, Plan(base, f)) for f in kv_lower]
    mine = range(len(steps)) if split is None else split.indices(len(steps))
    scored: dict[int, tuple[float, float]] = {}
    for done, i in enumerate(mine, start=1):
        plan = steps[i][2]
        scored[i] = (max(damage_of(plan), 0.0), energy_of(plan) - e_bf16)
        if on_step:
            on_step(done, len(mine))
    if split is not None:
        scored = split.merged(scored)
    for i, (row, f, _) in enumerate(steps):
        damage[row][f], energy[row][f] = scored[i]
    return Sensitivity(damage, energy, 0, time.perf_counter() - t0)


def first_changed_layer(plan: Plan) -> int:
    """Index of the first decoder layer a plan changes from BF16 (0 when it cannot tell).

    Groups are ``layers.{i}.{kind}``; an FP8 KV cache changes every layer.
    """
    if plan.kv_cache != Format.BF16:
        return 0
    layers = []
    for group, fmt in plan.formats.items():
        parts = group.split(".")
        if fmt == Format.BF16:
            continue
        if len(parts) != 3 or parts[0] != "layers" or not parts[1].isdigit():
            return 0
        layers.append(int(parts[1]))
    return min(layers, default=0)


def load_cached(path: Path, key: dict) -> Sensitivity | None:
    """The tables stored at ``path`` when they were measured under ``key``; None where there are none, or the file
    cannot be read as such (measured again then)."""
    try:
        data = json.loads(path.read_text()) if path.exists() else None
        if isinstance(data, dict) and data.get("key") == key:
            return Sensitivity.from_json(data["sensitivity"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def store(path: Path, key: dict, sens: Sensitivity) -> None:
    write_text_atomically(path, json.dumps({"key": key, "sensitivity": sens.to_json()}, indent=2))


def load_or_measure(path: Path, key: dict, compute: Callable[[], Sensitivity]) -> Sensitivity:
    sens = load_cached(path, key)
    if sens is None:
        sens = compute()
        store(path, key, sens)
    return sens
