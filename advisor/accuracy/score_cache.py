"""A task's per-item results for one plan, and their on-disk cache.

Items are keyed by their index in the task's documents, so results scored in several
batches (sequential evaluation) add up, and a later, larger subset rescores only the
items it lacks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CACHE_FORMAT = 2  # 1: one aggregate score per (model, plan, task, limit, seed), no items


@dataclass(frozen=True)
class TaskScore:
    """One task's primary metric for one plan: the mean over ``n`` items and every item's value."""

    task: str
    metric: str  # lm-eval result key, e.g. "acc,none" or "exact_match,flexible-extract"
    value: float
    stderr: float
    n: int  # items scored
    limit: int | None  # None: the full set
    seed: int
    source: str  # "local:<data file>" or "lm-eval"
    higher_is_better: bool = True
    n_docs: int = 0  # items in the whole task
    time_s: float = 0.0
    items: dict[int, float] = field(default_factory=dict, repr=False)  # doc index -> per-item value
    unscorable: int = 0  # items left out: their answer has no tokens with this tokenizer (unscorable.py)

    @classmethod
    def from_items(cls, task: str, metric: str, items: Mapping[int, float], **kw: Any) -> TaskScore:
        """Mean and standard error the way lm-eval computes them (same order, same formula)."""
        ordered = {i: float(items[i]) for i in sorted(items)}
        values = list(ordered.values())
        n = len(values)
        mean = sum(values) / n if n else math.nan
        stderr = math.sqrt(sum((x - mean) ** 2 for x in values) / (n - 1)) / math.sqrt(n) if n > 1 else math.nan
        return cls(task=task, metric=metric, value=mean, stderr=stderr, n=n, items=ordered, **kw)

    def subset(self, indices: Sequence[int], limit: int | None) -> TaskScore:
        """This score restricted to ``indices`` (all must be present)."""
        kw = {k: getattr(self, k) for k in ("seed", "source", "higher_is_better", "n_docs", "time_s", "unscorable")}
        return TaskScore.from_items(self.task, self.metric, {i: self.items[i] for i in indices}, limit=limit, **kw)

    def merged(self, other: TaskScore) -> TaskScore:
        """Items of both (``other`` wins where both have one); the summary of the union."""
        items = {**self.items, **other.items}
        merged = TaskScore.from_items(self.task, self.metric, items, limit=other.limit, seed=other.seed,
                                      source=other.source, higher_is_better=other.higher_is_better,
                                      n_docs=other.n_docs or self.n_docs)
        return replace(merged, time_s=round(self.time_s + other.time_s, 3))

    @property
    def metric_name(self) -> str:
        return self.metric.split(",", 1)[0]

    def to_dict(self, with_items: bool = True) -> dict[str, Any]:
        data = asdict(self)
        data["items"] = {str(k): v for k, v in self.items.items()} if with_items else {}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskScore:
        kw = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        kw["items"] = {int(k): float(v) for k, v in (data.get("items") or {}).items()}
        return cls(**kw)


class ScoreCache:
    """Per-item results as one JSON file per (model hash, plan id, task, seed) in ``directory``."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)

    @staticmethod
    def key(model_hash: str, plan_id: str, task: str, seed: int) -> dict[str, Any]:
        return {"format": CACHE_FORMAT, "model_hash": model_hash, "plan_id": plan_id, "task": task, "seed": seed}

    def _path(self, key: dict[str, Any]) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
        safe_task = "".join(c if c.isalnum() or c in "-_." else "_" for c in key["task"])[-40:]
        return self.directory / f"{key['plan_id']}-{safe_task}-{digest}.json"

    def load(self, model_hash: str, plan_id: str, task: str, seed: int) -> TaskScore | None:
        """Every item cached for this plan and task (any limit), or None."""
        key = self.key(model_hash, plan_id, task, seed)
        path = self._path(key)
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
            if data.get("key") != key:
                return None
            return TaskScore.from_dict(data["score"])
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("ignoring unreadable cache file %s", path)
            return None

    def get(self, model_hash: str, plan_id: str, task: str, indices: Sequence[int], seed: int,
            limit: int | None = None) -> TaskScore | None:
        """The score over exactly ``indices`` when every one is cached, else None."""
        cached = self.load(model_hash, plan_id, task, seed)
        if cached is None or any(i not in cached.items for i in indices):
            return None
        return cached.subset(indices, limit)

    def put(self, model_hash: str, plan_id: str, score: TaskScore) -> Path:
        """Add ``score``'s items to what is cached for this plan and task."""
        key = self.key(model_hash, plan_id, score.task, score.seed)
        cached = self.load(model_hash, plan_id, score.task, score.seed)
        if cached is not None and cached.metric == score.metric:
            score = cached.merged(score)
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": key, "score": score.to_dict()}))
        tmp.replace(path)
        return path
