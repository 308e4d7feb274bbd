"""A plan as ModelOpt quantizer settings, applied in one ``mtq.quantize`` call.

:func:`quantize_plan` runs ``mtq.quantize`` once with a per-group config built from the
plan (BF16 groups disabled): used for export and for checks. Trials use
:class:`advisor.quantize.bank.FormatBank`, which shares these settings.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from advisor.errors import SetupError
from advisor.formats import Format
from advisor.models.adapters import GroupInfo, quant_cfg_entries
from advisor.models.replicas import Ranks
from advisor.plan import LayerGroup, Plan
from advisor.quantize.quiet import quiet

log = logging.getLogger(__name__)

ForwardLoop = Callable[[torch.nn.Module], None]


def modelopt_quantization() -> Any:
    with quiet():  # ModelOpt prints on import; stdout carries the advisor's results
        try:
            import modelopt.torch.quantization as mtq
        except ImportError as exc:
            raise SetupError(f"nvidia-modelopt is not importable ({exc}); pip install nvidia-modelopt") from None
    return mtq


def prepare_device(device: torch.device | str) -> None:
    """On CPU, give ModelOpt the NVFP4 kernel it lacks there and a faster FP8 one (nvfp4_cpu, fp8_cpu),
    and keep freed memory for the next forward (models.cpu_heap)."""
    if torch.device(device).type == "cpu":
        from advisor.models.cpu_heap import keep_freed_memory
        from advisor.quantize import fp8_cpu, nvfp4_cpu

        keep_freed_memory()
        nvfp4_cpu.register_cpu_kernel()
        fp8_cpu.register_cpu_kernel()


def _preset(fmt: Format) -> dict[str, Any]:
    mtq = modelopt_quantization()
    return {Format.FP8: mtq.FP8_DEFAULT_CFG, Format.NVFP4: mtq.NVFP4_DEFAULT_CFG}[fmt]


def format_quantizer_cfg(fmt: Format) -> dict[str, dict[str, Any]]:
    """The weight and input quantizer attributes of ModelOpt's default preset for ``fmt``."""
    found: dict[str, dict[str, Any]] = {}
    for entry in _preset(fmt)["quant_cfg"]:
        name = entry.get("quantizer_name")
        if name in ("*weight_quantizer", "*input_quantizer") and "cfg" in entry:
            found[name.lstrip("*")] = copy.deepcopy(entry["cfg"])
    if set(found) != {"weight_quantizer", "input_quantizer"}:
        raise SetupError(f"unexpected ModelOpt {fmt.value} preset layout; this nvidia-modelopt is not supported")
    return found


KV_QUANTIZERS = ("k_bmm_quantizer", "v_bmm_quantizer")


def kv_cache_quantizer_cfg() -> dict[str, Any]:
    """The k/v BMM quantizer attributes of ModelOpt's ``FP8_KV_CFG`` (FP8 E4M3, one scale per tensor)."""
    for entry in modelopt_quantization().FP8_KV_CFG["quant_cfg"]:
        if entry.get("quantizer_name") == "*[kv]_bmm_quantizer" and "cfg" in entry:
            return copy.deepcopy(entry["cfg"])
    raise SetupError("unexpected ModelOpt FP8_KV_CFG layout; this nvidia-modelopt is not supported")


def attention_modules(infos: Iterable[GroupInfo]) -> list[str]:
    """One attention module per layer: the parent of its q/k/v projections. ModelOpt wraps it
    (``_QuantAttention``) with ``k_bmm_quantizer``/``v_bmm_quantizer`` on the keys and values
    the attention reads, i.e. what the KV cache holds (keys after RoPE)."""
    return [gi.group.members[0].rpartition(".")[0] for gi in infos if gi.kind == "qkv"]


def kv_cache_entries(infos: Iterable[GroupInfo], kv_cache: Format) -> list[dict[str, Any]]:
    """``quant_cfg`` entries that turn on the KV-cache quantizers of every layer (none for BF16)."""
    if kv_cache == Format.BF16:
        return []
    cfg = kv_cache_quantizer_cfg()
    return [{"quantizer_name": f"{attn}.{q}", "cfg": copy.deepcopy(cfg)}
            for attn in attention_modules(infos) for q in KV_QUANTIZERS]


def plan_quant_config(plan: Plan, infos: Iterable[GroupInfo]) -> dict[str, Any]:
    """A ModelOpt config that quantizes each group's members in the plan's format, and the KV cache.

    Everything starts disabled (so lm_head, embeddings, routers, vision towers and BF16
    groups stay BF16), then each quantized member gets its format's weight and input
    quantizer under its exact ModelOpt name (the adapter's ``GroupInfo.quantizers``: a
    wildcard such as ``*q_proj*`` would also switch on output quantizers, which export
    writes as an FP8 KV cache). An FP8 KV cache turns on each attention's k/v BMM
    quantizers (``FP8_KV_CFG``); export then writes ``kv_cache_quant_algo: FP8`` and
    ``k_scale``/``v_scale``.
    """
    infos = tuple(infos)
    cfgs = {f.value: format_quantizer_cfg(f) for f in set(plan.formats.values()) if f != Format.BF16}
    entries = quant_cfg_entries(infos, plan.formats, cfgs) + kv_cache_entries(infos, plan.kv_cache)
    return {"quant_cfg": entries, "algorithm": "max"}


