"""The vLLM step model (advisor.energy.prediction._vllm_step, _vllm_served): vLLM 0.26's CUDA-graph sizes and
padding, chunked prefill, the merged pass of a step with its experts, the engine's terms, the served steady
state and operating batches on the graph grid, the label (and a vLLM version other than the profile's), and the
shipped profiles. Synthetic step models and the datasheet roofline only: no GPU, no vLLM."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from advisor.deploy.checkpoint import capture_bound, decode_graph_sizes
from advisor.energy.prediction import (
    Chunk,
    EngineTerms,
    RooflineEnergyModel,
    VllmServedModel,
    VllmServing,
    VllmSteps,
    as_served,
    capture_sizes,
    graph_batches,
    padded,
    predicted_for_gpus,
    priced_engine,
    split_prompts,
)
from advisor.energy.prediction._roofline import prefill_cost
from advisor.energy.profiling import shipped_vllm_profile, validate_vllm_profile
from advisor.errors import InputError
from advisor.formats import GPU, GPU_SPECS, Format
from advisor.models.shape import llama_shape
from advisor.plan import Plan
from advisor.recipe.schema import Workload
from advisor.search.operating import operating_point, steady_state
from advisor.search.study import study_key

ROOT = Path(__file__).resolve().parents[1]
SHAPE = llama_shape("model.layers", 4, 256, 512, 4, 2, 1000)
BF16 = Plan.uniform(SHAPE.groups, Format.BF16)
H100 = GPU_SPECS[GPU.H100]


class Affine:
    """A built-in step model with known parts: a pass over n tokens costs ``base + per_token * n`` ms (the larger of
    a decode step at no context and a prompt of n tokens), a decode step's attention ``attn * batch * context``,
    everything at ``watts``."""

    label = "predicted (affine)"
    gpus = 1

    def __init__(self, base=4.0, per_token=0.01, prompt_per_token=0.02, attn=1e-5, watts=400.0):
        self.base, self.per_token, self.prompt, self.attn, self.watts = base, per_token, prompt_per_token, attn, watts

    def decode_step(self, plan, batch, context):
        ms = self.base + self.per_token * batch + self.attn * batch * context
        return ms, self.watts * ms / 1e3

    def prefill(self, plan, length):
        ms = self.prompt * length
        return ms, self.watts * ms / 1e3

    def step_source(self, plan):
        return self.label

    def without_step_cap(self):
        return self

    def pass_is_decode_step(self, plan):
        return False


class AffineTable(Affine):
    """The same costs from a model whose decode step reads its GEMMs at n rows from a measured table (the GPU
    profile's): a pass over n tokens is that step, its prefill's larger cost a prompt's alone."""

    def pass_is_decode_step(self, plan):
        return True


def rows_ms(n, m=None):
    m = m or Affine()
    return max(m.base + m.per_token * n, m.prompt * n)


def test_capture_sizes_and_padding_are_vllm_0_26s():
    # 1, 2, 4, every 8 below 256, every 16 from 256 to the bound (vllm/config/vllm.py)
    sizes = capture_sizes(576, 16384)
    assert sizes[:5] == (1, 2, 4, 8, 16) and sizes[33:36] == (248, 256, 272) and sizes[-1] == 576
    assert capture_sizes(1000, 16384)[-1] == 992  # off the 16-stride: truncated to the last size
    assert capture_sizes(1024, 700)[-1] == 700 and 700 in capture_sizes(1024, 700)  # the token budget itself
    assert VllmServing(64, 16384).sizes[-1] == 128  # vLLM's default bound: 2 x max_num_seqs
    assert VllmServing(1024, 16384).sizes[-1] == 512  # ... at most 512
    assert padded(69, sizes) == 72 and padded(257, sizes) == 272 and padded(72, sizes) == 72
    assert padded(577, sizes) is None  # above the largest size: eager, unpadded
    # the same rule as the export's options (advisor/deploy/checkpoint/_vllm_config.py)
    assert capture_sizes(600, 1 << 20) == decode_graph_sizes(600)
    assert VllmServing.as_advisor_serves(69, 512, 256, H100).max_capture_size == capture_bound(69, 512)
    assert VllmServing.as_advisor_serves(64, 512, 256, H100).max_num_batched_tokens == 16384  # LLM class, 80 GB


def test_chunked_prefill_splits_prompts_at_the_token_budget():
    assert split_prompts(0, 512, 1000) == [[]]
    assert split_prompts(1, 512, 1000) == [[Chunk(512, 512)]]
    # two prompts with room for 700 prompt tokens a step: the second is cut and continued in the next step
    assert split_prompts(2, 512, 700) == [[Chunk(512, 512), Chunk(188, 512)], [Chunk(324, 512)]]
    # a prompt longer than a step's room spans several steps
    assert [sum(c.length for c in s) for s in split_prompts(1, 2500, 1000)] == [1000, 1000, 500]


def test_a_decode_step_is_the_padded_pass_plus_attention_plus_the_engines_terms():
    terms = EngineTerms(host_ms=0.5, per_seq_us=10.0, device_time_scale=1.0, gap_power_w=100.0)
    steps = VllmSteps(Affine(), terms, layers=4)
    s = steps.step(BF16, 69, 640.0, [], VllmServing(128, 16384, 576))
    device = rows_ms(72) + 1e-5 * 69 * 640  # the pass at the padded 72 tokens, the 69 real sequences' attention
    assert s.graph == "full" and s.ran_at == 72
    assert s.device_ms == pytest.approx(device)
    assert s.ms == pytest.approx(device + 0.5 + 10.0 * 69 / 1e3)
    # the fixed host time is a wait at the gap power; the per-sequence time keeps the GPU busy at the device's power
    # (the built-in model's 400 W here)
    assert s.joules == pytest.approx(400.0 * (device + 0.69) / 1e3 + 100.0 * 0.5 / 1e3)
    assert s.busy_ms == pytest.approx(device + 0.69) and s.busy_share == pytest.approx(s.busy_ms / s.ms)
    # a PIECEWISE pass's launches are waits too
    launched = VllmSteps(Affine(), replace(terms, piecewise_us_per_layer=50.0), layers=4).step(
        BF16, 69, 640.0, [Chunk(3, 512)], VllmServing(128, 16384, 576))
    assert launched.ms - launched.busy_ms == pytest.approx(0.5 + 50.0 * 4 / 1e3)


def test_a_pass_is_the_decode_step_where_the_built_in_model_reads_its_gemms_from_a_table():
    # a pass over 400 tokens: 8 ms as a decode step at no context, 8 ms as a prompt (prompt_per_token 0.02)
    # with 500 tokens the prompt (10 ms) is slower than the decode step (9 ms)
    profiled, table = VllmSteps(Affine(), EngineTerms(), 4), VllmSteps(AffineTable(), EngineTerms(), 4)
    assert profiled.rows(BF16, 500)[0] == pytest.approx(10.0)  # a decode profile stops short: the prompt bounds it
    assert table.rows(BF16, 500)[0] == pytest.approx(9.0)  # the table's decode step is the pass
    assert table.rows(BF16, 16)[0] == profiled.rows(BF16, 16)[0] == pytest.approx(4.16)
    # what a whole prompt costs beyond the pass, carried by its chunks, is then larger: the prompt pays it, not the
    # decodes it rides with
    assert table.prompt_beyond_rows(BF16, 500)[0] == pytest.approx(1.0)
    assert profiled.prompt_beyond_rows(BF16, 500)[0] == pytest.approx(0.0)


def test_a_prompt_joins_the_decode_pass_and_an_oversized_step_runs_eagerly():
    terms = EngineTerms(piecewise_us_per_layer=20.0, eager_us_per_layer=300.0)
    steps = VllmSteps(Affine(), terms, layers=4)
    with_prompt = steps.step(BF16, 64, 640.0, [Chunk(512, 512)], VllmServing(128, 16384, 576))
    separate = Affine().decode_step(BF16, 64, 640.0)[0] + Affine().prefill(BF16, 512)[0]
    merged = rows_ms(576) + 1e-5 * 64 * 640  # one pass over 576 tokens: the weights read once
    assert with_prompt.graph == "piecewise" and with_prompt.ran_at == 576
    assert with_prompt.device_ms == pytest.approx(merged) and merged < separate
    assert with_prompt.ms == pytest.approx(merged + 20.0 * 4 / 1e3)
    eager = steps.step(BF16, 64, 640.0, [Chunk(512, 512), Chunk(512, 512)], VllmServing(128, 16384, 576))
    assert eager.graph == "eager" and eager.ran_at == 1088  # unpadded
    assert eager.ms == pytest.approx(rows_ms(1088) + 1e-5 * 64 * 640 + 300.0 * 4 / 1e3)
    # a chunk carries its share of what the prompt costs beyond a pass over as many tokens
    costly = Affine(prompt_per_token=0.001)  # a cheap prompt: the decode rows bound the pass; no share beyond it
    part = VllmSteps(costly, EngineTerms(), 4).step(BF16, 8, 0.0, [Chunk(100, 400)], VllmServing(8, 16384, 128))
    assert part.device_ms == pytest.approx(costly.base + costly.per_token * 112)


def test_a_moe_step_reads_the_experts_its_padded_merged_tokens_touch():
    moe = _tiny_moe_shape()
    plan = Plan.uniform(moe.groups, Format.BF16)
    roofline = RooflineEnergyModel(moe, GPU.H100)
    steps = VllmSteps(roofline, EngineTerms(), moe.num_layers)
    # 3 decodes at no context and a 5-token prompt: one pass over 8 tokens (a captured size)
    s = steps.step(plan, 3, 0.0, [Chunk(5, 5)], VllmServing(8, 16384, 16))
    assert s.device_j == pytest.approx(prefill_cost(moe, plan, 8).energy_j(H100))
    apart = roofline.decode_step(plan, 3, 0.0)[1] + roofline.prefill(plan, 5)[1]
    assert s.device_j < apart  # the experts both parts touch are read once
    # 3 decodes and a 6-token prompt pad to 16 tokens: the padded rows are routed too
    s16 = steps.step(plan, 3, 0.0, [Chunk(6, 6)], VllmServing(8, 16384, 16))
    assert s16.ran_at == 16 and s16.device_j == pytest.approx(prefill_cost(moe, plan, 16).energy_j(H100))
    assert s16.device_j > prefill_cost(moe, plan, 9).energy_j(H100)


def _tiny_moe_shape():
    import warnings

    import torch
    import transformers

    from advisor.models.adapters.geometry import model_shape

    cfg = transformers.Qwen3MoeConfig(vocab_size=96, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                      num_experts=8, num_experts_per_tok=2, max_position_embeddings=64)
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        return model_shape(transformers.AutoModelForCausalLM.from_config(cfg))


def _profile(**over):
    params = {"host_ms": 0.5, "per_seq_us": 2.0, "piecewise_us_per_layer": 0.0, "eager_us_per_layer": 200.0,
              "device_time_scale": 1.0, "device_energy_scale": 1.0, "admission_steps": 1.0, "gap_power_w": 100.0}
    return {"schema": "precision-advisor/vllm-step-profile", "version": 1, "vllm_version": "0.26.0",
            "gpu": "NVIDIA H100 80GB HBM3", "gpu_kind": "h100", "driver": "580.159.04", "date": "2026-11-28",
            "source": "test", "command": "test", "params": params, **over}


def test_the_served_steady_state_and_its_operating_batch_on_the_graph_grid():
    model = VllmServedModel(Affine(), SHAPE, GPU.H100, _profile())
    w = Workload(name="w", batch_size=64, input_tokens=512, output_tokens=256, tpot_ms=8.0)
    p50 = model.served_state(BF16, w, 64)
    p90 = model.served_state(BF16, w.model_copy(update={"percentile": "p90"}), 64)
    assert p90.tpot_ms > p50.tpot_ms and p90.ttft_ms > p50.ttft_ms
    decode_only = model.served_state(BF16, w.model_copy(update={"output_tokens": 10**7}), 64)
    step_ms, step_j = model.decode_step(BF16, 64, 512 + 10**7 / 2)
    assert decode_only.tpot_ms == pytest.approx(step_ms, rel=1e-4)
    assert decode_only.j_per_token == pytest.approx(step_j / 64, rel=1e-4)
    # the GPU's busy share: a decode step's device and per-sequence time over its whole (0.5 ms a step waits)
    assert decode_only.busy_share == pytest.approx(1 - 0.5 / step_ms, rel=1e-3)
    assert 0 < p50.busy_share < decode_only.busy_share  # a prompt's eager steps wait for their launches too
    lag = VllmServedModel(Affine(), SHAPE, GPU.H100, _profile(params={**_profile()["params"], "admission_steps": 2}))
    assert lag.served_state(BF16, w, 64).ttft_ms - p50.ttft_ms == pytest.approx(1e3 * 64 / p50.tokens_per_s)
    assert steady_state(model, BF16, w, 64) == p50  # the operating-point search reads the engine's own state
    op = operating_point(model, SHAPE, H100, BF16, w, "vllm")
    grid = set(graph_batches(10**6))
    assert op.meets and op.state.batch in grid
    assert all(b in grid for b, _, _ in op.curve[:-1])  # the last one: the memory or concurrency bound
    above = min(b for b in grid if b > op.state.batch)
    aim = 8.0 * (1 - model.tpot_margin)  # kept its error's share under the objective
    assert op.tpot_margin == model.tpot_margin > 0
    assert model.served_state(BF16, w, above).tpot_ms > aim >= op.state.tpot_ms
    # where no batch meets the objective less the margin, the objective itself decides
    one = model.served_state(BF16, w, 1).tpot_ms
    tight = w.model_copy(update={"tpot_ms": one * (1 + model.tpot_margin / 2)})
    assert one > tight.tpot_ms * (1 - model.tpot_margin)  # not even batch 1 meets it less the margin
    at_objective = operating_point(model, SHAPE, H100, BF16, tight, "vllm")
    assert at_objective.meets and at_objective.tpot_margin == 0.0 and at_objective.state.tpot_ms <= tight.tpot_ms


def test_the_label_names_the_vllm_step_model_and_a_version_mismatch():
    model = VllmServedModel(Affine(), SHAPE, GPU.H100, _profile())
    assert model.label.startswith("predicted (vLLM 0.26.0 step model: engine terms fitted on NVIDIA H100 80GB HBM3, "
                                  "driver 580.159.04, 2026-11-28")
    assert "device costs from affine" in model.label and "installed" not in model.label
    same = VllmServedModel(Affine(), SHAPE, GPU.H100, _profile(), installed="0.26.0")
    assert "installed" not in same.label
    other = VllmServedModel(Affine(), SHAPE, GPU.H100, _profile(), installed="0.27.1")
    assert "vLLM 0.27.1 is installed, but the profile is of vLLM 0.26.0" in other.label
    est = other.estimate(BF16, Workload(name="w", batch_size=16, input_tokens=512, output_tokens=256))
    assert est.source == other.label and not est.measured
    assert est.j_per_token == pytest.approx(est.decode_j_per_token + est.prefill_j_per_input_token * 512 / 256)


def test_which_engine_prices_the_plans():
    assert priced_engine("vllm", measured_here=True) == "vllm"
    assert priced_engine("builtin", measured_here=False) == "vllm"  # the export's default serving
    assert priced_engine("builtin", measured_here=True) is None  # the runtime measures: like with like
    assert priced_engine("tensorrt_llm", measured_here=True) is None  # no step model of its own here
    builtin = RooflineEnergyModel(SHAPE, GPU.H100)
    assert as_served(builtin, SHAPE, GPU.H100, None) is builtin
    served = as_served(builtin, SHAPE, GPU.H100, "vllm")
    assert isinstance(served, VllmServedModel) and "roofline" in served.label
    from advisor.recipe.schema import validate_recipe

    recipe = validate_recipe({"name": "r"})
    assert study_key(recipe, {}, "predicted", "vllm")["predicted_steps"] == "vllm"
    assert "predicted_steps" not in study_key(recipe, {}, "measured", None)  # earlier studies keep their key


def test_shipped_profiles_say_where_and_when_and_b200_what_it_rests_on():
    for gpu in GPU:
        profile = shipped_vllm_profile(gpu)
        assert profile is not None, gpu
        assert profile["vllm_version"] == "0.26.0" and profile["date"] and profile["command"] and profile["source"]
    assert "ML.ENERGY" in shipped_vllm_profile(GPU.B200)["anchor"]["label"]
    assert "FP8 and NVFP4 relative to BF16 datasheet-derived" in shipped_vllm_profile(GPU.B200)["anchor"]["label"]
    # the anchor is an 8B's on one GPU: a model spread over several B200s says how the held-out ones came out
    b200, shape = shipped_vllm_profile(GPU.B200), llama_shape("model.layers", 8, 4096, 14336, 32, 8, 128256, 128)
    two = VllmServedModel(predicted_for_gpus(shape, GPU.B200, 2), shape, GPU.B200, b200)
    one = VllmServedModel(predicted_for_gpus(shape, GPU.B200, 1), shape, GPU.B200, b200)
    assert f"over several GPUs {b200['anchor']['several_gpus']}" in two.label
    assert "several GPUs" not in one.label and "ML.ENERGY" in one.label
    with pytest.raises(InputError, match="engine terms"):
        validate_vllm_profile(_profile(params={"host_ms": -1.0}), "x.json")
    with pytest.raises(InputError, match="not a vLLM step profile"):
        validate_vllm_profile({"schema": "other"}, "x.json")


def test_the_fit_reads_which_fp8_kernel_served_each_row(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "engine_true"))
    monkeypatch.chdir(ROOT)
    from served_rows import read_manifest

    rows = read_manifest("benchmarks/engine_true/h100_inputs.json")
    kernels = {(Path(r.source.split(" [")[0]).name, r.plan, r.batch): r.fp8_kernel for r in rows}
    assert kernels[("lb_torch.json", "all-fp8", 64)] == "cublaslt"
    assert kernels[("lb_default.json", "all-fp8", 64)] == "cutlass"  # vLLM's own choice on Hopper
    assert kernels[("lb_default.json", "all-bf16", 64)] is None
    assert all(r.fp8_kernel == "cutlass" for r in rows if r.source.endswith("verify.json") and r.fp8_kernel)
    capture = {r.max_capture_size for r in rows if r.source.endswith("[eightb]")}
    assert capture == {None}  # vLLM's default bound: recorded as such, priced as 2 x max_num_seqs


