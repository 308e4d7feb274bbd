"""Export a plan as a deployable checkpoint, and reload it to check the round trip.

What :func:`export_run` writes into the output folder:

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
* ``README.md`` with the ``trtllm-serve`` command, the round-trip numbers and warnings;
* ``export.json``: the same facts for programs.

Round trip (:func:`load_exported`): a fresh model is built from the exported
``config.json``; each quantized layer's weight is read from the file and de-quantized
(FP8: ``weight * weight_scale``; NVFP4: unpacked E2M1 nibbles times FP8 block scales
times ``weight_scale_2``, with ModelOpt's ``NVFP4QTensor.dequantize``), and ModelOpt
input quantizers are inserted with the amax that the file's ``input_scale`` implies.
The formats come from ``hf_quant_config.json`` alone, not from the plan. transformers
5 has no loader for ``quant_method: modelopt`` checkpoints, hence this reader. The
reloaded model's proxy KL is compared with the in-memory quantized model's.

Everything here runs on CPU (NVFP4 fake quantization through ``advisor.quantize.nvfp4_cpu``;
ModelOpt's NVFP4 weight packing in export is plain torch).
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import json
import logging
import math
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from advisor.errors import InputError, SetupError
from advisor.formats import GPU, GPU_SPECS, Format
from advisor.plan import LayerGroup, Plan

log = logging.getLogger(__name__)

# Round-trip tolerance: |KL(reloaded) - KL(in-memory)| <= REL * KL(in-memory) + ABS (nats/token).
# Not zero, because ModelOpt's FP8 export computes ``weight / weight_scale`` in BF16 before
# the FP8 cast (``quant_utils.to_quantized_weight``): that double rounding moves weights
# that sit near the midpoint of two FP8 codes by one FP8 step (the fake quantizer rounds
# once, in float32). NVFP4 weights round-trip bit for bit. ``weights`` in the round-trip
# record counts the moved weights.
ROUNDTRIP_KL_REL_TOL = 0.10
ROUNDTRIP_KL_ABS_TOL = 1e-4

_ALGO_FORMAT = {"FP8": Format.FP8, "NVFP4": Format.NVFP4}
_E4M3_MAX = 448.0
_E2M1_MAX = 6.0


@dataclass
class ExportResult:
    out_dir: str
    plan_id: str
    plan_label: str
    files: list[str]
    quant_algo: str | None
    hf_quant_config: dict[str, Any] | None
    roundtrip: dict[str, Any]
    smoke_test: str
    warnings: list[str] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------- plan <-> quant config


def expected_layer_formats(plan: Plan, groups: tuple[LayerGroup, ...]) -> dict[str, Format]:
    """Module name -> format that the plan asks for, for every quantizable linear."""
    return {m: plan.format_of(g.name) for g in groups for m in g.members}


def layer_formats_from_quant_config(qcfg: dict[str, Any] | None, modules: list[str]) -> dict[str, Format]:
    """Module name -> format, read from an ``hf_quant_config.json`` (None: unquantized)."""
    if qcfg is None:
        return {m: Format.BF16 for m in modules}
    q = qcfg.get("quantization", qcfg)
    algo = q.get("quant_algo")
    if algo is None:
        return {m: Format.BF16 for m in modules}
    if algo == "MIXED_PRECISION":
        layers = q.get("quantized_layers", {})
        out = {}
        for m in modules:
            entry = layers.get(m)
            out[m] = Format.BF16 if entry is None else _algo_format(entry.get("quant_algo"))
        return out
    fmt = _algo_format(algo)
    excluded = q.get("exclude_modules") or []
    return {m: Format.BF16 if any(fnmatch.fnmatch(m, p) for p in excluded) else fmt for m in modules}


def _algo_format(algo: str | None) -> Format:
    if algo not in _ALGO_FORMAT:
        raise InputError(f"hf_quant_config.json: quant_algo {algo!r} is not one the advisor writes (FP8, NVFP4)")
    return _ALGO_FORMAT[algo]


def check_quant_config(qcfg: dict[str, Any] | None, plan: Plan, groups: tuple[LayerGroup, ...]) -> None:
    """Raise unless the checkpoint's quant config gives every layer the plan's format."""
    expected = expected_layer_formats(plan, groups)
    found = layer_formats_from_quant_config(qcfg, list(expected))
    wrong = [f"{m}: plan {expected[m].value}, checkpoint {found[m].value}" for m in expected if found[m] != expected[m]]
    if wrong:
        raise AssertionError(f"exported quant config disagrees with plan {plan.id}: " + "; ".join(wrong[:5]))


# ---------------------------------------------------------------- serving config


def llm_api_options(workloads: list[dict[str, Any]]) -> dict[str, Any]:
    """TensorRT-LLM LLM-API options (``--extra_llm_api_options``) sized for the workloads."""
    batch = max(int(w["batch_size"]) for w in workloads)
    seq = max(int(w["input_tokens"]) + int(w["output_tokens"]) for w in workloads)
    prompt = max(int(w["input_tokens"]) for w in workloads)
    # One iteration holds at most one full prompt plus one decode token per other sequence.
    num_tokens = max(2048, 256 * math.ceil((prompt + batch) / 256))
    return {
        "max_batch_size": batch,
        "max_num_tokens": num_tokens,
        "max_seq_len": seq,
        "kv_cache_config": {"free_gpu_memory_fraction": 0.9, "enable_block_reuse": True},
        "cuda_graph_config": {"enable_padding": True, "max_batch_size": batch},
    }


def _options_yaml(options: dict[str, Any], workloads: list[dict[str, Any]]) -> str:
    import yaml

    wl = "; ".join(f"{w['name']}: batch {w['batch_size']}, {w['input_tokens']} in / {w['output_tokens']} out"
                   for w in workloads)
    head = ("# TensorRT-LLM LLM-API options written by precision-advisor export.\n"
            f"# Sized for the run's workloads ({wl}).\n"
            "# Use: trtllm-serve <this folder> --extra_llm_api_options llm_api_options.yaml\n")
    return head + yaml.safe_dump(options, sort_keys=False)


def deployment_warnings(quant_algo: str | None, plan: Plan, target: str | None) -> list[str]:
    out = []
    if quant_algo == "MIXED_PRECISION":
        out.append("quant_algo is MIXED_PRECISION: vLLM has rejected ModelOpt MIXED_PRECISION checkpoints "
                   "(per-layer FP8/NVFP4); serve it with TensorRT-LLM, or export a single-format plan for vLLM.")
    if Format.NVFP4 in plan.formats.values():
        gpu = GPU_SPECS.get(GPU(target)) if target in {g.value for g in GPU} else None
        if gpu is None or not gpu.supports(Format.NVFP4):
            out.append(f"the plan has NVFP4 layers; NVFP4 W4A4 GEMMs run natively only on Blackwell (sm_100+), "
                       f"not on target {target!r}.")
    if quant_algo is None:
        out.append("the plan is all-BF16: the checkpoint is unquantized (no hf_quant_config.json).")
    return out


# ---------------------------------------------------------------- export


def _quiet():
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    stack.enter_context(contextlib.redirect_stdout(sys.stderr))  # ModelOpt prints progress
    return stack


def _fake_quant_weights(qmodel: Any, groups: tuple[LayerGroup, ...]) -> dict[str, Any]:
    """Each quantized layer's weight as its ModelOpt weight quantizer sees it (fake-quantized)."""
    import torch

    out = {}
    with torch.no_grad():
        for g in groups:
            for m in g.members:
                mod = qmodel.get_submodule(m)
                wq = getattr(mod, "weight_quantizer", None)
                if wq is not None and wq.is_enabled:
                    out[m] = wq(mod.weight).detach().clone()
    return out


