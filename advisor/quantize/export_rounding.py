"""FP8 weights rounded as the exported checkpoint rounds them: a trial scores what is served.

ModelOpt's fake quantizer rounds a weight to FP8 once, in float32 (``w * 448 / amax``); its
export (``unified_export_hf``: ``to_quantized_weight(weight, amax / 448)``) divides the BF16
weight by the scale in BF16 first, so the weights that sit within a BF16 step of the midpoint
of two FP8 codes (about 3%) land one FP8 step away in the checkpoint. On a 656K-parameter
model that moved the proxy KL of the served model 7-14% from the scored one.

:func:`round_fp8_weights_as_exported` sets every per-tensor FP8 weight to the value the
checkpoint serves: ModelOpt's own export functions give the codes and the scale, and the
weight becomes codes x scale in its dtype. The weight quantizers stay on: quantizing those
values again gives the same codes (they are FP8 values times the scale, within one BF16
rounding, far inside an FP8 step), in a trial's fake quantization and in the export alike.
A fused-experts module (3-D expert weights, one quantizer per expert) keeps the fake
quantizer's rounding.
"""

from __future__ import annotations

import torch


def round_fp8_weights_as_exported(model: torch.nn.Module) -> int:
    """Round ``model``'s per-tensor FP8 weights (in place) as its export will; returns how many."""
    from modelopt.torch.export.quant_utils import (
        QUANTIZATION_FP8,
        get_quantization_format,
        get_weight_scaling_factor,
        to_quantized_weight,
    )

    done = 0
    with torch.no_grad():
        for module in model.modules():
            quantizer = getattr(module, "weight_quantizer", None)
            weight = getattr(module, "weight", None)
            if quantizer is None or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
                continue
            if not getattr(quantizer, "is_enabled", False) or get_quantization_format(module) != QUANTIZATION_FP8:
                continue
            scale = get_weight_scaling_factor(module)
            codes = to_quantized_weight(weight.to(weight.dtype), scale, QUANTIZATION_FP8)
            weight.copy_((codes.float() * scale.float().to(weight.device)).to(weight.dtype))
            done += 1
    return done
