"""Export a plan as a deployable checkpoint, and reload it to check the round trip.

What :func:`advisor.workflows.export.export_run` writes into the output folder:

* a ModelOpt *unified Hugging Face checkpoint* of the plan (``model.safetensors``,
  ``config.json`` with ``quantization_config``, ``hf_quant_config.json``): the model is
  quantized by :func:`advisor.quantize.modelopt_config.quantize_plan` (real ModelOpt state, one
  calibration on the run's calibration tokens) and written by
  ``modelopt.torch.export.export_hf_checkpoint``. A plan that mixes FP8 and NVFP4 gives
  ``quant_algo: MIXED_PRECISION`` with per-layer ``quantized_layers``; a single-format
  plan gives that format with the plan's BF16 layers (and ``lm_head``) in
  ``exclude_modules``. An all-BF16 plan is a plain BF16 checkpoint.
* the tokenizer;
* ``llm_api_options.yaml``: TensorRT-LLM LLM-API options sized from the run's workloads;
* ``vllm_config.yaml``: the same for ``vllm serve --config``;
* ``README.md`` with the ``trtllm-serve`` command, the round-trip numbers, which engines can serve
  the plan (``advisor.serving``: TensorRT-LLM, vLLM, SGLang, with sources) and a warning per known problem;
* ``export.json``: the same facts for programs.

Round trip (:func:`advisor.deploy.checkpoint.load_exported`): the exported weights are
de-quantized by their checkpoint names, loaded by transformers into a model built from the
exported ``config.json`` (its conversion maps saved names back), and ModelOpt input
quantizers are inserted with the amax that the file's ``input_scale`` implies. The formats
come from ``hf_quant_config.json`` alone, not from the plan. Before that, the checkpoint is
checked against the plan: every layer's format, and the set of quantized weights (no
router, norm or vision weight has a scale). The reloaded model's proxy KL is compared with
the in-memory quantized model's.

Everything here runs where the loaded model is: the CPU for `advisor export` (NVFP4 fake quantization through
``advisor.quantize.nvfp4_cpu``; ModelOpt's NVFP4 weight packing in export is plain torch), the GPU where a search
or `advisor verify` holds the model there.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from advisor.deploy.checkpoint._quant_config import check_kv_cache, check_quant_config
from advisor.deploy.checkpoint._reader import load_exported, scaled_modules
from advisor.deploy.checkpoint._readme import ExportResult, render_readme
from advisor.deploy.checkpoint._trtllm_config import (
    deployment_warnings,
    llm_api_options,
    options_yaml,
    smoke_test_trtllm,
)
from advisor.deploy.checkpoint._vllm_config import vllm_options, vllm_options_yaml
from advisor.errors import InputError, SetupError
from advisor.models.adapters import GroupInfo
from advisor.plan import Plan
from advisor.quantize.quiet import quiet
from advisor.serving import compatibility_record, compatibility_warnings, engine_compatibility, plan_traits

log = logging.getLogger(__name__)

# Round-trip tolerance: |KL(reloaded) - KL(in-memory)| <= REL * KL(in-memory) + ABS (nats/token).
# FP8 weights are rounded in memory as ModelOpt's export rounds them (quantize.export_rounding:
# its ``to_quantized_weight`` and the fake quantizer disagree on ~2-3% of weights by one FP8
# step), so dense FP8 and NVFP4 weights round-trip bit for bit (``weights`` in the record counts
# any that differ). Not zero: fused MoE experts keep the fake quantizer's rounding, and the
# reloaded model's de-quantized weights pass through another load path.
ROUNDTRIP_KL_REL_TOL = 0.10
ROUNDTRIP_KL_ABS_TOL = 1e-4



# ---------------------------------------------------------------- export


def _member_weight(model: Any, member: str, layout: str) -> Any:
    """A member's weight tensor: a Linear's ``weight``, or a fused-experts 3-D parameter."""
    if layout == "fused_experts":
        owner, _, param = member.rpartition(".")
        return getattr(model.get_submodule(owner), param)
    return model.get_submodule(member).weight


def _fake_quant_weights(qmodel: Any, infos: list[GroupInfo]) -> dict[str, Any]:
    """Each quantized member's weight as its ModelOpt weight quantizer(s) see it (fake-quantized)."""
    import torch

    out = {}
    with torch.no_grad():
        for gi in infos:
            for m in gi.group.members:
                w = _member_weight(qmodel, m, gi.layout)
                if gi.layout == "fused_experts":  # one weight quantizer per expert
                    owner, _, param = m.rpartition(".")
                    quantizers = getattr(qmodel.get_submodule(owner), f"{param}_weight_quantizers")
                    if quantizers[0].is_enabled:
                        out[m] = torch.stack([q(w[e]) for e, q in enumerate(quantizers)]).detach().clone()
                    continue
                wq = getattr(qmodel.get_submodule(m), "weight_quantizer", None)
                if wq is not None and wq.is_enabled:
                    out[m] = wq(w).detach().clone()
    return out