def _compare_weights(fake: dict[str, Any], reloaded: Any) -> dict[str, Any]:
    """How many reloaded weights differ from the in-memory fake-quantized ones."""
    total = moved = 0
    worst = 0.0
    for m, w in fake.items():
        r = reloaded.get_submodule(m).weight.detach()
        d = (r.float() - w.float()).abs()
        total += d.numel()
        moved += int((d > 0).sum())
        worst = max(worst, float((d / w.float().abs().clamp_min(1e-12)).max()) if d.any() else 0.0)
    return {"quantized_weights": total, "differing": moved,
            "differing_pct": 100.0 * moved / total if total else 0.0, "max_rel_diff": worst}


def fuse_like_export(qmodel: Any) -> None:
    """Give layers that engines fuse (same input: q/k/v, gate/up) shared weight and input scales,
    exactly as ``export_hf_checkpoint`` does before writing (ModelOpt's own function)."""
    from modelopt.torch.export.unified_export_hf import requantize_resmooth_fused_llm_layers

    with _quiet():
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
    with _quiet():
        export_hf_checkpoint(qmodel, export_dir=out_dir)
    tokenizer.save_pretrained(out_dir)
    path = out_dir / "hf_quant_config.json"
    return json.loads(path.read_text()) if path.is_file() else None


