"""The serving sizes both engines' options files take from the run's workloads."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ServingSizes:
    batch: int  # the largest batch
    seq: int  # the longest input + output
    prompt: int  # the longest input
    num_tokens: int  # one iteration: at most one full prompt plus one decode token per other sequence

    @classmethod
    def of(cls, workloads: list[dict[str, Any]]) -> ServingSizes:
        batch = max(int(w["batch_size"]) for w in workloads)
        prompt = max(int(w["input_tokens"]) for w in workloads)
        seq = max(int(w["input_tokens"]) + int(w["output_tokens"]) for w in workloads)
        return cls(batch, seq, prompt, max(2048, 256 * math.ceil((prompt + batch) / 256)))
