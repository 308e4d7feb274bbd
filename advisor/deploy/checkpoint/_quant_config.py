"""Which format each layer has, as a ModelOpt ``hf_quant_config.json`` says (and as a plan asks).

Names here are the checkpoint's (``GroupInfo.exported``), which differ from in-memory names
for some families: the Gemma-3 wrapper's ``language_model.model.layers...``, MoE experts
per expert (``mlp.experts.{e}.gate_proj``, Mixtral ``block_sparse_moe.experts.{e}.w1``).
ModelOpt names a quantized or excluded fused-experts module as a whole
(``model.layers.0.mlp.experts``) and may exclude a parent with a wildcard
(``model.layers.1.mlp*``), so a module's format is that of the nearest entry naming it or
one of its parents, the way serving engines match.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from typing import Any

from advisor.errors import InputError
from advisor.formats import Format
from advisor.models.adapters import GroupInfo
from advisor.plan import Plan

_ALGO_FORMAT = {"FP8": Format.FP8, "NVFP4": Format.NVFP4}


def expected_layer_formats(plan: Plan, infos: Iterable[GroupInfo]) -> dict[str, Format]:
    """Checkpoint module name -> format that the plan asks for, for every quantizable weight."""
    return {name: plan.format_of(gi.name) for gi in infos for name in gi.exported}


def _self_and_parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


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
            entry = next((layers[n] for n in _self_and_parents(m) if n in layers), None)
            out[m] = Format.BF16 if entry is None else _algo_format(entry.get("quant_algo"))
        return out
    fmt = _algo_format(algo)
    excluded = q.get("exclude_modules") or []
    return {m: Format.BF16 if any(fnmatch.fnmatchcase(n, p) for n in _self_and_parents(m) for p in excluded)
            else fmt for m in modules}


def _algo_format(algo: str | None) -> Format:
    if algo not in _ALGO_FORMAT:
        raise InputError(f"hf_quant_config.json: quant_algo {algo!r} is not one the advisor writes (FP8, NVFP4)")
    return _ALGO_FORMAT[algo]


def check_quant_config(
    qcfg: dict[str, Any] | None, plan: Plan, infos: Iterable[GroupInfo], scaled_modules: Iterable[str] = ()
) -> None:
    """Raise unless the checkpoint gives every layer the plan's format.

    ``scaled_modules``: the modules that have a ``weight_scale`` in the checkpoint; they must
    be exactly the plan's quantized layers (so no router, norm or vision layer is quantized).
    """
    infos = tuple(infos)
    expected = expected_layer_formats(plan, infos)
    found = layer_formats_from_quant_config(qcfg, list(expected))
    wrong = [f"{m}: plan {expected[m].value}, checkpoint {found[m].value}" for m in expected if found[m] != expected[m]]
    scaled = set(scaled_modules)
    if scaled:
        quantized = {m for m, f in expected.items() if f != Format.BF16}
        wrong += [f"{m}: quantized in the checkpoint, not in the plan" for m in sorted(scaled - quantized)]
        wrong += [f"{m}: no weight_scale in the checkpoint" for m in sorted(quantized - scaled)]
    if wrong:
        raise AssertionError(f"exported checkpoint disagrees with plan {plan.id}: " + "; ".join(wrong[:5]))


def weight_formats_from_quant_config(qcfg: dict[str, Any] | None) -> frozenset[Format]:
    """The quantized weight formats an ``hf_quant_config.json`` declares (None or no ``quant_algo``: none)."""
    q = (qcfg or {}).get("quantization", qcfg or {})
    algo = q.get("quant_algo")
    if algo is None:
        return frozenset()
    if algo == "MIXED_PRECISION":
        return frozenset(_algo_format(entry.get("quant_algo")) for entry in (q.get("quantized_layers") or {}).values())
    return frozenset({_algo_format(algo)})


def kv_cache_format_from_quant_config(qcfg: dict[str, Any] | None) -> Format:
    """The KV-cache format an ``hf_quant_config.json`` declares (``kv_cache_quant_algo``; absent: BF16)."""
    algo = (qcfg or {}).get("quantization", qcfg or {}).get("kv_cache_quant_algo")
    if algo is None:
        return Format.BF16
    if algo != "FP8":
        raise InputError(f"hf_quant_config.json: kv_cache_quant_algo {algo!r} is not one the advisor writes (FP8)")
    return Format.FP8


def kv_scale_names(infos: Iterable[GroupInfo]) -> list[tuple[str, str]]:
    """Per layer, the checkpoint names of its ``k_scale`` and ``v_scale``. ModelOpt names them after the
    attention module (``...self_attn.k_proj.k_scale``), also for a model with a fused ``qkv_proj``."""
    out = []
    for gi in infos:
        if gi.kind == "qkv":
            attn = gi.member_exports[0][0].rpartition(".")[0]
            out.append((f"{attn}.k_proj.k_scale", f"{attn}.v_proj.v_scale"))
    return out


def check_kv_cache(
    qcfg: dict[str, Any] | None, plan: Plan, infos: Iterable[GroupInfo], tensor_names: Iterable[str]
) -> None:
    """Raise unless the checkpoint's KV cache is the plan's: ``kv_cache_quant_algo`` and, for FP8, a
    k and v scale for every layer (none for BF16)."""
    found = kv_cache_format_from_quant_config(qcfg)
    names = set(tensor_names)
    scales = [n for pair in kv_scale_names(infos) for n in pair]
    wrong = [] if found == plan.kv_cache else [f"kv cache: plan {plan.kv_cache.value}, checkpoint {found.value}"]
    if plan.kv_cache == Format.FP8:
        wrong += [f"{n}: missing" for n in scales if n not in names]
    else:
        wrong += [f"{n}: a KV scale in a checkpoint with a BF16 KV cache" for n in scales if n in names]
    if wrong:
        raise AssertionError(f"exported checkpoint disagrees with plan {plan.id}: " + "; ".join(wrong[:5]))
