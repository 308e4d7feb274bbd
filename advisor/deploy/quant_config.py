"""Which format each layer has, as a ModelOpt ``hf_quant_config.json`` says (and as a plan asks)."""

from __future__ import annotations

import fnmatch
from typing import Any

from advisor.errors import InputError
from advisor.formats import Format
from advisor.plan import LayerGroup, Plan

_ALGO_FORMAT = {"FP8": Format.FP8, "NVFP4": Format.NVFP4}


def expected_layer_formats(plan: Plan, groups: tuple[LayerGroup, ...]) -> dict[str, Format]:
    """Module name -> format that the plan asks for, for every quantizable linear."""
    return {m: plan.format_of(g.name) for g in groups for m in g.members}


def layer_formats_from_quant_config(qcfg: dict[str, Any] | None, modules: list[str]) -> dict[str, Format]:
    """Module name -> format, read from an ``hf_quant_config.json`` (None: unquantized)."""
    if qcfg is None:
        return {m: Format.BF16 for m in modules}
    q = qcfg.get("quantization", qcfg)
    algo = q.get("quant_algo")
    if algo is None:
        return {m: Format.BF16 for m in modules}
    if algo == "MIXED_PRECISION":
        layers = q.get("quantized_layers", {})
        out = {}
        for m in modules:
            entry = layers.get(m)
            out[m] = Format.BF16 if entry is None else _algo_format(entry.get("quant_algo"))
        return out
    fmt = _algo_format(algo)
    excluded = q.get("exclude_modules") or []
    return {m: Format.BF16 if any(fnmatch.fnmatch(m, p) for p in excluded) else fmt for m in modules}


def _algo_format(algo: str | None) -> Format:
    if algo not in _ALGO_FORMAT:
        raise InputError(f"hf_quant_config.json: quant_algo {algo!r} is not one the advisor writes (FP8, NVFP4)")
    return _ALGO_FORMAT[algo]


def check_quant_config(qcfg: dict[str, Any] | None, plan: Plan, groups: tuple[LayerGroup, ...]) -> None:
    """Raise unless the checkpoint's quant config gives every layer the plan's format."""
    expected = expected_layer_formats(plan, groups)
    found = layer_formats_from_quant_config(qcfg, list(expected))
    wrong = [f"{m}: plan {expected[m].value}, checkpoint {found[m].value}" for m in expected if found[m] != expected[m]]
    if wrong:
        raise AssertionError(f"exported quant config disagrees with plan {plan.id}: " + "; ".join(wrong[:5]))
