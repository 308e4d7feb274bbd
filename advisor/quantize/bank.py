"""Calibrate once per format; assemble any plan from the calibrated layers (no trial re-calibrates).

:class:`FormatBank` calibrates the whole model once per format (a copy that shares
the BF16 weight tensors) and assembles any plan by pointing each layer at the
calibrated ModelOpt ``QuantLinear`` of its format (for a layer's fused MoE experts, the
one ``_QuantFusedExperts`` module that holds gate/up and down: one group, so one format).
This is the scheme of ModelOpt's AutoQuantize (``algorithms.py``: every candidate format is
calibrated per module once, then formats switch per module). It is exact, not an approximation: ModelOpt's max
calibration collects ranges with quantization switched off, so a layer's calibrated
range does not depend on the formats of the layers before it (tests/test_quantize.py
checks mixed plans against :func:`quantize_plan`).

An FP8 KV cache is one more calibration: the working model itself is quantized with only the
KV-cache quantizers on (the k/v BMM quantizers of every attention, ``FP8_KV_CFG``), and a plan
switches them on or off. Their ranges are BF16 keys and values for the same reason as above.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from advisor.errors import SetupError
from advisor.formats import Format
from advisor.models.replicas import Ranks
from advisor.plan import LayerGroup, Plan
from advisor.quantize.bank_ranks import fold_and_pack_spread
from advisor.quantize.export_rounding import round_fp8_weights_as_exported
from advisor.quantize.modelopt_config import (
    KV_QUANTIZERS,
    ForwardLoop,
    attention_modules,
    modelopt_quantization,
    plan_group_table,
    quantize_plan,
)
from advisor.quantize.packed import PackStats, bank_bytes, fold_and_pack
from advisor.quantize.streamed import fold_and_pack_streamed, offload_hook, shared_offload_maps


def _share_weights_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy whose parameters are the original tensors, and whose streamed layers read the same CPU
    weights (no extra weight memory)."""
    memo: dict[int, Any] = {id(p): p for p in model.parameters()}
    memo.update(shared_offload_maps(model))
    return copy.deepcopy(model, memo)


