"""The fields a model's geometry is read from, judged on its config.json as written, before transformers fills in
its defaults: a field the model needs is there (a missing ``hidden_size`` is not transformers' 4096), and every
size is a positive whole number (not 0, -2 or the string "128").

A multimodal wrapper's ``text_config`` may leave sizes to its text config class (Gemma 3's published configs name
neither heads nor vocabulary): there only the fields it gives are judged, and the weights' headers
(:mod:`advisor.models.weights_match`) judge the rest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from huggingface_hub.errors import StrictDataclassError

from advisor.errors import InputError
from advisor.models.adapters import ADAPTERS, Adapter

#: every supported family's config.json names these (a MoE family's its expert fields too: :func:`_required`)
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size")
#: sizes a config may leave out or set to null (transformers derives them), but never set to a non-positive value
OPTIONAL = ("num_key_value_heads", "head_dim", "max_position_embeddings")
FIX = "give the config.json that came with the model's weights"
#: how transformers says a config cannot be read (a strict field's type, a size it divides by 0 ...)
UNREADABLE = (OSError, ValueError, KeyError, TypeError, ArithmeticError, StrictDataclassError)


def raw_config(where: str, revision: str | None = None) -> dict[str, Any] | None:
    """config.json as written (a local folder's, or a hub repository's through transformers' cache); None where it
    cannot be read (the config reader then says why)."""
    local = Path(where) / "config.json"
    try:
        if local.is_file():
            raw = json.loads(local.read_text())
        else:
            from transformers import PretrainedConfig

            raw = PretrainedConfig.get_config_dict(where, **({"revision": revision} if revision else {}))[0]
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


def _family(raw: dict[str, Any]) -> tuple[Adapter, dict[str, Any], str] | None:
    """The adapter, the fields of its text config and their place in config.json; None for a family without an
    adapter (refused elsewhere, with the supported ones named)."""
    outer = raw.get("model_type")
    if outer in ADAPTERS:
        return ADAPTERS[outer], raw, ""
    text = raw.get("text_config")
    if not isinstance(text, dict):
        return None
    inner = text.get("model_type")
    if inner is None:  # a wrapper's text_config may leave its model_type to the wrapper's class
        from transformers import CONFIG_MAPPING

        wrapper = CONFIG_MAPPING[outer] if isinstance(outer, str) and outer in CONFIG_MAPPING else None
        inner = getattr((getattr(wrapper, "sub_configs", None) or {}).get("text_config"), "model_type", None)
    return (ADAPTERS[inner], text, "text_config.") if inner in ADAPTERS else None


def has_routed_experts(raw: dict[str, Any] | None) -> bool:
    """``raw`` (config.json as written) is a supported mixture-of-experts family's with more than one expert."""
    family = _family(raw) if raw else None
    if family is None or not family[0].moe:
        return False
    adapter, fields, _ = family
    written = _as_written(fields, fields.get("model_type") or (raw or {}).get("model_type"))
    return _is_size(written.get(adapter.experts_attr), 2)


def _required(adapter: Adapter) -> tuple[str, ...]:
    if not adapter.moe:
        return REQUIRED
    moe = (adapter.experts_attr, "num_experts_per_tok", *filter(None, [adapter.moe_intermediate_attr]))
    return REQUIRED + moe


def _is_size(value: Any, minimum: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _as_written(fields: dict[str, Any], model_type: str) -> dict[str, Any]:
    """``fields`` under the config class's attribute names too (Qwen3-MoE writes num_experts as num_local_experts)."""
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type] if model_type in CONFIG_MAPPING else None  # noqa: SIM401 (lazy: .get misses)
    aliases = dict(getattr(config_class, "attribute_map", None) or {})
    out = dict(fields)
    for alias, name in aliases.items():
        for a, b in ((alias, name), (name, alias)):
            if a in fields and b not in out:
                out[b] = fields[a]
    return out


def check_config_fields(raw: dict[str, Any] | None, source: str) -> None:
    """InputError naming the first field of ``raw`` (config.json as written) the model's geometry cannot be read
    from; nothing for a config that cannot be read or whose family has no adapter (other checks name those)."""
    family = _family(raw) if raw is not None else None
    if family is None:
        return
    adapter, written, where = family
    wrapped = bool(where)
    fields = _as_written(written, adapter.model_type)
    at = f"model.source: {source}: config.json"
    if not wrapped:
        missing = [f for f in _required(adapter) if fields.get(f) is None]
        if missing:
            raise InputError(f"{at} has no {', '.join(missing)}; the {adapter.family} model's geometry is read from "
                             f"{'them' if len(missing) > 1 else 'it'} (no default stands in for a field the file "
                             f"lacks); {FIX}")
    sizes = {f: 1 for f in (*_required(adapter), *OPTIONAL)}
    if adapter.shared_expert_attr:
        sizes[adapter.shared_expert_attr] = 0  # 0: no shared expert
    for name, minimum in sizes.items():
        value = fields.get(name)
        if value is not None and not _is_size(value, minimum):
            kind = "a positive whole number" if minimum else "a whole number >= 0"
            raise InputError(f"{at}: {where}{name} is {json.dumps(value)}, not {kind}; {FIX}")
    _check_consistent(fields, adapter, f"{at}: {where}")


def _check_consistent(fields: dict[str, Any], adapter: Adapter, at: str) -> None:
    layers, types = fields.get("num_hidden_layers"), fields.get("layer_types")
    if isinstance(types, list) and len(types) != layers:
        raise InputError(f"{at}layer_types names {len(types)} layers, num_hidden_layers {layers}; {FIX}")
    heads, kv = fields.get("num_attention_heads"), fields.get("num_key_value_heads")
    hidden, head_dim = fields.get("hidden_size"), fields.get("head_dim")
    if heads and kv and heads % kv:
        raise InputError(f"{at}num_attention_heads {heads} is not a multiple of num_key_value_heads {kv} "
                         f"(each key/value head serves a whole number of query heads); {FIX}")
    if heads and hidden and head_dim is None and hidden % heads:
        raise InputError(f"{at}hidden_size {hidden} is not a multiple of num_attention_heads {heads} and no head_dim "
                         f"is given; {FIX}")
    experts, top_k = fields.get(adapter.experts_attr), fields.get("num_experts_per_tok")
    if adapter.moe and experts and top_k and top_k > experts:
        raise InputError(f"{at}num_experts_per_tok {top_k} is more than the {experts} experts "
                         f"({adapter.experts_attr}); {FIX}")
