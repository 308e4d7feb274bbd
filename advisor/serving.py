"""Which serving engines (TensorRT-LLM, vLLM, SGLang) can serve a plan's checkpoint, per what each engine
documents and what its public tracker reports: a table of facts, each with its source, and the ones a plan
meets. Data, below the report and the export that both show it.

The facts were read on 2026-11-22 with the project's search tools (documentation, code and issue
threads); the vLLM facts whose source is a file under ``reports/`` were measured here instead
(``advisor verify`` and ``benchmarks/vllm_verify.py`` serve exports in vLLM 0.26.0 on a GPU;
TensorRT-LLM cannot be installed on the machines this project has). A fact
is ``ok`` (documented support), ``caveat`` (it serves, but not exactly what the search scored or
not as fast as it could) or ``problem`` (a public report of a load failure or wrong output for
such a checkpoint). Torch-free: the export README and the run report both use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from advisor.engines import ENGINE_TABLE
from advisor.formats import GPU, GPU_SPECS, Format
from advisor.plan import Plan

Level = Literal["ok", "caveat", "problem"]
#: the engines that serve an exported checkpoint (advisor.engines' table), and SGLang, which loads it too but which
#: the advisor does not run: it is judged from its documentation and tracker alone
ENGINES = (*(e.title for e in ENGINE_TABLE.values() if e.serves_checkpoint), "SGLang")
NO_FACTS = "not assessed"  # the verdict for an engine of the table no fact below is about
FUSED_KINDS = ("qkv", "gate_up", "shared_gate_up")
NOT_RUN = ("per the engines' documentation and public reports, read 2026-11-22, and what vLLM 0.26.0 did with "
           "such exports on an H200 here (reports/benchmarks/vllm_verify.md)")


@dataclass(frozen=True)
class PlanTraits:
    """What about a plan decides whether an engine serves it."""

    formats: frozenset[Format]  # the non-BF16 weight formats it uses
    kv_fp8: bool
    fused_quantized: bool  # a q/k/v or gate/up group is quantized (engines run it as one GEMM)
    experts_quantized: bool  # a MoE layer's routed experts are quantized
    moe: bool  # the model has routed experts
    nvfp4_down: bool  # an NVFP4 down projection (the SiLU*up output is quantized to NVFP4)
    target: str | None = None

    @property
    def mixed(self) -> bool:
        """FP8 and NVFP4 layers both: ModelOpt exports ``quant_algo: MIXED_PRECISION``."""
        return {Format.FP8, Format.NVFP4} <= self.formats


def plan_traits(plan: Plan, target: str | None = None) -> PlanTraits:
    quantized = {g for g, f in plan.formats.items() if f != Format.BF16}
    return PlanTraits(
        formats=frozenset(f for f in plan.formats.values() if f != Format.BF16),
        kv_fp8=plan.kv_cache == Format.FP8,
        fused_quantized=any(g.rsplit(".", 1)[-1] in FUSED_KINDS for g in quantized),
        experts_quantized=any(g.endswith(".experts") for g in quantized),
        moe=any(g.endswith(".experts") for g in plan.formats),
        nvfp4_down=any(f == Format.NVFP4 and g.rsplit(".", 1)[-1] in ("down", "shared_down")
                       for g, f in plan.formats.items()),
        target=target,
    )


@dataclass(frozen=True)
class Fact:
    engine: str
    level: Level
    text: str
    source: str
    applies: Callable[[PlanTraits], bool]


def _fp8(t: PlanTraits) -> bool:
    return Format.FP8 in t.formats


def vllm_linear_backend(formats: Iterable[Format], gpu: GPU | str | None) -> dict[str, str]:
    """``{"linear_backend": "torch"}`` (``vllm.LLM``'s keyword; ``linear-backend`` in ``vllm serve``'s YAML) for
    FP8 weights served on Hopper, else nothing: vLLM's default FP8 GEMM there is its CUTLASS kernel, and cuBLASLt
    served fewer J/token (the fact below). Not with NVFP4 layers: vLLM refuses a linear backend that has no kernel
    for one of the model's layers, and ``torch`` has none for NVFP4. Elsewhere (Blackwell) vLLM's own choice
    stands: not measured here."""
    kinds = set(formats)
    kind = next((g for g in GPU if g.value == gpu), None)
    hopper = kind is not None and GPU_SPECS[kind].compute_capability[0] == 9
    return {"linear_backend": "torch"} if hopper and Format.FP8 in kinds and Format.NVFP4 not in kinds else {}


def vllm_moe_backend(formats: Iterable[Format], gpu: GPU | str | None, moe: bool) -> dict[str, str]:
    """``{"moe_backend": "triton"}`` (``moe-backend`` in ``vllm serve``'s YAML) for a mixture-of-experts model with
    FP8 weights served on Hopper, else nothing. vLLM 0.26's default for FP8 experts there is FlashInfer's CUTLASS
    fused MoE, which FlashInfer compiles on the engine's first start unless the flashinfer-jit-cache package is
    installed: 32 of its 182 objects in 9 minutes on 16 cores (H200, 2026-11-30), so a first verify would wait most
    of an hour for one engine. Triton is vLLM's own choice for BF16 experts on Hopper (it moves FlashInfer's kernels
    to the back there), so every plan's experts run one kernel family. Not with NVFP4 layers, as for the linear
    backend; elsewhere (Blackwell) vLLM's own choice stands: not measured here."""
    return {"moe_backend": "triton"} if moe and vllm_linear_backend(formats, gpu) else {}