class FormatBank:
    """Per-format calibrated copies of a model, and a working model assembled per plan.

    ``fold_weights=True`` gives each format copy its own weights, rounds its FP8 weights as
    the exported checkpoint will (:mod:`advisor.quantize.export_rounding`: a trial scores the
    served weights) and folds the fake-quantized weights into them once (ModelOpt's
    ``mtq.fold_weight``), so a trial only quantizes activations. With ``packed`` (the default)
    the folded weights are held at their format's width (:mod:`advisor.quantize.packed`: FP8
    codes, NVFP4 codes and block scales), folded module by module and decoded as each module
    runs, with the same values; without it, as BF16 (one model's worth of weights per format).
    ``fold_weights=False`` shares the BF16 weight tensors and re-quantizes weights in every
    forward (with the fake quantizer's rounding). ``ranks`` spread over a node: each rank calibrates on its
    share of the batches (``forward_loop``'s) and the ranges are combined, and each packs its share of the
    modules (:mod:`advisor.quantize.bank_ranks`); every rank ends with the whole bank, one process's bit for bit.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        groups: Iterable[LayerGroup],
        formats: Iterable[Format],
        forward_loop: ForwardLoop,
        on_format: Callable[[Format], None] | None = None,
        fold_weights: bool = True,
        kv_cache: Iterable[Format] = (Format.BF16,),
        packed: bool = True,
        ranks: Ranks | None = None,
    ) -> None:
        ranks = ranks or Ranks()
        self.groups = tuple(groups)
        self.formats = tuple(formats)
        self.kv_cache = tuple(kv_cache)
        self.calibrations = 0
        self.pack_stats = PackStats()
        self.seconds = {"calibration": 0.0}  # ModelOpt's calibration passes (the rest: copies, folding, packing)
        self._modules: dict[Format, dict[str, torch.nn.Module]] = {}
        infos = plan_group_table(model, Plan.uniform(self.groups, Format.BF16), self.groups)
        self._units = {gi.name: gi.modules for gi in infos}  # what is swapped per group
        swapped = [m for units in self._units.values() for m in units]
        self._modules[Format.BF16] = {m: model.get_submodule(m) for m in swapped}
        for fmt in self.formats:
            if fmt == Format.BF16:
                continue
            if on_format:
                on_format(fmt)
            own = fold_weights and not packed  # a whole copy of the weights, else module by module
            copy_ = copy.deepcopy(model) if own else _share_weights_copy(model)
            t = time.perf_counter()
            with ranks.busy("calibration"):
                calibrated = quantize_plan(copy_, Plan.uniform(self.groups, fmt), self.groups, forward_loop, ranks)
            self.seconds["calibration"] += time.perf_counter() - t
            if fold_weights and packed and ranks.spread:  # each rank packs its share of the modules
                fold_and_pack_spread(calibrated, swapped, fmt, self.pack_stats, ranks)
            elif own:  # round FP8 weights as the export will, then fold
                round_fp8_weights_as_exported(calibrated)
                modelopt_quantization().fold_weight(calibrated)
            elif fold_weights:
                for m in swapped:
                    module = calibrated.get_submodule(m)
                    if offload_hook(module) is not None:  # a layer that streams from CPU memory
                        fold_and_pack_streamed(module, fmt, m, self.pack_stats, calibrated)
                    else:
                        fold_and_pack(module, fmt, m, self.pack_stats)
            self.calibrations += 1
            self._modules[fmt] = {m: calibrated.get_submodule(m) for m in swapped}
        self.model = _share_weights_copy(model)
        self._kv_quantizers: list[torch.nn.Module] = []
        if Format.FP8 in self.kv_cache:
            if on_format:
                on_format(Format.FP8)
            kv_plan = Plan.uniform(self.groups, Format.BF16, kv_cache=Format.FP8)
            t = time.perf_counter()
            with ranks.busy("calibration"):
                self.model = quantize_plan(self.model, kv_plan, self.groups, forward_loop, ranks)
            self.seconds["calibration"] += time.perf_counter() - t
            self.calibrations += 1
            for m in swapped:  # the BF16 modules themselves, as in a bank without a KV cache
                self.model.set_submodule(m, self._modules[Format.BF16][m])
            self._kv_quantizers = [self.model.get_submodule(f"{a}.{q}")
                                   for a in attention_modules(infos) for q in KV_QUANTIZERS]
        self._kv_on = bool(self._kv_quantizers)
        self._set_kv_cache(Format.BF16)
        self._current: dict[str, Format] = {m: Format.BF16 for m in swapped}

    def _set_kv_cache(self, fmt: Format) -> None:
        on = fmt == Format.FP8
        if on == self._kv_on:
            return
        if on and not self._kv_quantizers:
            raise SetupError("an FP8 KV cache was not calibrated in this bank (give kv_cache=[bf16, fp8])")
        for q in self._kv_quantizers:
            if on:
                q.enable()
            else:
                q.disable()
        self._kv_on = on

    def assemble(self, plan: Plan) -> torch.nn.Module:
        """Point every layer of the working model at its plan format's module; no calibration."""
        plan.check_against(self.groups)
        for g in self.groups:
            fmt = plan.format_of(g.name)
            if fmt not in self._modules:
                raise SetupError(f"format {fmt.value} was not calibrated in this bank")
            for module in self._units[g.name]:
                if self._current[module] != fmt:
                    self.model.set_submodule(module, self._modules[fmt][module])
                    self._current[module] = fmt
        self._set_kv_cache(plan.kv_cache)
        return self.model

    def entry_bytes(self, fmt: Format) -> int:
        """Bytes of weights (and codes, scales, quantizer state) ``fmt``'s calibrated modules hold."""
        return bank_bytes(self._modules[fmt])

    def module_for(self, module: str, fmt: Format) -> torch.nn.Module:
        """The calibrated module of ``fmt`` at ``module`` (a member, or a fused-experts module)."""
        return self._modules[fmt][module]
