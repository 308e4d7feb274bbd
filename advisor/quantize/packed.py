"""Bank entries at their own width: folded FP8 and NVFP4 weights kept as codes, decoded per module as it runs.

A folded weight (ModelOpt's ``fold_weight``: the fake quantizer applied once, the result stored in
BF16) holds only values its format can express, so it is stored as what produces them:

* FP8 (per-tensor): one ``float8_e4m3fn`` code per weight (the code ModelOpt's fake quantizer
  gives the folded value again, :func:`advisor.quantize.fp8_cpu.fp8_codes`) and, per weight view,
  the BF16 value of each of the 256 codes, read from the folded weight itself (the value most of
  the code's elements hold);
* NVFP4: two E2M1 codes a byte (sign and magnitude index), one FP8 block-scale code per 16
  weights and a float32 global scale per view, decoded with the arithmetic of ModelOpt's kernel
  (:mod:`advisor.quantize.nvfp4_cpu`).

Each packed tensor is decoded at pack time and compared bit for bit with the folded one. On a GPU, ModelOpt's
kernel rounds a few elements otherwise than this arithmetic (on an H100, 25 of a 14B's 336 weights had such
elements, none on the CPU). An NVFP4 block that decodes otherwise takes the neighbouring block-scale code where
that one decodes it; the values still left are held beside the codes (the entry's patch, :func:`pack_exact`),
and a weight with more than one such value in :data:`PATCH_LIMIT` stays BF16 (:attr:`PackStats.kept_bf16`), so
a trial's arithmetic is the folded bank's exactly. A fused-experts weight is packed and decoded a few experts
at a time (:data:`~advisor.models.memory_plan.PACK_CHUNK_WEIGHTS`), as the memory plan counts. A packed
module's weight is a zero-stride placeholder of the right shape between forwards; a forward pre-hook puts the
decoded weight in place and a forward hook drops it, so one module's BF16 weight exists at a time. A view is a
linear's weight, or one expert's slice of a transformers fused-experts weight (one quantizer per expert).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from advisor.formats import Format
from advisor.models.memory_plan import PACK_CHUNK_WEIGHTS
from advisor.quantize.fp8_cpu import fp8_codes
from advisor.quantize.nvfp4_cpu import (
    block_scale_codes,
    e2m1_round_magnitude,
    global_scale,
    scales_from_codes,
)

_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_BLOCK = 16
#: a weight whose codes give more than one in this many of its folded values otherwise stays BF16
PATCH_LIMIT = 1000
_INT_OF_WIDTH = {2: torch.int16, 4: torch.int32}


@dataclass
class PackStats:
    packed: int = 0  # weight tensors held as codes
    patched: int = 0  # folded values that decode otherwise from their codes, held beside them
    kept_bf16: list[str] = field(default_factory=list)  # folded weights left BF16: "name (format: why)"


def _view_slices(views: int, per_view: int) -> list[slice]:
    """Consecutive views, about :data:`PACK_CHUNK_WEIGHTS` weights at a time (one view at least): packing and
    decoding a fused-experts weight never holds float32 or index copies of all its experts at once."""
    step = max(1, PACK_CHUNK_WEIGHTS // max(per_view, 1))
    return [slice(a, min(a + step, views)) for a in range(0, views, step)]


class _Packed(torch.nn.Module):
    """Codes that decode to the folded weight, and the few folded values they do not give (the patch): a GPU's
    fake-quantizer kernel can round an element otherwise than the codes' arithmetic does."""

    def _init_patch(self, dtype: torch.dtype, device: torch.device) -> None:
        self.register_buffer("patch_index", torch.empty(0, dtype=torch.int64, device=device))
        self.register_buffer("patch_values", torch.empty(0, dtype=dtype, device=device))

    def patch(self, index: torch.Tensor, values: torch.Tensor) -> None:
        self.patch_index, self.patch_values = index, values

    def _patched(self, out: torch.Tensor) -> torch.Tensor:
        if self.patch_index.numel():
            out.view(-1)[self.patch_index] = self.patch_values
        return out