def _compare_weights(fake: dict[str, Any], reloaded: Any, infos: list[GroupInfo]) -> dict[str, Any]:
    """How many reloaded weights differ from the in-memory fake-quantized ones, in BF16, the precision engines
    serve them in (scored in float32, the two differ in float32's last bit: codes x scale against ModelOpt's
    own fake-quantization arithmetic)."""
    import torch

    layouts = {m: gi.layout for gi in infos for m in gi.group.members}
    total = moved = 0
    worst = 0.0
    for m, w in fake.items():
        r = _member_weight(reloaded, m, layouts[m]).detach().to(torch.bfloat16)
        w = w.to(torch.bfloat16)
        d = (r.float() - w.float()).abs()
        total += d.numel()
        moved += int((d > 0).sum())
        worst = max(worst, float((d / w.float().abs().clamp_min(1e-12)).max()) if d.any() else 0.0)
    return {"quantized_weights": total, "differing": moved,
            "differing_pct": 100.0 * moved / total if total else 0.0, "max_rel_diff": worst}


def _tensor_names(out_dir: Path) -> list[str]:
    from safetensors import safe_open

    names: list[str] = []
    for f in sorted(out_dir.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            names += list(st.keys())
    return names


def fuse_like_export(qmodel: Any) -> None:
    """Give layers that engines fuse (same input: q/k/v, gate/up) shared weight and input scales,
    exactly as ``export_hf_checkpoint`` does before writing (ModelOpt's own function)."""
    from modelopt.torch.export.unified_export_hf import requantize_resmooth_fused_llm_layers

    with quiet():
        requantize_resmooth_fused_llm_layers(qmodel)


def write_checkpoint(qmodel: Any, tokenizer: Any, out_dir: Path) -> dict[str, Any] | None:
    """ModelOpt unified HF export of an already quantized model, plus the tokenizer.

    Returns the hf_quant_config (None for an unquantized model). Modifies ``qmodel``.
    """
    try:
        from modelopt.torch.export import export_hf_checkpoint
    except ImportError as exc:
        raise SetupError(f"modelopt.torch.export is not importable ({exc}); pip install nvidia-modelopt") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    with quiet():
        export_hf_checkpoint(qmodel, export_dir=out_dir)
    tokenizer.save_pretrained(out_dir)
    path = out_dir / "hf_quant_config.json"
    return json.loads(path.read_text()) if path.is_file() else None


def empty_tensors(module: Any) -> None:
    """Every parameter and buffer of ``module`` replaced by an empty tensor on the CPU. On a GPU the quantized copy
    outlives ``export_plan``: ModelOpt's ``mtq.quantize`` leaves ``quantize_plan``'s frame referenced after it
    returns (seen on an H100, 2026-11-27: the copy of a plan's model alive, held by that frame), and in ``advisor
    verify`` its weights held 15 GiB of the GPU the vLLM engines then started on."""
    import torch

    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            t.data = torch.empty(0, dtype=t.dtype)


def export_plan(
    loaded: Any,
    plan: Plan,
    tokens: Any,
    out_dir: Path,
    workloads: list[dict[str, Any]],
    target: str | None = None,
    stored_kl: float | None = None,
    rel_tol: float = ROUNDTRIP_KL_REL_TOL,
    abs_tol: float = ROUNDTRIP_KL_ABS_TOL,
    smoke: bool = True,
    extra_warnings: tuple[str, ...] = (),
    on_reloaded: Callable[[Any], None] | None = None,
) -> ExportResult:
    """Quantize ``loaded.model`` for ``plan``, export it, reload it and compare proxy KL (``on_reloaded`` sees the
    reloaded model too: `advisor verify` scores it there rather than read the export again).

    ``tokens`` is a :class:`advisor.calibration.tokens.TokenSets` (calibration for ModelOpt,
    held-out for the proxy). ``loaded.model`` stays as it is (a copy is quantized): BF16, or float32 where the
    search scored in float32 (:mod:`advisor.models.arithmetic`); the checkpoint keeps the model config's dtype
    either way (ModelOpt's default).
    """
    from advisor.accuracy.proxy import ProxyEvaluator
    from advisor.calibration.tokens import forward_loop
    from advisor.models.groups import group_table
    from advisor.quantize.export_rounding import round_fp8_weights_as_exported
    from advisor.quantize.modelopt_config import prepare_device, quantize_plan

    groups = loaded.shape.groups
    plan.check_against(groups)
    infos = group_table(loaded.model)
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise InputError(f"--out: {out_dir} exists and is not empty; give a new folder")
    timings: dict[str, float] = {}
    device = next(loaded.model.parameters()).device  # the CPU (advisor export), or a GPU where the model is there
    prepare_device(device)

    t = time.perf_counter()
    proxy = ProxyEvaluator(loaded.model, tokens.heldout)
    qmodel = copy.deepcopy(loaded.model)
    if not getattr(qmodel.config, "architectures", None):
        # GGUF loads leave it unset; ModelOpt's export and every serving engine need it.
        qmodel.config.architectures = [type(qmodel).__name__]
    with quiet():
        quantize_plan(qmodel, plan, groups, forward_loop(tokens.calibration))
    round_fp8_weights_as_exported(qmodel)  # as the trials scored them (FormatBank)
    planned = proxy.score(qmodel)
    # quantize_plan already gave fused layers (q/k/v, gate/up) one weight and one input
    # scale, as engines load them (tie_fused_scales). ModelOpt's own pre-export step runs
    # here too, so the in-memory model scored is exactly the one written.
    fuse_like_export(qmodel)
    mem = proxy.score(qmodel)
    fake_weights = _fake_quant_weights(qmodel, infos)
    timings["quantize_and_score_s"] = time.perf_counter() - t

    t = time.perf_counter()
    qcfg = write_checkpoint(qmodel, loaded.tokenizer, out_dir)
    empty_tensors(qmodel)
    del qmodel
    names = _tensor_names(out_dir)
    check_quant_config(qcfg, plan, infos, scaled_modules(names))
    check_kv_cache(qcfg, plan, infos, names)
    quant_algo = (qcfg or {}).get("quantization", {}).get("quant_algo")
    timings["export_s"] = time.perf_counter() - t

    t = time.perf_counter()
    reloaded = load_exported(out_dir, device=str(device), dtype=next(loaded.model.parameters()).dtype)  # as scored
    rt = proxy.score(reloaded)
    weights = _compare_weights(fake_weights, reloaded, infos)
    if on_reloaded is not None:
        on_reloaded(reloaded)
    timings["reload_and_score_s"] = time.perf_counter() - t
    diff = abs(rt.kl - mem.kl)
    tol = rel_tol * mem.kl + abs_tol
    roundtrip = {
        "kl_in_memory_plan": planned.kl, "kl_in_memory": mem.kl, "kl_reloaded": rt.kl,
        "kl_abs_diff": diff, "tolerance_kl": tol,
        "tolerance_rule": f"|diff| <= {rel_tol:g} * kl_in_memory + {abs_tol:g}", "weights": weights,
        "ppl_in_memory": mem.ppl, "ppl_reloaded": rt.ppl, "ppl_bf16": mem.ppl_bf16,
        "heldout_tokens": mem.tokens, "kl_stored_in_summary": stored_kl,
        "passed": diff <= tol,
        "ppl_in_memory_plan": planned.ppl,
        "method": "in-memory: quantize_plan (fused layers share one weight and one input scale), then "
                  "ModelOpt's export-time fusion step (requantize_resmooth_fused_llm_layers); reloaded: weights "
                  "de-quantized from the exported safetensors, input quantizers from input_scale, KV-cache "
                  "quantizers from k_scale/v_scale, "
                  "formats from hf_quant_config.json; proxy KL vs the BF16 model on the run's held-out tokens",
    }
    del reloaded

    options = llm_api_options(workloads, plan.kv_cache)
    (out_dir / "llm_api_options.yaml").write_text(options_yaml(options, workloads))
    vllm_opts = vllm_options(workloads, plan.kv_cache, plan.formats.values(), target, moe=plan_traits(plan).moe)
    (out_dir / "vllm_config.yaml").write_text(vllm_options_yaml(vllm_opts, workloads))
    t = time.perf_counter()
    smoke_result = smoke_test_trtllm(out_dir) if smoke else "not run: disabled"
    timings["smoke_test_s"] = time.perf_counter() - t
    verdicts = engine_compatibility(plan, target)
    result = ExportResult(
        out_dir=str(out_dir), plan_id=plan.id, plan_label=plan.label(), files=[],
        quant_algo=quant_algo, hf_quant_config=qcfg, roundtrip=roundtrip, smoke_test=smoke_result,
        warnings=[*deployment_warnings(quant_algo, plan), *compatibility_warnings(verdicts),
                  *extra_warnings],
        timings_s=timings, engines=compatibility_record(verdicts),
    )
    (out_dir / "README.md").write_text(render_readme(result, plan, options, verdicts))
    (out_dir / "export.json").write_text("{}")
    result.files = sorted(p.name for p in out_dir.iterdir())
    (out_dir / "export.json").write_text(json.dumps(result.to_dict(), indent=2))
    if not roundtrip["passed"]:
        from advisor.errors import AdvisorError

        raise AdvisorError(
            f"round trip failed: reloaded checkpoint KL {rt.kl:.6f} vs in-memory {mem.kl:.6f} "
            f"(|diff| {diff:.2e} > {tol:.2e}); files kept in {out_dir} for inspection"
        )
    return result


