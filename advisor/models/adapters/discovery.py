"""Fused layer groups of a loaded model and their ModelOpt quantizer names."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from typing import Any

from advisor.models.adapters.registry import check_causal_lm, text_config
from advisor.models.adapters.types import (
    KIND_ORDER,
    ROUTED_KINDS,
    Adapter,
    GroupInfo,
    Layout,
    Role,
    Stack,
    UnsupportedArchitectureError,
)
from advisor.plan import LayerGroup

# ----------------------------------------------------------------------------- group discovery


def member_quantizers(member: str, layout: Layout) -> tuple[str, str]:
    """(weight, input) ModelOpt quantizer names of a group member."""
    if layout == "fused_experts":
        return f"{member}_weight_quantizer", f"{member}_input_quantizer"
    return f"{member}.weight_quantizer", f"{member}.input_quantizer"


def _expand(layer: Any, role: Role, prefix: str) -> list[tuple[str, int, int, int, tuple[str, ...]]]:
    """(member, in, out, num_experts, relative export paths) of ``role`` in one layer; [] if absent."""
    import torch

    if role.layout == "fused_experts":
        owner_path, _, pname = role.path.rpartition(".")
        try:
            owner = layer.get_submodule(owner_path)
        except AttributeError:
            return []
        p = getattr(owner, pname, None)
        if not isinstance(p, torch.Tensor) or p.dim() != 3:
            return []
        e, out, inn = (int(s) for s in p.shape)
        exported = tuple(x.format(e=i) for i in range(e) for x in role.export) or (role.path,)
        return [(f"{prefix}.{role.path}", inn, e * out, e, exported)]
    if "*" not in role.path:
        try:
            mod = layer.get_submodule(role.path)
        except AttributeError:
            return []
        if not isinstance(mod, torch.nn.Linear):
            return []
        return [(f"{prefix}.{role.path}", mod.in_features, mod.out_features, 0, role.export or (role.path,))]
    pat = re.compile("^" + re.escape(role.path).replace(r"\*", r"(\d+)") + "$")
    found = []
    for name, mod in layer.named_modules():
        m = pat.match(name)
        if m and isinstance(mod, torch.nn.Linear):
            found.append((int(m[1]), f"{prefix}.{name}", mod.in_features, mod.out_features, (name,)))
    return [(n, i, o, 1, ex) for _, n, i, o, ex in sorted(found)]


def _expert_index(member: str) -> int:
    """Expert index of a per-expert member (``...experts.3.w1`` -> 3); -1 otherwise."""
    m = re.search(r"experts\.(\d+)\.", member)
    return int(m[1]) if m else -1


def expert_routing(config: Any, adapter: Adapter) -> tuple[int, int]:
    if not adapter.moe:
        return 0, 0
    text = text_config(config)
    return int(getattr(text, adapter.experts_attr, 0) or 0), int(getattr(text, "num_experts_per_tok", 0) or 0)


def _export_name(name: str, stack: Stack) -> str:
    old, new = stack.export_prefix
    return new + name[len(old):] if old and name.startswith(old) else name


def group_infos(model: Any, adapter: Adapter | None = None) -> list[GroupInfo]:
    """Every quantizable group of ``model``, in layer order, kinds in :data:`KIND_ORDER`.

    Groups are named ``layers.{i}.{kind}``: an adapter has exactly one searched stack (the
    text decoder; ``GroupInfo.stack`` names it), so the short name is unique, and the names
    of Llama-family plans stay what they were before adapters existed.

    Raises :class:`UnsupportedArchitectureError` when a linear (or 3-D expert) weight is
    neither in a group nor declared never-quantized, so an unknown variant of a family
    is refused rather than partly quantized.
    """
    import torch

    adapter = check_causal_lm(model, adapter)
    outer = model.config.model_type
    stack = adapter.stack_for(outer)
    try:
        layers = model.get_submodule(stack.layers)
    except AttributeError:
        raise UnsupportedArchitectureError(
            f"{type(model).__name__}: no decoder layers at {stack.layers!r} (the {adapter.family} adapter's stack)"
        ) from None
    experts, top_k = expert_routing(model.config, adapter)
    infos: list[GroupInfo] = []
    covered: set[str] = set()
    for idx, layer in enumerate(layers):
        prefix = f"{stack.layers}.{idx}"
        by_kind: dict[str, list[tuple[Role, str, int, int, int, tuple[str, ...]]]] = {}
        for role in adapter.roles:
            for member, inn, out, e, rel in _expand(layer, role, prefix):
                by_kind.setdefault(role.kind, []).append((role, member, inn, out, e, rel))
        for kind in KIND_ORDER:
            entries = by_kind.get(kind)
            if not entries:
                continue
            entries.sort(key=lambda x: _expert_index(x[1]))  # per-expert members: expert-major, like export
            layout: Layout = "fused_experts" if any(r.layout == "fused_experts" for r, *_ in entries) else "linear"
            members = tuple(m for _, m, *_ in entries)
            shapes = tuple((i, o) for _, _, i, o, _, _ in entries)
            quantizers = tuple(q for _, m, *_ in entries for q in member_quantizers(m, layout))
            exported = tuple(tuple(_export_name(f"{prefix}.{p}", stack) for p in rel) for *_, rel in entries)
            name = f"layers.{idx}.{kind}"
            n_exp = experts if kind in ROUTED_KINDS else 0
            infos.append(GroupInfo(LayerGroup(name, members, shapes), stack.layers, idx, kind, layout, quantizers,
                                   exported, n_exp, top_k if n_exp else 0))
            covered.update(members)
    if not infos:
        raise UnsupportedArchitectureError(f"{type(model).__name__}: no quantizable linears under {stack.layers}")
    stray = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name not in covered and not adapter.is_never_quantized(name, outer):
            stray.append(name)
        for pname, p in mod.named_parameters(recurse=False):
            full = f"{name}.{pname}" if name else pname
            expert_weight = p.dim() == 3 and ("expert" in name or hasattr(mod, "num_experts"))
            if expert_weight and full not in covered and not adapter.is_never_quantized(name, outer):
                stray.append(full)
    if stray:
        raise UnsupportedArchitectureError(
            f"{type(model).__name__} ({adapter.family}) has linear weights the adapter does not place: "
            f"{stray[:5]}{'...' if len(stray) > 5 else ''}"
        )
    return infos


def discover_groups(model: Any, adapter: Adapter | None = None) -> list[LayerGroup]:
    """The :class:`LayerGroup` s of ``model`` (see :func:`group_infos`)."""
    return [gi.group for gi in group_infos(model, adapter)]


def quant_cfg_entries(
    infos: Iterable[GroupInfo], formats: Mapping[str, Any], quantizer_cfgs: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """ModelOpt ``quant_cfg`` entries for a plan: every quantizer off, then each group's on.

    ``formats``: group name -> format (``Format`` or its value; ``bf16`` stays off).
    ``quantizer_cfgs``: format value -> {"weight_quantizer": cfg, "input_quantizer": cfg}.
    Names are exact: a wildcard like ``*q_proj*`` also switches on ``output_quantizer``,
    and an enabled k_proj/v_proj output quantizer is exported as an FP8 KV cache.
    """
    entries: list[dict[str, Any]] = [{"quantizer_name": "*", "enable": False}]
    for gi in infos:
        fmt = str(getattr(formats[gi.name], "value", formats[gi.name]))
        if fmt == "bf16":
            continue
        for q in gi.quantizers:
            which = "weight_quantizer" if q.endswith("weight_quantizer") else "input_quantizer"
            entries.append({"quantizer_name": q, "cfg": copy.deepcopy(dict(quantizer_cfgs[fmt][which]))})
    return entries