def test_a_kept_serving_read_as_another_shape_is_refused(monkeypatch):
    """The 4B case's kept serving names no shape: read as the default (the 8B) it was priced as the 8B, 32-57% off,
    without a word; its served modules tell the layers apart."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "engine_true"))
    from served_rows import read_input

    kept = str(ROOT / "reports/benchmarks/verify_time_data/qwen3_4b/verify_served/4e969af36196.json")
    recipe = str(ROOT / "benchmarks/device/verify_time_4b.yaml")
    with pytest.raises(SystemExit, match="36 decoder layers, the shape Llama-3.1-8B has 32"):
        read_input(kept, recipe=recipe, plan="all-fp8")
    rows = read_input(kept, recipe=recipe, plan="all-fp8", shape="qwen3-4b")
    assert {r.shape for r in rows} == {"qwen3-4b"} and len(rows) == 7


def test_the_fit_takes_the_gpu_sweep_of_shapes_outside_it(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "engine_true"))
    from served_rows import read_input

    row = {"j_per_token": 0.1, "tokens_per_s": 6000.0, "tpot_ms_p50": 10.0, "ttft_ms_p50": 30.0, "batch_full": True,
           "cv": 0.003, "unstable": False}
    sweep = {"date": "2026-11-30", "meter": {}, "rows": [
        {"shape": "qwen2.5-7b", "plan": "all-fp8", "vllm_version": "0.26.0", "error": None,
         "llm_options": {"linear_backend": "torch", "compilation_config": {"max_cudagraph_capture_size": 768}},
         "batches": {"b16": row, "b64": row, "b128": {**row, "unstable": True}}},
        {"shape": "llama-3.2-3b", "plan": "all-bf16", "vllm_version": "0.26.0", "error": "OOM", "batches": {}}]}
    path = tmp_path / "sweep.json"
    path.write_text(__import__("json").dumps(sweep))
    rows = read_input(str(path), gpu="NVIDIA H200", driver="580.159.04")
    assert [(r.batch, r.gpu_kind, r.fp8_kernel, r.max_num_seqs, r.max_capture_size) for r in rows] == [
        (16, "h200", "cublaslt", 128, 768), (64, "h200", "cublaslt", 128, 768)]  # unstable and failed rows left out


def test_the_fit_reads_a_plans_kept_serving_with_the_graphs_it_captured(monkeypatch):
    """advisor verify's kept serving (verify_served/<plan>.json): every metered batch, fixed and searched, in the one
    engine sized for the largest, priced with the CUDA-graph sizes the engine was told to capture."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "engine_true"))
    from served_rows import read_manifest

    rows = [r for r in read_manifest(str(ROOT / "benchmarks" / "engine_true" / "h200_inputs.json"))
            if r.source.endswith("b8a644eb41f0.json")]
    assert sorted(r.batch for r in rows) == [16, 32, 46, 64, 64, 88, 98, 152, 201]
    assert {(r.max_num_seqs, r.max_num_batched_tokens, r.fp8_kernel, r.gpu_kind) for r in rows} == {
        (201, 16384, None, "h200")}
    assert rows[0].capture_sizes == [1, 16, 48, 64, 104, 208, 512, 528, 560, 576, 624, 720]
    serving = VllmServing(201, 16384, None, tuple(rows[0].capture_sizes))
    assert padded(88, serving.sizes) == 104 and padded(152, serving.sizes) == 208  # not vLLM's grid's 88 and 152
    assert padded(152, VllmServing(201, 16384).sizes) == 152


