"""Read an exported checkpoint back into a fake-quantized model (the round-trip check).

Every weight that has a ``weight_scale`` in the file is de-quantized under its own
checkpoint name (FP8: ``weight * weight_scale``; NVFP4: unpacked E2M1 nibbles times FP8
block scales times ``weight_scale_2``, with ModelOpt's ``NVFP4QTensor.dequantize``), in
the format ``hf_quant_config.json`` gives it (the formats come from the file alone, not
from the plan). transformers then loads that BF16 state dict into a model built from the
exported ``config.json``: its own checkpoint conversion maps the saved names back to
in-memory ones (the Gemma-3 wrapper's ``language_model.model.*``; per-expert
``experts.{e}.gate_proj``/``up_proj`` or Mixtral ``w1``/``w3`` stacked into the fused
``gate_up_proj``). Finally ModelOpt input quantizers are inserted with the amax that the
file's ``input_scale`` implies, under the names of the model's adapter
(``GroupInfo.member_exports`` links each member to its checkpoint names), and, when
``kv_cache_quant_algo`` is FP8, each attention's k/v BMM quantizers with the amax its
``k_scale``/``v_scale`` imply (scale = amax / 448, as ModelOpt writes them). transformers 5
has no loader for ``quant_method: modelopt`` checkpoints (it would read FP8 codes as
values and drop the scales), hence this reader.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from advisor.deploy.checkpoint._quant_config import (
    kv_cache_format_from_quant_config,
    kv_scale_names,
    layer_formats_from_quant_config,
)
from advisor.errors import InputError
from advisor.formats import Format
from advisor.quantize.quiet import quiet

_E4M3_MAX = 448.0
_E2M1_MAX = 6.0
_SCALES = ("weight_scale", "weight_scale_2", "input_scale", "k_scale", "v_scale")


def _dequantize_weight(fmt: Format, tensors: dict[str, Any], name: str, dtype: Any) -> Any:
    import torch

    w = tensors[f"{name}.weight"]
    if fmt == Format.FP8:
        return (w.float() * tensors[f"{name}.weight_scale"].float()).to(dtype)
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    shape = torch.Size([w.shape[0], w.shape[1] * 2])
    q = NVFP4QTensor(shape, dtype, w)
    return q.dequantize(dtype=dtype, scale=tensors[f"{name}.weight_scale"],
                        double_scale=tensors[f"{name}.weight_scale_2"].float(), block_sizes={-1: 16})


def scaled_modules(tensor_names: Any) -> list[str]:
    """Modules of a checkpoint that hold a quantized weight (they have a ``weight_scale``)."""
    return sorted(k.removesuffix(".weight_scale") for k in tensor_names if k.endswith(".weight_scale"))


def _model_class(config: Any) -> Any:
    import transformers

    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    raise InputError(f"config.json names no model class transformers knows (architectures: "
                     f"{getattr(config, 'architectures', None)})")


def _read(export_dir: Path) -> tuple[Any, dict[str, Any] | None, dict[str, Any]]:
    from safetensors.torch import load_file
    from transformers import AutoConfig

    cfg_path = export_dir / "config.json"
    if not cfg_path.is_file():
        raise InputError(f"{export_dir} holds no config.json; not an exported checkpoint")
    raw = json.loads(cfg_path.read_text())
    raw.pop("quantization_config", None)
    qpath = export_dir / "hf_quant_config.json"
    tensors: dict[str, Any] = {}
    for f in sorted(export_dir.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return AutoConfig.for_model(**raw), json.loads(qpath.read_text()) if qpath.is_file() else None, tensors


def load_exported(export_dir: Path | str, device: str = "cpu", dtype: Any = None) -> Any:
    """Rebuild the fake-quantized model of an exported checkpoint (see the module docstring), in ``dtype``
    (default BF16; float32 where the plan was scored in float32, :mod:`advisor.models.arithmetic`)."""
    import torch

    from advisor.models.adapters import member_quantizers
    from advisor.models.groups import group_table, use_eager_experts
    from advisor.quantize.modelopt_config import (
        KV_QUANTIZERS,
        attention_modules,
        format_quantizer_cfg,
        kv_cache_quantizer_cfg,
        modelopt_quantization,
        prepare_device,
    )

    export_dir = Path(export_dir)
    config, qcfg, tensors = _read(export_dir)
    dtype = dtype or torch.bfloat16
    quantized = scaled_modules(tensors)
    formats = layer_formats_from_quant_config(qcfg, quantized)
    if unlisted := [m for m in quantized if formats[m] == Format.BF16]:
        raise InputError(f"{export_dir}: {unlisted[:3]} have quantized weights but hf_quant_config.json "
                         "lists them as unquantized")
    state = {k: v for k, v in tensors.items() if k.rsplit(".", 1)[-1] not in _SCALES}
    for m in quantized:
        state[f"{m}.weight"] = _dequantize_weight(formats[m], tensors, m, dtype)
    with quiet():
        model, info = _model_class(config).from_pretrained(
            None, config=config, state_dict=state, dtype=dtype, output_loading_info=True)
    missing = [k for k in info["missing_keys"] if k != "lm_head.weight"]
    unexpected, mismatched = list(info["unexpected_keys"]), list(info["mismatched_keys"])
    if missing or unexpected or mismatched:
        raise InputError(f"{export_dir}: checkpoint does not match its config: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}, mismatched {mismatched[:3]}")
    use_eager_experts(model)

    # Input quantizers only: the weights above already hold the de-quantized values.
    entries: list[dict[str, Any]] = [{"quantizer_name": "*", "enable": False}]
    amax: dict[str, Any] = {}
    for gi in group_table(model):
        fmts = {formats.get(n, Format.BF16) for n in gi.exported}
        if len(fmts) > 1:
            raise InputError(f"{export_dir}: group {gi.name} has several formats in the checkpoint "
                             f"({sorted(f.value for f in fmts)}); engines run it with one")
        fmt = fmts.pop()
        if fmt == Format.BF16:
            continue
        bound = _E4M3_MAX * (_E2M1_MAX if fmt == Format.NVFP4 else 1.0)
        for member, names in zip(gi.group.members, gi.member_exports, strict=True):
            quantizer = member_quantizers(member, gi.layout)[1]
            entries.append({"quantizer_name": quantizer, "cfg": format_quantizer_cfg(fmt)["input_quantizer"]})
            # one input scale per member (fused experts share it; export repeats it per expert)
            scale = torch.stack([tensors[f"{n}.input_scale"].float().reshape(()) for n in names]).max()
            amax[quantizer] = scale * bound
    if kv_cache_format_from_quant_config(qcfg) == Format.FP8:
        infos = group_table(model)
        for attn, names in zip(attention_modules(infos), kv_scale_names(infos), strict=True):
            for quantizer, name in zip(KV_QUANTIZERS, names, strict=True):
                if name not in tensors:
                    raise InputError(f"{export_dir}: kv_cache_quant_algo is FP8 but {name} is missing")
                entries.append({"quantizer_name": f"{attn}.{quantizer}", "cfg": kv_cache_quantizer_cfg()})
                amax[f"{attn}.{quantizer}"] = tensors[name].float().reshape(()) * _E4M3_MAX
    prepare_device(device)
    model.to(device).eval()
    if amax:
        with quiet():
            modelopt_quantization().quantize(model, {"quant_cfg": entries, "algorithm": "max"}, lambda _m: None)
        for name, value in amax.items():
            iq = model.get_submodule(name)
            iq.amax = value.to(device)
            iq.enable()
    return model