def smoke_test_trtllm(out_dir: Path, prompt: str = "Once upon a time", tokens: int = 8) -> str:
    """Load the checkpoint with TensorRT-LLM's LLM class and generate a few tokens, if installed."""
    try:
        from tensorrt_llm import LLM, SamplingParams
    except ImportError:
        return "not run: tensorrt_llm not installed"
    try:
        llm = LLM(model=str(out_dir))
        res = llm.generate([prompt], SamplingParams(max_tokens=tokens))
        text = res[0].outputs[0].text
        with contextlib.suppress(Exception):
            llm.shutdown()
        return f"passed: {prompt!r} -> {text!r}"
    except Exception as exc:  # any engine failure is a finding to report, not a crash
        return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


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
) -> ExportResult:
    """Quantize ``loaded.model`` for ``plan``, export it, reload it and compare proxy KL.

    ``tokens`` is a :class:`advisor.calibration.tokens.TokenSets` (calibration for ModelOpt,
    held-out for the proxy). ``loaded.model`` stays BF16 (a copy is quantized).
    """
    from advisor.accuracy.proxy import ProxyEvaluator
    from advisor.calibration.tokens import forward_loop
    from advisor.quantize.modelopt_config import prepare_device, quantize_plan

    groups = loaded.shape.groups
    plan.check_against(groups)
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise InputError(f"--out: {out_dir} exists and is not empty; give a new folder")
    timings: dict[str, float] = {}
    prepare_device("cpu")

    t = time.perf_counter()
    proxy = ProxyEvaluator(loaded.model, tokens.heldout)
    qmodel = copy.deepcopy(loaded.model)
    if not getattr(qmodel.config, "architectures", None):
        # GGUF loads leave it unset; ModelOpt's export and every serving engine need it.
        qmodel.config.architectures = [type(qmodel).__name__]
    with _quiet():
        quantize_plan(qmodel, plan, groups, forward_loop(tokens.calibration))
    planned = proxy.score(qmodel)
    # Engines fuse q/k/v and gate/up into one GEMM, so export gives fused layers one
    # weight (global) scale and one input scale: ModelOpt's own pre-export step, run
    # here first so the in-memory model scored is the one written.
    fuse_like_export(qmodel)
    mem = proxy.score(qmodel)
    fake_weights = _fake_quant_weights(qmodel, groups)
    timings["quantize_and_score_s"] = time.perf_counter() - t

    t = time.perf_counter()
    qcfg = write_checkpoint(qmodel, loaded.tokenizer, out_dir)
    del qmodel
    check_quant_config(qcfg, plan, groups)
    quant_algo = (qcfg or {}).get("quantization", {}).get("quant_algo")
    timings["export_s"] = time.perf_counter() - t

    t = time.perf_counter()
    reloaded = load_exported(out_dir)
    rt = proxy.score(reloaded)
    weights = _compare_weights(fake_weights, reloaded)
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
        "method": "in-memory: quantize_plan, then ModelOpt's export-time fusion of shared weight/input scales "
                  "(requantize_resmooth_fused_llm_layers); reloaded: weights de-quantized from the exported "
                  "safetensors, input quantizers from input_scale, "
                  "formats from hf_quant_config.json; proxy KL vs the BF16 model on the run's held-out tokens",
    }
    del reloaded

    options = llm_api_options(workloads)
    (out_dir / "llm_api_options.yaml").write_text(_options_yaml(options, workloads))
    t = time.perf_counter()
    smoke_result = smoke_test_trtllm(out_dir) if smoke else "not run: disabled"
    timings["smoke_test_s"] = time.perf_counter() - t
    result = ExportResult(
        out_dir=str(out_dir), plan_id=plan.id, plan_label=plan.label(), files=[],
        quant_algo=quant_algo, hf_quant_config=qcfg, roundtrip=roundtrip, smoke_test=smoke_result,
        warnings=[*deployment_warnings(quant_algo, plan, target), *extra_warnings], timings_s=timings,
    )
    (out_dir / "README.md").write_text(render_readme(result, plan, options))
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