def test_a_kept_serving_s_copy_of_one_load_for_two_objectives_is_one_row(monkeypatch):
    """Two objectives stated at one batch are metered once (the second row says ``same_load_as``): the fit and its
    checks read that measurement once, not twice."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "engine_true"))
    from served_rows import read_manifest

    rows = [r for r in read_manifest(str(ROOT / "benchmarks" / "engine_true" / "h200_round2_inputs.json"))
            if r.source.endswith("b8a644eb41f0.json")]
    assert sorted(r.batch for r in rows) == [16, 40, 64, 88, 176]


def test_the_sweep_knows_the_moe_held_out_of_the_fit(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "engine_true"))
    from served_rows import shape_of

    shape, config = shape_of("qwen3-30b-a3b")
    assert type(config).__name__ == "Qwen3MoeConfig" and config.num_experts == 128
    assert config.num_experts_per_tok == 8 and config.num_hidden_layers == 48
    assert shape.is_moe and {(g.num_experts, g.top_k, g.moe_intermediate) for g in shape.layers} == {(128, 8, 768)}
    # priced as vLLM serves it, its label says what the step model leaves out for a MoE (a dense shape's does not)
    moe = VllmServedModel(Affine(), shape, GPU.H200, _profile())
    assert "fused MoE is not measured for this MoE's experts" in moe.label and "47-95%" in moe.label
    assert "fused MoE" not in VllmServedModel(Affine(), SHAPE, GPU.H200, _profile()).label


def test_rows_the_host_held_back_are_checks_never_fitted(monkeypatch):
    """Round 5's stalled recommendation rows (GPU 75% and 84% busy) are disturbed: checks, never fitted, with the
    checks' RMS given without them too."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "engine_true"))
    monkeypatch.chdir(ROOT)
    from served_rows import disturbance, read_input, read_manifest
    from step_fit_report import summary

    rows = read_manifest("benchmarks/engine_true/h200_round5_inputs.json")
    disturbed = {(r.plan, r.batch): r.disturbed for r in rows if r.disturbed}
    mixed = "mixed (3 bf16, 125 fp8)"
    assert disturbed == {(mixed, 64): "GPU 84% busy", (mixed, 16): "GPU 75% busy"}
    assert not any(r.fittable for r in rows if r.disturbed) and all(r.fittable for r in rows if not r.disturbed)
    assert disturbance({"gpu_busy_pct": 99.0, "measurement": {"starved_windows": 6}}) == "6 starved windows"
    # a sweep's rows too (their fields at the top): the 4B all-BF16 served on a host that held the GPU back
    sweep = read_input("reports/benchmarks/engine_true_data/qwen3-4b_h200_bf16.json", gpu="NVIDIA H200")
    assert {r.batch: r.disturbed for r in sweep if r.disturbed} == {64: "GPU 81% busy", 136: "GPU 82% busy",
                                                                     240: "GPU 86% busy", 120: "GPU 86% busy"}
    errors = [{"fitted": False, "disturbed": r.disturbed, "error_pct": {"tpot_ms": 20.0 if r.disturbed else 2.0}}
              for r in rows]
    rms = summary(errors, "error_pct")
    assert rms["checks, undisturbed"]["tpot_ms"] == pytest.approx(2.0) and rms["checks"]["tpot_ms"] > 2.0


