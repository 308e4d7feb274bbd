"""A format's bank entry built by the ranks of a node together: each rank packs every ``world``-th module, then
each module's packed weights travel from the rank that packed them to the others, bit for bit.

Every rank folds every module (ModelOpt's ``fold_weight``: it leaves the module's quantizers as a trial needs
them, and costs one fake quantization of the weight); only the module's owner packs it (codes, the block scales'
refit, the bit-for-bit check: most of the bank's time). A rank drops the folded values of a module it does not
own at once, so it never holds more than one module's folded weights beyond what one process holds. Then, module
by module in the bank's order, the owner's outcome is broadcast: the packed entry's buffers, or the folded BF16
weight of one that stays BF16, and every rank installs it as one process would (the same statistics, in the
same order). A module that streams from CPU memory is packed by every rank itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from advisor.formats import Format
from advisor.models.replicas import Ranks
from advisor.quantize.packed import (
    PackedFP8,
    PackedNVFP4,
    PackStats,
    _Packed,
    _placeholder,
    drop_packed_weights,
    fold_weights,
    install_packed,
    pack_folded,
)
from advisor.quantize.streamed import fold_and_pack_streamed, offload_hook

Outcome = dict[str, "_Packed | str"]


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


def _describe(entry: _Packed | str, weight: torch.Tensor) -> dict[str, Any]:
    """What a rank needs to receive an outcome: its kind, and its tensors' shapes and dtypes in broadcast order."""
    if isinstance(entry, str):
        return {"kind": "bf16", "why": entry, "buffers": [("weight", tuple(weight.shape), str(weight.dtype))]}
    described: dict[str, Any] = {"kind": "fp8" if isinstance(entry, PackedFP8) else "nvfp4",
                                 "buffers": [(n, tuple(b.shape), str(b.dtype)) for n, b in entry.named_buffers()]}
    if isinstance(entry, PackedNVFP4):
        described |= {"shape": tuple(entry.shape), "dtype": str(entry.dtype)}
    return described


def _empty(described: dict[str, Any], device: torch.device) -> _Packed:
    """An entry of the described kind whose buffers are allocated, to be filled by the broadcasts."""
    bufs = {n: torch.empty(shape, dtype=_dtype(dtype), device=device) for n, shape, dtype in described["buffers"]}
    if described["kind"] == "fp8":
        entry: _Packed = PackedFP8(bufs["codes"], bufs["table"])
    else:
        entry = PackedNVFP4(bufs["nibbles"], bufs["scale_codes"], bufs["global_scales"],
                            torch.Size(described["shape"]), _dtype(described["dtype"]))
    entry.patch(bufs["patch_index"], bufs["patch_values"])
    return entry


def _received(module: torch.nn.Module, weight: str, described: dict[str, Any], src: int, ranks: Ranks,
              device: torch.device) -> _Packed | str:
    """The owner's outcome for ``weight``: a packed entry, or (its folded weight put in place) why it stays BF16."""
    if described["kind"] == "bf16":
        (_, shape, dtype), = described["buffers"]
        folded = ranks.broadcast_(torch.empty(shape, dtype=_dtype(dtype), device=device), src)
        module._parameters[weight] = torch.nn.Parameter(folded, requires_grad=False)
        return described["why"]
    entry = _empty(described, device)
    for _, buffer in entry.named_buffers():
        ranks.broadcast_(buffer, src)
    return entry


def _sent(module: torch.nn.Module, weight: str, entry: _Packed | str, ranks: Ranks) -> None:
    tensors = [module._parameters[weight].detach()] if isinstance(entry, str) else [b for _, b in entry.named_buffers()]
    for t in tensors:
        ranks.broadcast_(t, ranks.rank)


@torch.no_grad()
def fold_and_pack_spread(root: torch.nn.Module, names: Sequence[str], fmt: Format, stats: PackStats,
                         ranks: Ranks) -> None:
    """:func:`advisor.quantize.packed.fold_and_pack` of every module ``names`` of ``root`` (calibrated for
    ``fmt``), the packing shared among ``ranks``; ``stats`` ends as one process's."""
    own: dict[int, Outcome] = {}
    streamed: dict[int, PackStats] = {}
    with ranks.busy("bank"):
        for i, name in enumerate(names):
            module = root.get_submodule(name)
            if offload_hook(module) is not None:  # streams from CPU memory: every rank packs it
                streamed[i] = PackStats()
                fold_and_pack_streamed(module, fmt, name, streamed[i], root)
                continue
            folded = fold_weights(module, fmt)
            if ranks.owner(i) == ranks.rank:
                own[i] = pack_folded(fmt, name, folded)
                drop_packed_weights(module, own[i])
            else:  # the owner's outcome arrives below
                for w in folded:
                    module._parameters[w] = _placeholder(module._parameters[w])
            del folded
    described = ranks.merged({i: {w: _describe(e, root.get_submodule(names[i])._parameters[w])
                                  for w, e in outcome.items()} for i, outcome in own.items()})
    for i, name in enumerate(names):
        if i in streamed:
            _merge(stats, streamed[i])
            continue
        module = root.get_submodule(name)
        src = ranks.owner(i)
        if src == ranks.rank:
            for w, entry in own[i].items():
                _sent(module, w, entry, ranks)
            outcome = own[i]
        else:
            outcome = {w: _received(module, w, d, src, ranks, module._parameters[w].device)
                       for w, d in described[i].items()}
        install_packed(module, outcome, stats)


def _merge(stats: PackStats, more: PackStats) -> None:
    stats.packed += more.packed
    stats.patched += more.patched
    stats.kept_bf16 += more.kept_bf16