def render_readme(result: ExportResult, plan: Plan, options: dict[str, Any]) -> str:
    rt = result.roundtrip
    algo = result.quant_algo or "none (BF16)"
    lines = [
        f"# Quantized checkpoint: plan `{plan.id}` ({plan.label()})",
        "",
        f"Written by `advisor export`: a ModelOpt unified Hugging Face checkpoint, quant_algo **{algo}**"
        " (see `hf_quant_config.json`), the tokenizer, and TensorRT-LLM serving options.",
        "",
        "## Serve",
        "",
        "TensorRT-LLM (1.x) loads this folder directly; there is no engine build step:",
        "",
        "```bash",
        "trtllm-serve <this folder> --extra_llm_api_options llm_api_options.yaml",
        "```",
        "",
        "or from Python: `LLM(model='<this folder>', **yaml.safe_load(open('llm_api_options.yaml')))`"
        " with `from tensorrt_llm import LLM`.",
        "",
        f"`llm_api_options.yaml`: max_batch_size {options['max_batch_size']}, max_num_tokens "
        f"{options['max_num_tokens']}, max_seq_len {options['max_seq_len']} (from the run's workloads).",
        "",
        f"TensorRT-LLM smoke test: {result.smoke_test}.",
        "",
    ]
    if result.warnings:
        lines += ["## Warnings", ""] + [f"- {w}" for w in result.warnings] + [""]
    lines += [
        "## Round trip (measured on CPU)",
        "",
        f"Proxy KL(BF16 || plan), nats/token on {rt['heldout_tokens']} held-out tokens:",
        f"in-memory ModelOpt model as exported (fused layers share scales) {rt['kl_in_memory']:.6f}, "
        f"reloaded checkpoint {rt['kl_reloaded']:.6f}, "
        f"|diff| {rt['kl_abs_diff']:.2e} (tolerance {rt['tolerance_kl']:.2e}, {rt['tolerance_rule']}): "
        f"**{'passed' if rt['passed'] else 'FAILED'}**. Perplexity {rt['ppl_in_memory']:.3f} vs "
        f"{rt['ppl_reloaded']:.3f} (BF16 {rt['ppl_bf16']:.3f}).",
        "",
        f"Before scale sharing (the plan as the search scored it): KL {rt['kl_in_memory_plan']:.6f}"
        + (f"; stored in summary.json: {rt['kl_stored_in_summary']:.6f}" if rt["kl_stored_in_summary"] is not None
           else "") + ".",
        "",
        f"Weights: {rt['weights']['differing']} of {rt['weights']['quantized_weights']} quantized weights "
        f"({rt['weights']['differing_pct']:.3f}%) differ from the in-memory fake-quantized values (largest "
        f"relative difference {rt['weights']['max_rel_diff']:.3f}): ModelOpt's FP8 export divides by the scale "
        "in BF16 before the FP8 cast, which moves weights near an FP8 rounding midpoint by one step.",
        "",
        f"Method: {rt['method']}.",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------- reload


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

    from advisor.models.loading import layer_groups
    from advisor.quantize.modelopt_config import _mtq, format_quantizer_cfg, prepare_device

    export_dir = Path(export_dir)
    cfg_path = export_dir / "config.json"
    if not cfg_path.is_file():
        raise InputError(f"{export_dir} holds no config.json; not an exported checkpoint")
    raw = json.loads(cfg_path.read_text())
    raw.pop("quantization_config", None)
    config = AutoConfig.for_model(**raw)
    dtype = torch.bfloat16
    with _quiet():
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
    mtq = _mtq()
    entries: list[dict[str, Any]] = [{"quantizer_name": "*", "enable": False}]
    for m in quantized:
        qc = format_quantizer_cfg(formats[m])["input_quantizer"]
        entries.append({"quantizer_name": f"{m}.input_quantizer", "cfg": qc})
    model.to(device).eval()
    if quantized:
        with _quiet():
            mtq.quantize(model, {"quant_cfg": entries, "algorithm": "max"}, lambda _m: None)
        for m in quantized:
            scale = tensors[f"{m}.input_scale"].float()
            bound = _E4M3_MAX * (_E2M1_MAX if formats[m] == Format.NVFP4 else 1.0)
            iq = model.get_submodule(m).input_quantizer
            iq.amax = (scale * bound).to(device)
            iq.enable()
    return model


# ---------------------------------------------------------------- from a run directory


def run_tokens(run_dir: Path, recipe: Any, loaded: Any, fingerprint: str) -> Any:
    """The run's stored token sets when they belong to this model; else fresh ones (not stored)."""
    from advisor.workflows.context import load_or_build_tokens

    return load_or_build_tokens(recipe, loaded, run_dir, fingerprint, store=False)


def export_run(
    run_dir: Path,
    out_dir: Path,
    plan_id: str | None = None,
    model: str | None = None,
    smoke: bool = True,
    status: Any = lambda _msg: None,
) -> ExportResult:
    """Export the recommendation (or ``plan_id``) of an ``advisor search`` run directory."""
    from advisor.deploy.recheck import read_summary, stored_plan, summary_recipe
    from advisor.models.loading import load_model
    from advisor.workflows.context import model_fingerprint

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(f"RUN_DIR {run_dir} is not a directory; give the folder `advisor search` wrote")
    summary = read_summary(run_dir / "summary.json")
    plan, record = stored_plan(summary, plan_id, run_dir / "summary.json")
    recipe = summary_recipe(summary, model=model)
    status(f"loading model {recipe.model.source}")
    loaded = load_model(recipe.model, "cpu")
    fingerprint = model_fingerprint(loaded)
    tokens = run_tokens(run_dir, recipe, loaded, fingerprint)
    stored_fp = (summary.get("model") or {}).get("fingerprint")
    notes = []
    if stored_fp and stored_fp != fingerprint:
        notes.append(f"the model's weights (fingerprint {fingerprint}) differ from the run's ({stored_fp}); "
                     "the plan was searched on other weights")
    status(f"quantizing plan {plan.id}, exporting, reloading")
    return export_plan(
        loaded, plan, tokens, out_dir, summary["workloads"], target=summary.get("target"),
        stored_kl=record.get("kl"), smoke=smoke, extra_warnings=tuple(notes),
    )