class Hot(Affine):
    """An :class:`Affine` whose prompt passes draw ``prompt_watts`` and decode steps ``watts``."""

    def __init__(self, watts=400.0, prompt_watts=1200.0, **kw):
        super().__init__(watts=watts, **kw)
        self.prompt_watts = prompt_watts

    def prefill(self, plan, length):
        ms = self.prompt * length
        return ms, self.prompt_watts * ms / 1e3


def _unlimited(model):
    model.power_limit_w = 1e12
    return model


def test_the_power_limit_holds_the_served_mix_not_each_step():
    w = Workload(name="w", batch_size=64, input_tokens=512, output_tokens=256)
    # a prompt's pass draws 1200 W of an H100's 700, the decodes 400: the mix's mean stays under the limit
    mixed = VllmServedModel(Hot(), SHAPE, GPU.H100, _profile()).served_state(BF16, w, 64)
    free = _unlimited(VllmServedModel(Hot(), SHAPE, GPU.H100, _profile())).served_state(BF16, w, 64)
    assert mixed.power_w < 700.0 and mixed == free
    # every step at 900 W: the whole mix runs at the limit, each step (900 / 700)^(1/3) longer
    hot = VllmServedModel(Hot(watts=900.0, prompt_watts=900.0), SHAPE, GPU.H100, _profile())
    ref = _unlimited(VllmServedModel(Hot(watts=900.0, prompt_watts=900.0), SHAPE, GPU.H100, _profile()))
    held, raw = hot.served_state(BF16, w, 64), ref.served_state(BF16, w, 64)
    slow = (raw.power_w / 700.0) ** (1 / 3)
    assert raw.power_w > 700.0 and held.power_w == pytest.approx(700.0)
    assert held.tpot_ms == pytest.approx(raw.tpot_ms * slow) and held.ttft_ms == pytest.approx(raw.ttft_ms * slow)
    assert held.tokens_per_s == pytest.approx(raw.tokens_per_s / slow)
    assert held.j_per_token == pytest.approx(raw.j_per_token * slow * 700.0 / raw.power_w)
    ms, j = hot.decode_step(BF16, 64, 640)  # one step repeated is its own mix
    assert j / (ms / 1e3) == pytest.approx(700.0)
    # over two GPUs the steps' energy is of both, and so is the limit
    from advisor.energy.prediction import TensorParallelEnergyModel

    def over_two():
        return VllmServedModel(TensorParallelEnergyModel(Hot(), 2, SHAPE.hidden_size, SHAPE.num_layers),
                               SHAPE, GPU.H100, _profile())

    two = over_two()
    state = two.served_state(BF16, w, 64)
    assert two.power_limit_w == 1400.0 and 700.0 < state.power_w < 1400.0
    assert state == _unlimited(over_two()).served_state(BF16, w, 64)


