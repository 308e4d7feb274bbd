"""Bank entries at their own width: folded FP8 and NVFP4 weights kept as codes, decoded per module as it runs.

A folded weight (ModelOpt's ``fold_weight``: the fake quantizer applied once, the result stored in
BF16) holds only values its format can express, so it is stored as what produces them:

* FP8 (per-tensor): one ``float8_e4m3fn`` code per weight (the code ModelOpt's fake quantizer
  gives the folded value again, :func:`advisor.quantize.fp8_cpu.fp8_codes`) and, per weight view,
  the BF16 value of each of the 256 codes, read from the folded weight itself;
* NVFP4: two E2M1 codes a byte (sign and magnitude index), one FP8 block-scale code per 16
  weights and a float32 global scale per view, decoded with the arithmetic of ModelOpt's kernel
  (:mod:`advisor.quantize.nvfp4_cpu`).

Each packed tensor is decoded at pack time and compared bit for bit with the folded one: a weight
whose codes would not give back the folded values stays BF16 (:attr:`PackStats.kept_bf16`), so a
trial's arithmetic is the folded bank's exactly. A packed module's weight is a zero-stride
placeholder of the right shape between forwards; a forward pre-hook puts the decoded weight in
place and a forward hook drops it, so one module's BF16 weight exists at a time. A view is a
linear's weight, or one expert's slice of a transformers fused-experts weight (one quantizer per
expert).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from advisor.formats import Format
from advisor.quantize.fp8_cpu import fp8_codes
from advisor.quantize.nvfp4_cpu import (
    block_scale_codes,
    e2m1_round_magnitude,
    global_scale,
    scales_from_codes,
)

_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_BLOCK = 16


@dataclass
class PackStats:
    packed: int = 0  # weight tensors held as codes
    kept_bf16: list[str] = field(default_factory=list)  # folded weights left BF16: "name (format: why)"


class PackedFP8(torch.nn.Module):
    """FP8 codes ``[..., out, in]`` and a ``[views, 256]`` BF16 table per view (views: 1, or the experts)."""

    def __init__(self, codes: torch.Tensor, table: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("codes", codes)
        self.register_buffer("table", table)

    def decode(self) -> torch.Tensor:
        views = self.table.shape[0]
        index = self.codes.view(torch.uint8).to(torch.int32)
        if views > 1:  # each expert's codes index its own 256 values
            index += (torch.arange(views, dtype=torch.int32, device=index.device) * 256).view(-1, 1, 1)
        return self.table.reshape(-1).index_select(0, index.reshape(-1)).reshape(self.codes.shape)


class PackedNVFP4(torch.nn.Module):
    """E2M1 codes two a byte (low nibble first; bit 3 the sign), FP8 block-scale codes, a global scale per view."""

    def __init__(self, nibbles: torch.Tensor, scale_codes: torch.Tensor, global_scales: torch.Tensor,
                 shape: torch.Size, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("nibbles", nibbles)
        self.register_buffer("scale_codes", scale_codes)
        self.register_buffer("global_scales", global_scales)
        self.shape = shape
        self.dtype = dtype

    def decode(self) -> torch.Tensor:
        views = self.global_scales.numel()
        codes = torch.stack((self.nibbles & 0xF, self.nibbles >> 4), dim=-1).reshape(views, -1, _BLOCK)
        values = torch.tensor(_E2M1_VALUES, device=codes.device)
        magnitude = values[(codes & 7).long()]
        scale = torch.stack([scales_from_codes(self.scale_codes[v], self.global_scales[v]) for v in range(views)])
        q = magnitude.mul_(scale.view(views, -1, 1))
        return torch.where(codes >= 8, -q, q).reshape(self.shape).to(self.dtype)


def _views(weight: torch.Tensor) -> torch.Tensor:
    return weight if weight.dim() == 3 else weight.unsqueeze(0)


def _pack_fp8(folded: torch.Tensor, amaxes: list[torch.Tensor]) -> PackedFP8:
    views = _views(folded)
    codes = torch.stack([fp8_codes(views[v], amaxes[v]) for v in range(views.shape[0])]).reshape(folded.shape)
    table = torch.zeros(views.shape[0], 256, dtype=folded.dtype, device=folded.device)
    index = codes.view(torch.uint8).reshape(views.shape[0], -1).long()
    table.scatter_(1, index, views.reshape(views.shape[0], -1))
    return PackedFP8(codes, table)


def _pack_nvfp4(original: torch.Tensor, folded: torch.Tensor, amaxes: list[torch.Tensor]) -> PackedNVFP4:
    """Block scales from the weight before folding (as the fake quantizer computed them), magnitudes and signs
    from the folded values."""
    originals, folds = _views(original), _views(folded)
    n = folds.shape[0]
    gs = torch.stack([global_scale(a).to(folded.device) for a in amaxes])
    block_amax = originals.float().reshape(n, -1, _BLOCK).abs().amax(dim=-1)
    scale_codes = torch.stack([block_scale_codes(block_amax[v], gs[v]) for v in range(n)])
    scales = torch.stack([scales_from_codes(scale_codes[v], gs[v]) for v in range(n)])
    blocks = folds.float().reshape(n, -1, _BLOCK)
    magnitude = e2m1_round_magnitude(blocks.abs() / scales.unsqueeze(-1))
    index = torch.bucketize(magnitude, torch.tensor(_E2M1_VALUES, device=folded.device)).to(torch.uint8)
    codes = index | (torch.signbit(blocks).to(torch.uint8) << 3)
    pairs = codes.reshape(n, -1, 2)
    nibbles = pairs[..., 0] | (pairs[..., 1] << 4)
    return PackedNVFP4(nibbles.reshape(*folded.shape[:-1], -1), scale_codes, gs, folded.shape, folded.dtype)


def _weight_quantizers(module: torch.nn.Module) -> dict[str, list[Any]]:
    """Each weight parameter of a ModelOpt quantized module and its quantizers (one per view)."""
    if hasattr(module, "down_proj_weight_quantizers"):  # a fused-experts module: one quantizer per expert
        first = module._first_proj_attr
        return {first: list(getattr(module, f"{first}_weight_quantizers")),
                "down_proj": list(module.down_proj_weight_quantizers)}
    from modelopt.torch.quantization.utils import quantizer_attr_names, weight_attr_names

    return {name: [getattr(module, quantizer_attr_names(name).weight_quantizer)] for name in weight_attr_names(module)}


def _per_tensor_amax(quantizer: Any) -> torch.Tensor | None:
    amax = getattr(quantizer, "amax", None)
    if not getattr(quantizer, "is_enabled", False) or amax is None or amax.numel() != 1:
        return None
    return amax.detach().float().clone()


def _placeholder(like: torch.Tensor) -> torch.nn.Parameter:
    """A weight of ``like``'s shape, dtype and device that costs one element."""
    return torch.nn.Parameter(torch.zeros((), dtype=like.dtype, device=like.device).expand(like.shape),
                              requires_grad=False)