def plan_group_table(model: torch.nn.Module, plan: Plan, groups: Iterable[LayerGroup]) -> list[GroupInfo]:
    """The model's group table, after checking that ``groups`` and ``plan`` are the model's."""
    from advisor.errors import InputError
    from advisor.models.groups import group_table

    groups = tuple(groups)
    infos = group_table(model)
    given = {g.name: g.members for g in groups}
    found = {gi.name: gi.group.members for gi in infos}
    if given != found:
        raise InputError("the layer groups given do not match the model's "
                         f"(first difference: {sorted(set(given.items()) ^ set(found.items()))[:1]})")
    plan.check_against(groups)
    return infos


def _shared_amax(quantizers: list[Any]) -> torch.Tensor | None:
    """The largest per-tensor amax of ``quantizers``; None unless each holds one scalar amax."""
    amaxes = [getattr(q, "amax", None) for q in quantizers]
    if any(a is None or a.numel() != 1 for a in amaxes):
        return None
    return torch.stack([a.float().reshape(()) for a in amaxes]).max()


def tie_fused_scales(model: torch.nn.Module, plan: Plan, infos: Iterable[GroupInfo]) -> None:
    """Give the members of a fused group one input amax and one weight amax: the max over members.

    A serving engine runs q/k/v (and gate/up) as one GEMM with one input scale and one
    per-tensor weight scale: TensorRT-LLM's ``FP8QDQLinearMethod.rescale_fused_weights``
    takes the largest input and weight scale and re-quantizes each member's FP8 weights to
    it, vLLM re-quantizes with ``weight_scale.max()``, and ModelOpt's
    ``requantize_resmooth_fused_llm_layers`` does the same for NVFP4 at export (it leaves
    FP8 alone, so an FP8 export would otherwise carry one scale per member). For NVFP4 the
    weight amax is the global one (``weight_scale_2``); block scales stay per block.
    Scoring with the shared scales makes the searched model the deployed one. Groups whose
    members read different inputs (a layer's routed experts) keep their own scales.
    """
    with torch.no_grad():
        for gi in infos:
            members = gi.group.members
            if plan.format_of(gi.name) == Format.BF16 or len(members) < 2 or not gi.members_share_input:
                continue
            modules = [model.get_submodule(m) for m in members]
            for attr in ("weight_quantizer", "input_quantizer"):
                quantizers = [getattr(mod, attr) for mod in modules]
                shared = _shared_amax(quantizers)
                if shared is None:
                    continue
                for q in quantizers:
                    q.amax = shared.to(q.amax.dtype).reshape(q.amax.shape).clone()


def quantize_plan(model: torch.nn.Module, plan: Plan, groups: Iterable[LayerGroup], forward_loop: ForwardLoop,
                  ranks: Ranks | None = None):
    """Quantize ``model`` in place with ModelOpt for ``plan`` (calibrates once) and return it. With ``ranks``
    spread over a node, each rank's ``forward_loop`` runs its share of the calibration batches and the ranges are
    then the maximum over the ranks (:func:`sync_ranges`)."""
    infos = plan_group_table(model, plan, groups)
    prepare_device(next(model.parameters()).device)
    mtq = modelopt_quantization()
    config = plan_quant_config(plan, infos)
    spread = ranks is not None and ranks.spread
    if spread:  # ModelOpt's own sync skips a quantizer a rank saw no data for, and the ranks' calls then pair wrongly
        config["algorithm"] = {"method": "max", "distributed_sync": False}
    with quiet():
        model = mtq.quantize(model, config, forward_loop)
    if spread:
        sync_ranges(model, ranks)
    tie_fused_scales(model, plan, infos)
    return model


def sync_ranges(model: torch.nn.Module, ranks: Ranks) -> None:
    """Every quantizer's calibrated amax made the maximum over the ranks' amax, as one process calibrating on
    every rank's batches would have it (a maximum is exact in any order). A quantizer that saw no data on one
    rank (no batch there, an expert no token of its batches reached) takes the others'; one without an amax on
    every rank keeps none. One all-reduce of every amax, in float32 (which holds BF16 and float32 exactly)."""
    from modelopt.torch.quantization.nn import TensorQuantizer

    quantizers = {n: m for n, m in model.named_modules() if isinstance(m, TensorQuantizer)}
    have = {n: (tuple(q._amax.shape), str(q._amax.dtype).removeprefix("torch."))
            for n, q in quantizers.items() if getattr(q, "_amax", None) is not None}
    shapes = ranks.merged(have)
    names = [n for n in quantizers if n in shapes]
    sizes = [math.prod(shapes[n][0]) for n in names]
    flat = torch.full((sum(sizes),), -math.inf, dtype=torch.float32)
    for n, piece in zip(names, flat.split(sizes), strict=True):
        if n in have:
            piece.copy_(quantizers[n]._amax.detach().float().reshape(-1).cpu())
    ranks.max_(flat)
    device = next(model.parameters()).device
    with torch.no_grad():
        for n, piece in zip(names, flat.split(sizes), strict=True):
            shape, dtype = shapes[n]
            value = piece.reshape(shape).to(getattr(torch, dtype))
            q = quantizers[n]
            if n in have:
                q._amax.copy_(value.to(q._amax.device))
            else:
                q.amax = value.to(device)
