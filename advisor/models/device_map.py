"""A transformers/accelerate ``device_map`` that spreads a model's decoder layers as a memory plan places them.

The searched stack's layers go to their plan devices; every other module goes with the embeddings (first
device) when it comes before the stack in its parent, else with lm_head (the last device): rotary tables,
final norms, a multimodal wrapper's towers. accelerate's hooks move each layer's inputs to its device, so
the proxy, calibration and the bank run on the spread model unchanged. A streaming plan's streamed layers go to
``"cpu"``: accelerate's dispatch keeps their weights in CPU memory and streams them to the first GPU as they run
(:mod:`advisor.quantize.streamed`).
"""

from __future__ import annotations

from typing import Any


def device_map_for(model: Any, layers_path: str, layer_devices: list[Any], first: Any, last: Any) -> dict[str, Any]:
    """Module path -> device for ``model`` (real or on the meta device): layer ``i`` of ``layers_path`` on
    ``layer_devices[i]``, the modules before the stack on ``first``, those after it on ``last``."""
    out: dict[str, Any] = {}
    parts = layers_path.split(".")
    module, prefix = model, ""
    for part in parts:
        seen_chain = False
        for name, _child in module.named_children():
            if name == part:
                seen_chain = True
                continue
            out[f"{prefix}{name}"] = last if seen_chain else first
        module, prefix = getattr(module, part), f"{prefix}{part}."
    for i in range(len(module)):
        out[f"{layers_path}.{i}"] = layer_devices[i]
    return out


def plan_device_map(config: Any, plan: Any) -> dict[str, int | str]:
    """The device map of a memory plan that runs (:class:`advisor.models.memory_plan.MemoryPlan`: its streamed
    layers on ``"cpu"``), built on a meta-device model of ``config`` (no memory, no weights)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    from advisor.models.adapters import adapter_for

    where: dict[str, int | str] = {**plan.device_of(), **dict.fromkeys(plan.overflow, "cpu")}
    with init_empty_weights():
        meta = AutoModelForCausalLM.from_config(config)
    path = adapter_for(config).stack_for(config.model_type).layers
    count = len(meta.get_submodule(path))
    return device_map_for(meta, path, [where[f"layer {i}"] for i in range(count)], where["embeddings"],
                          where["final norm + lm_head"])