def test_the_held_out_check_reads_every_metering_that_met_and_prices_the_batch_now(monkeypatch):
    for sub in ("engine_true", "device", ""):
        monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / sub))
    from engine_true_sweep import predicted_batches
    from vllm_step_fit import objective_rows

    sweep = ROOT / "reports" / "benchmarks" / "engine_true_data" / "qwen2.5-7b_h200_bf16.json"
    rows = {r["objective"]: r for r in objective_rows([str(sweep)])}
    assert rows["tpot12"]["largest_met"] == 128  # the sweep's fixed batch 128 met 12 ms; its search stopped at 120
    assert rows["tpot12"]["search"].startswith("search stopped") and rows["tpot12"]["predicted_when_served"] == 104
    now = predicted_batches("qwen2.5-7b", "all-bf16", "h200")
    assert {k: r["predicted_batch"] for k, r in rows.items()} == now
    assert all(b in graph_batches(10**6) for b in now.values())


def test_a_fit_that_carries_terms_names_where_they_were_fitted(monkeypatch):
    """A profile's carried terms name the fit they came from, through any number of carries (the H100 profile carries
    its timing terms from its own earlier fit, the H200 one from the H100's)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "engine_true"))
    from vllm_step_fit import terms_origin

    first = {"fitted_on": "2026-11-29", "command": "vllm_step_fit.py --gpu h100"}
    assert terms_origin(first, "h100.json") == {"profile": "h100.json", **first}
    carried = {"fitted_on": "2026-11-30", "command": "vllm_step_fit.py --gpu h100 --free ...",
               "terms_from": terms_origin(first, "h100.json")}
    assert terms_origin(carried, "h100.json") == {"profile": "h100.json", **first}
    shipped = json.loads((ROOT / "advisor/energy/profiles/vllm/h200.json").read_text())
    assert shipped["terms_from"]["fitted_on"] == "2026-11-29" and "--free" not in shipped["terms_from"]["command"]