class PackedFP8(_Packed):
    """FP8 codes ``[..., out, in]`` and a ``[views, 256]`` BF16 table per view (views: 1, or the experts)."""

    def __init__(self, codes: torch.Tensor, table: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("codes", codes)
        self.register_buffer("table", table)
        self._init_patch(table.dtype, table.device)

    def decode(self) -> torch.Tensor:
        views = self.table.shape[0]
        codes = self.codes.view(torch.uint8).reshape(views, -1)
        out = torch.empty(codes.shape, dtype=self.table.dtype, device=codes.device)
        for s in _view_slices(views, codes.shape[1]):  # each expert's codes index its own 256 values
            index = codes[s].to(torch.int32)
            index += (torch.arange(s.start, s.stop, dtype=torch.int32, device=index.device) * 256).view(-1, 1)
            out[s] = self.table.reshape(-1).index_select(0, index.reshape(-1)).view(index.shape)
        return self._patched(out.view(self.codes.shape))


class PackedNVFP4(_Packed):
    """E2M1 codes two a byte (low nibble first; bit 3 the sign), FP8 block-scale codes, a global scale per view."""

    def __init__(self, nibbles: torch.Tensor, scale_codes: torch.Tensor, global_scales: torch.Tensor,
                 shape: torch.Size, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("nibbles", nibbles)
        self.register_buffer("scale_codes", scale_codes)
        self.register_buffer("global_scales", global_scales)
        self.shape = shape
        self.dtype = dtype
        self._init_patch(dtype, nibbles.device)

    def decode(self) -> torch.Tensor:
        views = self.global_scales.numel()
        nibbles = self.nibbles.reshape(views, -1)
        out = torch.empty(views, nibbles.shape[1] * 2, dtype=self.dtype, device=nibbles.device)
        for s in _view_slices(views, out.shape[1]):
            n = s.stop - s.start
            codes = torch.stack((nibbles[s] & 0xF, nibbles[s] >> 4), dim=-1).reshape(n, -1, _BLOCK)
            scale = scales_from_codes(self.scale_codes[s], self.global_scales.reshape(-1)[s].view(-1, 1))
            out[s] = _decode_blocks(codes, scale, self.dtype).reshape(n, -1)
        return self._patched(out.reshape(self.shape))


def _decode_blocks(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """E2M1 codes ``[n, blocks, 16]`` times their blocks' float32 scales ``[n, blocks]``, in ``dtype``."""
    q = torch.tensor(_E2M1_VALUES, device=codes.device)[(codes & 7).long()].mul_(scale.unsqueeze(-1))
    return torch.where(codes >= 8, -q, q).to(dtype)


def _e2m1_codes(blocks: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The E2M1 codes (bit 3 the sign) of folded ``blocks`` ``[n, blocks, 16]`` under float32 scales ``[n, blocks]``."""
    magnitude = e2m1_round_magnitude(blocks.float().abs() / scale.unsqueeze(-1))
    index = torch.bucketize(magnitude, torch.tensor(_E2M1_VALUES, device=blocks.device)).to(torch.uint8)
    return index | (torch.signbit(blocks).to(torch.uint8) << 3)


def _views(weight: torch.Tensor) -> torch.Tensor:
    return weight if weight.dim() == 3 else weight.unsqueeze(0)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The values' bits as integers of their width (BF16, or float32 where a CPU computes in it)."""
    return t.view(_INT_OF_WIDTH[t.element_size()])


def _most_common_values(codes: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``[views, 256]``: for each view and code, the folded value most of its elements hold (the larger bits on a
    tie; 0 for a code no element has), so a value a kernel rounded otherwise is the one patched. Counted about
    :data:`PACK_CHUNK_WEIGHTS` elements at a time (a dense linear's view can be larger)."""
    views, per_view = codes.shape
    width = 8 * values.element_size()
    mask = (1 << width) - 1
    slots = codes.view(torch.uint8).long() + torch.arange(views, device=codes.device).view(-1, 1) * 256
    bits = _bits(values)
    step = max(1, PACK_CHUNK_WEIGHTS // views)
    found = [torch.unique((slots[:, c:c + step] << 32) | (bits[:, c:c + step].long() & mask), return_counts=True)
             for c in range(0, per_view, step)]
    pairs, counts = torch.cat([p for p, _ in found]), torch.cat([n for _, n in found])
    if len(found) > 1:
        pairs, inverse = torch.unique(pairs, return_inverse=True)
        counts = torch.zeros_like(pairs).scatter_add_(0, inverse, counts)
    best = torch.zeros(views * 256, dtype=torch.long, device=codes.device).scatter_reduce(
        0, pairs >> 32, (counts << 32) | (pairs & mask), "amax") & mask
    signed = torch.where(best >= 1 << (width - 1), best - (1 << width), best)
    return signed.to(_INT_OF_WIDTH[values.element_size()]).view(values.dtype).view(views, 256)


def _pack_fp8(folded: torch.Tensor, amaxes: list[torch.Tensor]) -> PackedFP8:
    flat = _views(folded).reshape(len(amaxes), -1)
    codes = torch.empty(flat.shape, dtype=torch.float8_e4m3fn, device=folded.device)
    table = torch.zeros(len(amaxes), 256, dtype=folded.dtype, device=folded.device)
    for s in _view_slices(*flat.shape):
        for v in range(s.start, s.stop):
            codes[v] = fp8_codes(flat[v], amaxes[v])
        table[s] = _most_common_values(codes[s], flat[s])
    return PackedFP8(codes.reshape(folded.shape), table)


def _pack_nvfp4(original: torch.Tensor, folded: torch.Tensor, amaxes: list[torch.Tensor]) -> PackedNVFP4:
    """Block scales from the weight before folding (as the fake quantizer computed them), magnitudes and signs
    from the folded values."""
    originals, folds = _views(original), _views(folded)
    gs = torch.stack([global_scale(a).to(folded.device) for a in amaxes])
    nibbles, scale_codes = [], []
    for s in _view_slices(folds.shape[0], folds[0].numel()):
        n = s.stop - s.start
        block_amax = originals[s].float().reshape(n, -1, _BLOCK).abs().amax(dim=-1)
        view_gs = gs[s].view(-1, 1)  # one global scale per view, broadcast over its blocks
        scale_codes.append(block_scale_codes(block_amax, view_gs))
        codes = _e2m1_codes(folds[s].reshape(n, -1, _BLOCK), scales_from_codes(scale_codes[-1], view_gs))
        pairs = codes.reshape(n, -1, 2)
        nibbles.append(pairs[..., 0] | (pairs[..., 1] << 4))
    return PackedNVFP4(torch.cat(nibbles).reshape(*folded.shape[:-1], -1), torch.cat(scale_codes), gs,
                       folded.shape, folded.dtype)


def pack_exact(fmt: Format, rounded: torch.Tensor | None, folded: torch.Tensor,
               amaxes: list[torch.Tensor]) -> tuple[_Packed | None, int]:
    """``folded`` as ``fmt``'s codes that decode to it bit for bit, and how many of its values the codes give
    otherwise (held in the entry's patch); None where more than one in :data:`PATCH_LIMIT` would be."""
    entry = _pack_fp8(folded, amaxes) if fmt == Format.FP8 else _pack_nvfp4(rounded, folded, amaxes)
    wrong = _wrong_positions(entry, folded)
    if wrong.numel() and isinstance(entry, PackedNVFP4):
        _refit_block_scales(entry, folded, wrong.div(_BLOCK, rounding_mode="floor").unique())
        wrong = _wrong_positions(entry, folded)
    if wrong.numel() * PATCH_LIMIT > folded.numel():
        return None, wrong.numel()
    if wrong.numel():
        entry.patch(wrong, folded.reshape(-1)[wrong].clone())
    return entry, wrong.numel()


def _wrong_positions(entry: _Packed, folded: torch.Tensor) -> torch.Tensor:
    return (_bits(entry.decode()) != _bits(folded)).reshape(-1).nonzero().squeeze(1)


def _refit_block_scales(entry: PackedNVFP4, folded: torch.Tensor, blocks: torch.Tensor) -> None:
    """Give each of ``blocks`` (indices over the weight's blocks of 16) the neighbouring FP8 scale code, and the
    E2M1 codes under it, where that one decodes the block bit for bit. ModelOpt's Triton kernel divides block amax
    by 6 x the global scale approximately, so a quotient on an FP8 rounding midpoint can take the neighbouring
    code (inferred: on an H100, 4 of a 1B's 220 NVFP4 weights had 0.9-1.0% of their values off; with this
    search, none: reports/benchmarks/large_models.md)."""
    values = folded.reshape(-1, _BLOCK)[blocks].unsqueeze(1)  # [k, 1, 16]
    scale_bits = entry.scale_codes.view(torch.uint8).view(-1)
    view_gs = entry.global_scales.reshape(-1)[blocks // (scale_bits.numel() // entry.global_scales.numel())]
    nibbles = entry.nibbles.view(-1, _BLOCK // 2)
    fitted = torch.zeros(len(blocks), dtype=torch.bool, device=blocks.device)
    for step in (1, -1):
        other = (scale_bits[blocks].int() + step).clamp_(0, 0x7E).to(torch.uint8)
        scale = scales_from_codes(other.view(torch.float8_e4m3fn), view_gs).view(-1, 1)
        codes = _e2m1_codes(values, scale)
        take = ~fitted & (_bits(_decode_blocks(codes, scale, folded.dtype)) == _bits(values)).all(dim=-1).view(-1)
        scale_bits[blocks[take]] = other[take]
        pairs = codes[take].reshape(-1, _BLOCK // 2, 2)
        nibbles[blocks[take]] = pairs[..., 0] | (pairs[..., 1] << 4)
        fitted |= take


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


@dataclass
class Folded:
    """One weight of a module after folding: the folded values, the weight before folding where NVFP4's block
    scales are read from it, and its quantizers' per-tensor amax (one per view; None where there is none)."""

    folded: torch.Tensor
    rounded: torch.Tensor | None
    amaxes: list[torch.Tensor | None]


@torch.no_grad()
def fold_weights(module: torch.nn.Module, fmt: Format) -> dict[str, Folded]:
    """Give ``module`` (calibrated for ``fmt``, its weights shared with the BF16 model) its own folded weights,
    rounded as the export will (ModelOpt's ``fold_weight`` disables its weight quantizers)."""
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
    return {w: Folded(module._parameters[w].detach(), rounded.get(w), amax) for w, amax in amaxes.items()}


@torch.no_grad()
def pack_folded(fmt: Format, name: str, weights: dict[str, Folded]) -> dict[str, _Packed | str]:
    """Each folded weight of module ``name`` as ``fmt``'s codes that decode to it bit for bit, or why it stays
    BF16 (``"name.weight (format: why)"``)."""
    out: dict[str, _Packed | str] = {}
    for w, f in weights.items():
        folded = f.folded
        if fmt not in (Format.FP8, Format.NVFP4) or any(a is None for a in f.amaxes):
            out[w] = f"{name}.{w} ({fmt.value}: no per-tensor scale)"
        elif folded.element_size() not in _INT_OF_WIDTH:  # the codes' checks compare the values' bits
            out[w] = f"{name}.{w} ({fmt.value}: {folded.dtype} weights)"
        elif fmt == Format.NVFP4 and folded.shape[-1] % _BLOCK:
            out[w] = f"{name}.{w} ({fmt.value}: rows not in blocks of {_BLOCK})"
        else:
            entry, wrong = pack_exact(fmt, f.rounded, folded, f.amaxes)
            out[w] = entry if entry is not None else (
                f"{name}.{w} ({fmt.value}: {wrong} of {folded.numel()} values decode otherwise)")
    return out


def drop_packed_weights(module: torch.nn.Module, packed: dict[str, _Packed | str]) -> None:
    """Replace each weight held as codes by a placeholder (its folded values are freed)."""
    for w, entry in packed.items():
        if not isinstance(entry, str):
            module._parameters[w] = _placeholder(module._parameters[w])


def install_packed(module: torch.nn.Module, packed: dict[str, _Packed | str], stats: PackStats,
                   decode_hooks: bool = True) -> None:
    """Hold ``module``'s packed weights as codes (the others stay its folded BF16 weights), counted in ``stats``.
    ``decode_hooks``: register the forward hooks that decode them (else the caller does,
    :mod:`advisor.quantize.streamed`)."""
    drop_packed_weights(module, packed)
    entries = torch.nn.ModuleDict()
    for w, entry in packed.items():
        if isinstance(entry, str):
            stats.kept_bf16.append(entry)
            continue
        entries[w] = entry
        stats.patched += entry.patch_index.numel()
        stats.packed += 1
    if len(entries):
        module.packed_weights = entries
        if decode_hooks:
            module.register_forward_pre_hook(_materialize)
            module.register_forward_hook(_release)


@torch.no_grad()
def fold_and_pack(module: torch.nn.Module, fmt: Format, name: str, stats: PackStats,
                  decode_hooks: bool = True) -> None:
    """Fold ``module``'s weights (:func:`fold_weights`) and hold them as ``fmt``'s codes where they decode
    exactly (:func:`pack_folded`, :func:`install_packed`)."""
    install_packed(module, pack_folded(fmt, name, fold_weights(module, fmt)), stats, decode_hooks)


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