def _materialize(module: torch.nn.Module, _args: Any) -> None:
    for name, packed in module.packed_weights.items():
        if name in module._buffers:  # a streamed module's (advisor.quantize.streamed)
            module._buffers[name] = packed.decode()
        else:
            module._parameters[name] = torch.nn.Parameter(packed.decode(), requires_grad=False)


def _release(module: torch.nn.Module, _args: Any, _output: Any) -> None:
    for name in module.packed_weights:
        if name in module._buffers:
            module._buffers[name] = _placeholder(module._buffers[name]).detach()
        else:
            module._parameters[name] = _placeholder(module._parameters[name])


@torch.no_grad()
def fold_and_pack(module: torch.nn.Module, fmt: Format, name: str, stats: PackStats,
                  decode_hooks: bool = True) -> None:
    """Give ``module`` (calibrated for ``fmt``, its weights shared with the BF16 model) its own folded weights,
    rounded as the export will, and hold them as ``fmt``'s codes where they decode exactly. ``decode_hooks``:
    register the forward hooks that decode them (else the caller does, :mod:`advisor.quantize.streamed`)."""
    from advisor.quantize.export_rounding import round_fp8_weights_as_exported
    from advisor.quantize.modelopt_config import modelopt_quantization

    quantizers = _weight_quantizers(module)
    amaxes = {w: [_per_tensor_amax(q) for q in qs] for w, qs in quantizers.items()}
    originals = {w: module._parameters[w].detach() for w in quantizers}
    for w, weight in originals.items():  # its own copy: folding writes into it
        module._parameters[w] = torch.nn.Parameter(weight.clone(), requires_grad=False)
    round_fp8_weights_as_exported(module)
    rounded = {w: module._parameters[w].detach().clone() for w in quantizers} if fmt == Format.NVFP4 else {}
    modelopt_quantization().fold_weight(module)
    packed = torch.nn.ModuleDict()
    for w, amax in amaxes.items():
        folded = module._parameters[w].detach()
        if fmt not in (Format.FP8, Format.NVFP4) or any(a is None for a in amax):
            stats.kept_bf16.append(f"{name}.{w} ({fmt.value}: no per-tensor scale)")
            continue
        if fmt == Format.NVFP4 and folded.shape[-1] % _BLOCK:
            stats.kept_bf16.append(f"{name}.{w} ({fmt.value}: rows not in blocks of {_BLOCK})")
            continue
        entry = _pack_fp8(folded, amax) if fmt == Format.FP8 else _pack_nvfp4(rounded[w], folded, amax)
        if not torch.equal(entry.decode().view(torch.int16), folded.view(torch.int16)):
            stats.kept_bf16.append(f"{name}.{w} ({fmt.value}: codes decode otherwise)")
            continue
        packed[w] = entry
        module._parameters[w] = _placeholder(folded)
        stats.packed += 1
    if len(packed):
        module.packed_weights = packed
        if decode_hooks:
            module.register_forward_pre_hook(_materialize)
            module.register_forward_hook(_release)


def bank_bytes(modules: dict[str, torch.nn.Module]) -> int:
    """Bytes of weights a bank entry holds: packed codes and scales, and the folded weights kept BF16."""
    seen: set[int] = set()
    total = 0
    for module in modules.values():
        for t in [*module.parameters(), *module.buffers()]:
            if id(t) in seen or t.stride() and 0 in t.stride():  # a placeholder costs nothing
                continue
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total