#: vLLM 0.26's max_num_batched_tokens for its offline ``LLM`` class where the GPU has >= 70 GiB (H100, H200,
#: B200), else 8192 (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults)
LLM_CLASS_BATCHED_TOKENS = (16384, 8192)


def vllm_token_budget(memory_gb: float, max_num_seqs: int, max_model_len: int) -> int:
    """The tokens a vLLM step may hold as the advisor serves (``advisor verify``, the measured tier: vLLM's ``LLM``
    class and its default on a GPU of ``memory_gb``), priced so (:mod:`advisor.energy.prediction`) and written so
    into the export's ``vllm_config.yaml``: ``vllm serve``'s own default is smaller, and the budget decides how a
    prompt is chunked into the decode steps."""
    large, small = LLM_CLASS_BATCHED_TOKENS
    default = large if memory_gb * 1e9 >= 70 * 2**30 else small
    return min(default, max_num_seqs * max_model_len)


def _fp8_on_hopper(t: PlanTraits) -> bool:
    return bool(vllm_linear_backend(t.formats, t.target))


def vllm_kernels(formats: Iterable[Format], gpu: GPU | str | None, moe: bool) -> dict[str, str]:
    """The kernel choices the advisor serves a plan with in vLLM (``vllm.LLM`` keywords): the linear and the MoE
    backend."""
    formats = tuple(formats)
    return {**vllm_linear_backend(formats, gpu), **vllm_moe_backend(formats, gpu, moe)}


def _fp8_moe_on_hopper(t: PlanTraits) -> bool:
    return bool(vllm_moe_backend(t.formats, t.target, t.moe))


def _nvfp4_off_blackwell(t: PlanTraits) -> bool:
    return Format.NVFP4 in t.formats and t.target != "b200"


TRTLLM_DOCS = "https://nvidia.github.io/TensorRT-LLM/features/quantization.html"
TRTLLM_LINEAR = "https://github.com/NVIDIA/TensorRT-LLM/blob/main/tensorrt_llm/_torch/modules/linear.py"
TRTLLM_MODEL_CONFIG = "https://github.com/NVIDIA/TensorRT-LLM/blob/main/tensorrt_llm/_torch/model_config.py"
TRTLLM_DEEPSEEK = "https://github.com/NVIDIA/TensorRT-LLM/blob/main/tensorrt_llm/_torch/models/modeling_deepseekv3.py"
TRTLLM_PR_15485 = "https://github.com/NVIDIA/TensorRT-LLM/pull/15485"
VLLM_PR_4527 = "https://github.com/vllm-project/vllm/pull/4527"
VLLM_KV_DOCS = "https://docs.vllm.ai/en/latest/features/quantization/quantized_kvcache/"
VLLM_PR_49376 = "https://github.com/vllm-project/vllm/pull/49376"
VLLM_ISSUE_37854 = "https://github.com/vllm-project/vllm/issues/37854"
VLLM_PR_56050 = "https://github.com/vllm-project/vllm/pull/56050"
VLLM_MEASURED = "reports/benchmarks/vllm_verify.md"
VLLM_OPERATING = "reports/benchmarks/operating_points_8b.md"
VLLM_VERIFY_TIME = "reports/benchmarks/verify_time.md"
VLLM_ENGINE_TRUE = "reports/benchmarks/engine_true.md"
SGLANG_KV_DOCS = "https://docs.sglang.io/advanced_features/quantized_kv_cache.html"
SGLANG_PR_28099 = "https://github.com/sgl-project/sglang/pull/28099"
SGLANG_PR_32740 = "https://github.com/sgl-project/sglang/pull/32740"

