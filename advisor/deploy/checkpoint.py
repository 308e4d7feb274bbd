"""Read an exported checkpoint back into a fake-quantized model (the round-trip check).

A fresh model is built from the exported ``config.json``; each quantized layer's weight
is read from the file and de-quantized (FP8: ``weight * weight_scale``; NVFP4: unpacked
E2M1 nibbles times FP8 block scales times ``weight_scale_2``, with ModelOpt's
``NVFP4QTensor.dequantize``), and ModelOpt input quantizers are inserted with the amax
that the file's ``input_scale`` implies. The formats come from ``hf_quant_config.json``
alone, not from the plan. transformers 5 has no loader for ``quant_method: modelopt``
checkpoints, hence this reader.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from advisor.deploy.quant_config import layer_formats_from_quant_config
from advisor.deploy.quiet import quiet
from advisor.errors import InputError
from advisor.formats import Format

_E4M3_MAX = 448.0
_E2M1_MAX = 6.0


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


def load_exported(export_dir: Path | str, device: str = "cpu") -> Any:
    """Rebuild the fake-quantized model of an exported checkpoint (see the module docstring)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from advisor.models.groups import layer_groups
    from advisor.quantize.modelopt_config import format_quantizer_cfg, modelopt_quantization, prepare_device

    export_dir = Path(export_dir)
    cfg_path = export_dir / "config.json"
    if not cfg_path.is_file():
        raise InputError(f"{export_dir} holds no config.json; not an exported checkpoint")
    raw = json.loads(cfg_path.read_text())
    raw.pop("quantization_config", None)
    config = AutoConfig.for_model(**raw)
    dtype = torch.bfloat16
    with quiet():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    qpath = export_dir / "hf_quant_config.json"
    qcfg = json.loads(qpath.read_text()) if qpath.is_file() else None

    tensors: dict[str, Any] = {}
    for f in sorted(export_dir.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    groups = layer_groups(model)
    modules = [m for g in groups for m in g.members]
    formats = layer_formats_from_quant_config(qcfg, modules)

    quantized = [m for m in modules if formats[m] != Format.BF16]
    special = {f"{m}.{s}" for m in quantized for s in ("weight", "weight_scale", "weight_scale_2", "input_scale")}
    plain = {k: v for k, v in tensors.items() if k not in special}
    missing, unexpected = model.load_state_dict(plain, strict=False)
    missing = [k for k in missing if k.removesuffix(".weight") not in quantized and k != "lm_head.weight"]
    if missing or unexpected:
        raise InputError(f"{export_dir}: checkpoint does not match its config: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    with torch.no_grad():
        for m in quantized:
            model.get_submodule(m).weight.copy_(_dequantize_weight(formats[m], tensors, m, dtype))

    # Input quantizers only: the weights above already hold the de-quantized values.
    prepare_device(device)
    mtq = modelopt_quantization()
    entries: list[dict[str, Any]] = [{"quantizer_name": "*", "enable": False}]
    for m in quantized:
        qc = format_quantizer_cfg(formats[m])["input_quantizer"]
        entries.append({"quantizer_name": f"{m}.input_quantizer", "cfg": qc})
    model.to(device).eval()
    if quantized:
        with quiet():
            mtq.quantize(model, {"quant_cfg": entries, "algorithm": "max"}, lambda _m: None)
        for m in quantized:
            scale = tensors[f"{m}.input_scale"].float()
            bound = _E4M3_MAX * (_E2M1_MAX if formats[m] == Format.NVFP4 else 1.0)
            iq = model.get_submodule(m).input_quantizer
            iq.amax = (scale * bound).to(device)
            iq.enable()
    return model
