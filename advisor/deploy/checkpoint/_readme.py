"""README.md of an exported checkpoint: how to serve it, the round trip, and the warnings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from advisor.plan import Plan
from advisor.serving import NOT_RUN, EngineVerdict, compatibility_table


@dataclass
class ExportResult:
    """What an export wrote and checked (its README renders it)."""

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
    engines: dict[str, Any] = field(default_factory=dict)  # advisor.serving verdicts per serving engine

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def render_readme(result: ExportResult, plan: Plan, options: dict[str, Any],
                  verdicts: Sequence[EngineVerdict] = ()) -> str:
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
        f"{options['max_num_tokens']}, max_seq_len {options['max_seq_len']} (from the run's workloads); KV cache "
        + ("**FP8** (`kv_cache_config.dtype: fp8`; `kv_cache_quant_algo: FP8` and per-layer `k_scale`/`v_scale` "
           "in the checkpoint; vLLM and SGLang: `--kv-cache-dtype fp8`)." if plan.kv_cache.value == "fp8"
           else "BF16 (the model's dtype)."),
        "",
        f"TensorRT-LLM smoke test: {result.smoke_test}.",
        "",
        "vLLM loads it too (`vllm_config.yaml`: the same sizes, CUDA graphs for the steps where a prefill "
        "joins the decode batch, and, for FP8 layers on an H100 or H200 target, `linear-backend: torch`: "
        "cuBLASLt FP8 GEMMs, not vLLM's CUTLASS kernel):",
        "",
        "```bash",
        "vllm serve <this folder> --config vllm_config.yaml",
        "```",
        "",
    ]
    if verdicts:
        lines += ["## Serving engines", "", f"Which engines can serve this plan ({NOT_RUN}):", "",
                  *compatibility_table(verdicts), ""]
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
        f"The plan as the search scored it (before ModelOpt's export-time fusion step): KL "
        f"{rt['kl_in_memory_plan']:.6f}"
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
