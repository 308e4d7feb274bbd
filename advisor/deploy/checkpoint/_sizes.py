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


def workloads_words(workloads: list[dict[str, Any]]) -> str:
    """What an options file is sized for, in its header: each workload's batch (and why, where it is not the
    stated one), prompt and output."""
    return "; ".join(f"{w['name']}: batch {w['batch_size']}" + (f" ({w['sized_for']})" if w.get("sized_for") else "")
                     + f", {w['input_tokens']} in / {w['output_tokens']} out" for w in workloads)
