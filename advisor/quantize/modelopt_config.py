"""Apply plans with NVIDIA ModelOpt.

Two ways, one set of quantizer settings (:func:`format_quantizer_cfg`):

* :func:`quantize_plan` runs ``mtq.quantize`` once with a per-group config built
  from the plan (BF16 groups disabled). Used for export and for checks.
* :class:`FormatBank` calibrates the whole model once per format (a copy that shares
  the BF16 weight tensors) and assembles any plan by pointing each layer at the
  calibrated ModelOpt ``QuantLinear`` of its format. A trial never re-calibrates.
  This is the scheme of ModelOpt's AutoQuantize (``algorithms.py``: every candidate
  format is calibrated per module once, then formats switch per module). It is
  exact, not an approximation: ModelOpt's max calibration collects ranges with
  quantization switched off, so a layer's calibrated range does not depend on the
  formats of the layers before it (tests/test_quantize.py checks mixed plans
  against :func:`quantize_plan`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import sys
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

from advisor.errors import SetupError
from advisor.formats import Format
from advisor.plan import LayerGroup, Plan

log = logging.getLogger(__name__)

ForwardLoop = Callable[[torch.nn.Module], None]


def _mtq() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import modelopt.torch.quantization as mtq
        except ImportError as exc:
            raise SetupError(f"nvidia-modelopt is not importable ({exc}); pip install nvidia-modelopt") from None
    return mtq


def prepare_device(device: torch.device | str) -> None:
    """On CPU, give ModelOpt the NVFP4 kernel it lacks there (see nvfp4_cpu)."""
    if torch.device(device).type == "cpu":
        from advisor.quantize.nvfp4_cpu import register_cpu_kernel

        register_cpu_kernel()


def _preset(fmt: Format) -> dict[str, Any]:
    mtq = _mtq()
    return {Format.FP8: mtq.FP8_DEFAULT_CFG, Format.NVFP4: mtq.NVFP4_DEFAULT_CFG}[fmt]


def format_quantizer_cfg(fmt: Format) -> dict[str, dict[str, Any]]:
    """The weight and input quantizer attributes of ModelOpt's default preset for ``fmt``."""
    found: dict[str, dict[str, Any]] = {}
    for entry in _preset(fmt)["quant_cfg"]:
        name = entry.get("quantizer_name")
        if name in ("*weight_quantizer", "*input_quantizer") and "cfg" in entry:
            found[name.lstrip("*")] = copy.deepcopy(entry["cfg"])
    if set(found) != {"weight_quantizer", "input_quantizer"}:
        raise SetupError(f"unexpected ModelOpt {fmt.value} preset layout; this nvidia-modelopt is not supported")
    return found


def plan_quant_config(plan: Plan, groups: Iterable[LayerGroup]) -> dict[str, Any]:
    """A ModelOpt config that quantizes each group's members in the plan's format.

    Everything starts disabled (so lm_head, embeddings, attention BMMs and BF16 groups
    stay BF16), then each quantized member gets its format's weight and input quantizer.
    """
    entries: list[dict[str, Any]] = [{"quantizer_name": "*", "enable": False}]
    cfgs = {f: format_quantizer_cfg(f) for f in set(plan.formats.values()) if f != Format.BF16}
    for g in groups:
        fmt = plan.format_of(g.name)
        if fmt == Format.BF16:
            continue
        for member in g.members:
            for qname, qcfg in cfgs[fmt].items():
                entries.append({"quantizer_name": f"{member}.{qname}", "cfg": copy.deepcopy(qcfg)})
    return {"quant_cfg": entries, "algorithm": "max"}


def tie_fused_nvfp4_scales(model: torch.nn.Module, plan: Plan, groups: Iterable[LayerGroup]) -> None:
    """Give the members of a fused NVFP4 group one global weight scale (the largest amax).

    A serving engine runs q/k/v (and gate/up) as one GEMM with one NVFP4 second-level
    weight scale; ModelOpt's export writes the shared ``weight_scale_2`` the same way.
    Scoring with the shared scale makes the searched model the deployed one.
    """
    with torch.no_grad():
        for g in groups:
            if plan.format_of(g.name) != Format.NVFP4 or len(g.members) < 2:
                continue
            quantizers = [model.get_submodule(m).weight_quantizer for m in g.members]
            amaxes = [q.amax for q in quantizers if getattr(q, "amax", None) is not None]
            if len(amaxes) != len(quantizers):
                continue
            shared = torch.stack([a.float().reshape(()) for a in amaxes]).max()
            for q in quantizers:
                q.amax = shared.to(q.amax.dtype).reshape(q.amax.shape).clone()


def quantize_plan(model: torch.nn.Module, plan: Plan, groups: Iterable[LayerGroup], forward_loop: ForwardLoop):
    """Quantize ``model`` in place with ModelOpt for ``plan`` (calibrates once) and return it."""
    groups = tuple(groups)
    plan.check_against(groups)
    prepare_device(next(model.parameters()).device)
    mtq = _mtq()
    # ModelOpt prints progress to stdout; stdout is for results only.
    with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
        warnings.simplefilter("ignore")
        model = mtq.quantize(model, plan_quant_config(plan, groups), forward_loop)
    tie_fused_nvfp4_scales(model, plan, groups)
    return model


def _share_weights_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy whose parameters are the original tensors (no extra weight memory)."""
    memo: dict[int, Any] = {id(p): p for p in model.parameters()}
    return copy.deepcopy(model, memo)


class FormatBank:
    """Per-format calibrated copies of a model, and a working model assembled per plan.

    ``fold_weights=True`` gives each format copy its own weights and folds the
    fake-quantized weights into them once (ModelOpt's ``mtq.fold_weight``), so a trial
    only quantizes activations: faster, at one extra model's weight memory per format.
    ``False`` shares the BF16 weight tensors and re-quantizes weights in every forward.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        groups: Iterable[LayerGroup],
        formats: Iterable[Format],
        forward_loop: ForwardLoop,
        on_format: Callable[[Format], None] | None = None,
        fold_weights: bool = True,
    ) -> None:
        self.groups = tuple(groups)
        self.formats = tuple(formats)
        self.calibrations = 0
        self._modules: dict[Format, dict[str, torch.nn.Module]] = {}
        members = [m for g in self.groups for m in g.members]
        self._modules[Format.BF16] = {m: model.get_submodule(m) for m in members}
        for fmt in self.formats:
            if fmt == Format.BF16:
                continue
            if on_format:
                on_format(fmt)
            copy_ = copy.deepcopy(model) if fold_weights else _share_weights_copy(model)
            calibrated = quantize_plan(copy_, Plan.uniform(self.groups, fmt), self.groups, forward_loop)
            if fold_weights:
                _mtq().fold_weight(calibrated)
            self.calibrations += 1
            self._modules[fmt] = {m: calibrated.get_submodule(m) for m in members}
        self.model = _share_weights_copy(model)
        self._current: dict[str, Format] = {m: Format.BF16 for m in members}

    def assemble(self, plan: Plan) -> torch.nn.Module:
        """Point every layer of the working model at its plan format's module; no calibration."""
        plan.check_against(self.groups)
        for g in self.groups:
            fmt = plan.format_of(g.name)
            if fmt not in self._modules:
                raise SetupError(f"format {fmt.value} was not calibrated in this bank")
            for member in g.members:
                if self._current[member] != fmt:
                    self.model.set_submodule(member, self._modules[fmt][member])
                    self._current[member] = fmt
        return self.model

    def module_for(self, member: str, fmt: Format) -> torch.nn.Module:
        return self._modules[fmt][member]
