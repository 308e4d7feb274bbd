"""Workload flags: edit a named workload or add one, never silently drop the recipe's others.

``--workload NAME:batch=64,input=1024,output=256`` edits the workload called NAME (or adds
it, the rest from the defaults); ``--workload NAME:tpot=20,ttft=500,p=p90,max_concurrency=256`` states its
latency objective; ``--batch-size``, ``--input-tokens`` and
``--output-tokens`` edit the first (primary) workload.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from advisor.errors import InputError
from advisor.recipe.schema import Workload

KEYS = {"batch": "batch_size", "batch_size": "batch_size", "input": "input_tokens", "in": "input_tokens",
        "input_tokens": "input_tokens", "output": "output_tokens", "out": "output_tokens",
        "output_tokens": "output_tokens", "tpot": "tpot_ms", "tpot_ms": "tpot_ms", "ttft": "ttft_ms",
        "ttft_ms": "ttft_ms", "p": "percentile", "percentile": "percentile", "max_concurrency": "max_concurrency",
        "concurrency": "max_concurrency"}
PARSE = {"tpot_ms": float, "ttft_ms": float, "percentile": str}  # the others are whole numbers
ALLOWED = "batch, input, output, tpot, ttft, p (p50 or p90), max_concurrency"


def parse_workload_flag(text: str) -> tuple[str, dict[str, int | float | str]]:
    """``NAME:key=value,...`` -> (NAME, {field: value})."""
    name, sep, body = text.partition(":")
    if not sep or not name.strip() or not body.strip():
        raise InputError(f"--workload {text!r}: write NAME:batch=B,input=L,output=L (any of them; also tpot=MS, "
                         "ttft=MS, p=p50|p90, max_concurrency=N)")
    fields: dict[str, int | float | str] = {}
    for item in body.split(","):
        key, eq, value = item.partition("=")
        field = KEYS.get(key.strip().lower())
        if not eq or field is None:
            raise InputError(f"--workload {text!r}: unknown setting {key.strip()!r}; allowed: {ALLOWED}")
        if field in fields:  # `batch=16,batch=32` (or `batch=16,batch_size=32`): which one was meant?
            raise InputError(f"--workload {text!r}: {key.strip()} sets {field} a second time; give each setting "
                             "once")
        parse = PARSE.get(field, int)
        try:
            fields[field] = parse(value.strip())
        except ValueError:
            kind = "a number of milliseconds" if parse is float else "a whole number"
            raise InputError(f"--workload {text!r}: {key.strip()} must be {kind}, got {value!r}") from None
    return name.strip(), fields


def edit_workloads(workloads: Sequence[dict[str, Any]], primary: dict[str, int | None],
                   flags: Sequence[str]) -> list[dict[str, Any]]:
    """The recipe's workloads with the primary edits and the ``--workload`` flags applied, in order."""
    out = [dict(w) for w in workloads]
    first = {k: v for k, v in primary.items() if v is not None}
    if first:
        out[0] = {**out[0], **first}
    for text in flags:
        name, fields = parse_workload_flag(text)
        match = next((w for w in out if w["name"] == name), None)
        if match is None:
            out.append({**Workload(name=name).model_dump(), **fields})
        else:
            match.update(fields)
    return out


def describe(workloads: Sequence[Workload]) -> str:
    return "; ".join(f"{w.name}: batch {w.batch_size}, {w.input_tokens} in / {w.output_tokens} out" + _objective(w)
                     for w in workloads)


def _objective(w: Workload) -> str:
    if not w.has_objective:
        return ""
    parts = [f"TPOT <= {w.tpot_ms:g} ms" if w.tpot_ms is not None else "",
             f"TTFT <= {w.ttft_ms:g} ms" if w.ttft_ms is not None else ""]
    return f", {' and '.join(p for p in parts if p)} ({w.quantile}, at most {w.concurrency_limit} in flight)"