FACTS: tuple[Fact, ...] = (
    # ---------------------------------------------------------------- TensorRT-LLM
    Fact("TensorRT-LLM", "ok", "loads ModelOpt FP8 (per-tensor) and NVFP4 checkpoints directly (`LLM(model=dir)`) "
         "and serves an FP8 KV cache (`KvCacheConfig(dtype='fp8')`)", TRTLLM_DOCS,
         lambda t: bool(t.formats) or t.kv_fp8),
    Fact("TensorRT-LLM", "ok", "runs q/k/v and gate/up as one FP8 GEMM with the largest member's input and weight "
         "scale (`FP8QDQLinearMethod.rescale_fused_weights`); this export writes them shared already",
         TRTLLM_LINEAR, lambda t: _fp8(t) and t.fused_quantized),
    Fact("TensorRT-LLM", "problem", "NVFP4 W4A4 GEMMs run only on Blackwell (the PyTorch backend supports FP4 on "
         "Blackwell, FP8 on Hopper and Blackwell)", TRTLLM_DOCS, _nvfp4_off_blackwell),
    Fact("TensorRT-LLM", "caveat", "MIXED_PRECISION is served through per-linear-layer quant configs "
         "(`ModelConfig.quant_config_dict`), model by model: the DeepSeek-V3, GLM-4 and EXAONE-MoE decoder layers "
         "assert 'MIXED_PRECISION is ambiguous' (FIXME: incompatible with mixed quantization mode)",
         TRTLLM_DEEPSEEK, lambda t: t.mixed),
    Fact("TensorRT-LLM", "problem", "a MIXED_PRECISION MoE checkpoint failed to serve (GLM asserts; the fused MoE "
         "took the global config and allocated BF16 experts for Qwen3-MoE); the open fix (PR 15485) also turns the "
         "eager fusions off under MIXED_PRECISION", TRTLLM_PR_15485, lambda t: t.mixed and t.experts_quantized),
    # ---------------------------------------------------------------- vLLM
    Fact("vLLM", "ok", "loads ModelOpt FP8 (`KV_CACHE_QUANT_ALGOS = ['FP8']`, per-tensor k/v scales) and NVFP4; "
         "fused q/k/v and gate/up with different FP8 scales are re-quantized to `weight_scale.max()` (here they "
         "are shared already)", VLLM_PR_4527, lambda t: bool(t.formats) or t.kv_fp8),
    Fact("vLLM", "ok", "vLLM 0.26.0 loaded ModelOpt FP8 and FP8/BF16 (`exclude_modules`) exports and built every layer "
         "group in the planned format (ModelOptFp8LinearMethod / UnquantizedLinearMethod, read from the loaded model), "
         "and served SmolLM2-135M's all-FP8 export at a KL to the BF16 reference (whole vocabulary) 4.8% below the "
         "proxy KL the search scored (0.0446 against 0.0469); measured on an H200, 2026-11-27 and 11-28",
         VLLM_MEASURED, lambda t: Format.FP8 in t.formats),
    Fact("vLLM", "ok", "on Hopper, serve it with the export's `vllm_config.yaml` (`linear-backend: torch`): with "
         "cuBLASLt for its FP8 GEMMs, not its default CUTLASS kernel, vLLM 0.26.0 served the same FP8 checkpoint at "
         "11.4% fewer J/token at batch 64 and 4.5% fewer at 16 (512 in / 256 out, continuous batching), FP8 and "
         "mixed plans within 1.1% of the built-in runtime's J/token and 3.7% of the prediction at batch 1, 16 and "
         "64 (H100, 2026-11-28)", VLLM_MEASURED, _fp8_on_hopper),
    Fact("vLLM", "ok", "on Hopper, serve it with the export's `vllm_config.yaml` (`moe-backend: triton`): vLLM "
         "0.26.0's default for FP8 experts there, FlashInfer's CUTLASS fused MoE, is compiled on the engine's first "
         "start unless flashinfer-jit-cache is installed (32 of 182 objects in 9 minutes on 16 cores, H200, "
         "2026-11-30); with Triton, vLLM's own choice for BF16 experts on Hopper, the FP8 Qwen3-30B-A3B shape's "
         "engine started in 108 s. The two kernels' J/token were not compared", VLLM_ENGINE_TRUE, _fp8_moe_on_hopper),
    Fact("vLLM", "caveat", "operating batches under a TPOT objective are predicted with a step model of vLLM 0.26.0 "
         "fitted on one shape (Llama-3.1-8B): on that shape in three fresh searches and verifies, 21 of 27 predicted "
         "batches (all-BF16, all-FP8 and a mixed plan, TPOT 8/12/20 ms) met the objective as vLLM served them and "
         "the other 6 met one CUDA-graph size below; on two shapes outside the fit (Qwen2.5-7B, Qwen3-4B) its TPOT "
         "was within -3% to +7% of what vLLM served, so a predicted batch may be a graph size above or below the "
         "largest that meets (H200, 2026-11-29 and 11-30): check with `advisor verify`", VLLM_VERIFY_TIME, _fp8),
    Fact("vLLM", "ok", "serve it with the export's `vllm_config.yaml`: vLLM captures CUDA graphs only up to 2 x "
         "max_num_seqs tokens (at most 512) by default, so a step where a prefill joins the decode batch runs "
         "eagerly; with `max_cudagraph_capture_size` 1024 batch 64's time per output token fell 19% (BF16) and 18% "
         "(FP8) and J/token 7% and 5% (H100, vLLM 0.26.0, 2026-11-27)", VLLM_OPERATING, lambda t: bool(t.formats)),
    Fact("vLLM", "caveat", "with the Flash Attention 3 backend and an FP8 KV cache, queries are quantized to FP8 too; "
         "the search scored FP8 keys and values with BF16 queries", VLLM_KV_DOCS, lambda t: t.kv_fp8),
    Fact("vLLM", "problem", "NGC's vLLM 26.02 container (vLLM 0.15.1) rejects `quant_algo: MIXED_PRECISION` "
         "(open issue 37854); upstream vLLM loads it since PR 35047 (merged 2026-02-22): use a newer vLLM",
         VLLM_ISSUE_37854, lambda t: t.mixed),
    Fact("vLLM", "caveat", "a MIXED_PRECISION checkpoint is not detected as NVFP4, so the fused "
         "`silu_and_mul_nvfp4_quant` activation-quant kernel never runs (two kernels and a BF16 round trip "
         "through DRAM instead); open fix PR 56050", VLLM_PR_56050, lambda t: t.mixed and t.nvfp4_down),
    Fact("vLLM", "caveat", "without native FP4 GEMMs (before Blackwell) vLLM falls back to weight-only NVFP4 "
         "(Marlin W4A16, BF16 activations): not the W4A4 model the search scored, nor its energy",
         VLLM_PR_49376, _nvfp4_off_blackwell),
    # ---------------------------------------------------------------- SGLang
    Fact("SGLang", "ok", "loads single-format ModelOpt checkpoints (`modelopt_fp8`, `modelopt_fp4`) and serves an "
         "FP8 KV cache (`--kv-cache-dtype fp8_e4m3`)", SGLANG_KV_DOCS,
         lambda t: (bool(t.formats) or t.kv_fp8) and not t.mixed),
    Fact("SGLang", "caveat", "an FP8 KV cache is slow on attention backends that de-quantize it outside the "
         "attention kernel; pick a backend that fuses it", SGLANG_KV_DOCS, lambda t: t.kv_fp8),
    Fact("SGLang", "problem", "MIXED_PRECISION was routed to `w4afp8` for every model but NemotronH, so other mixed "
         "ModelOpt exports failed to load (PR 28099); a mixed checkpoint whose layers were dispatched to the wrong "
         "quant method started and returned empty output (PR 32740)", SGLANG_PR_32740, lambda t: t.mixed),
)


@dataclass(frozen=True)
class EngineVerdict:
    engine: str
    verdict: str  # "serves", "serves, with caveats", "may fail", or NO_FACTS
    facts: tuple[Fact, ...]

    @property
    def problems(self) -> tuple[Fact, ...]:
        return tuple(f for f in self.facts if f.level != "ok")


def engine_compatibility(plan: Plan, target: str | None = None, facts: Iterable[Fact] = FACTS) -> list[EngineVerdict]:
    """Per engine, the facts that concern ``plan`` and the verdict they add up to."""
    traits = plan_traits(plan, target)
    out = []
    facts = tuple(facts)
    for engine in ENGINES:
        met = tuple(f for f in facts if f.engine == engine and f.applies(traits))
        levels = {f.level for f in met}
        verdict = "may fail" if "problem" in levels else "serves, with caveats" if "caveat" in levels else "serves"
        if not any(f.engine == engine for f in facts):  # an engine added to the table and not yet researched
            verdict = NO_FACTS
        out.append(EngineVerdict(engine, verdict, met))
    return out


def compatibility_warnings(verdicts: Iterable[EngineVerdict]) -> list[str]:
    """One line per known problem or caveat, with its source."""
    return [f"{v.engine}: {f.text} ({f.source})" for v in verdicts for f in v.problems]


def compatibility_table(verdicts: Iterable[EngineVerdict]) -> list[str]:
    """Markdown lines: engine, verdict and the facts behind it, each linked to its source."""
    lines = ["| engine | verdict | why (source) |", "|---|---|---|"]
    for v in verdicts:
        why = "; ".join(f"{f.level}: {f.text} ([source]({f.source}))" for f in v.facts) or "BF16: no quantization"
        lines.append(f"| {v.engine} | **{v.verdict}** | {why} |")
    return lines


def compatibility_record(verdicts: Iterable[EngineVerdict]) -> dict[str, Mapping[str, object]]:
    """The verdicts as JSON-ready data (export.json)."""
    return {v.engine: {"verdict": v.verdict, "facts": [{"level": f.level, "text": f.text, "source": f.source}
                                                       for f in v.facts], "basis": NOT_RUN} for v in verdicts}
