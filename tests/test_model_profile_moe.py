"""Per-model profiles of MoE models: routed experts as one group kind, routing overhead in the non-GEMM part,
and the experts' GEMMs following the model's own routing (a simulated GPU, no GPU needed)."""

from __future__ import annotations

import pytest
import torch
import transformers

from advisor.energy.meter import GPUState
from advisor.energy.prediction import ModelProfileCostModel, expected_experts_touched
from advisor.energy.profiling import MODEL_SCHEMA as SCHEMA
from advisor.energy.profiling import MODEL_VERSION as VERSION
from advisor.energy.profiling import profile_key
from advisor.energy.runtime import DecoderDims
from advisor.errors import InputError
from advisor.formats import Format
from advisor.models.groups import model_shape
from advisor.plan import Plan

E, K, LAYERS = 32, 4, 4
CONFIG = transformers.Qwen3MoeConfig(vocab_size=4096, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                                     num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                                     head_dim=64, num_experts=E, num_experts_per_tok=K, norm_topk_prob=True)
with torch.device("meta"):
    SHAPE = model_shape(transformers.AutoModelForCausalLM.from_config(CONFIG))
DIMS = DecoderDims.from_config(CONFIG)
STATE = GPUState("NVIDIA H100 80GB HBM3", 0, "580.1", 700.0, 1980, 2619, 40, 0.0, uuid="GPU-a")
UNIFORM = ()
SKEWED = tuple([2 * K / E] * 8 + [K / E * (E - 16) / (E - 8)] * (E - 8))  # 8 hot experts take half the tokens
# energy: idle power over the step, a dynamic power over the non-GEMM kernels, and each GEMM's dynamic energy
# per weight it reads (a routed-experts group: the distinct experts' weights), FP8 cheaper
P_IDLE_W, P_NON_GEMM_W = 100.0, 150.0
J_PER_WEIGHT = {Format.BF16: 4e-9, Format.FP8: 1.5e-9}


def dense_gemm_ms(f: Format, kind: str, rows: float) -> float:
    a, b = {"qkv": (0.004, 2e-5), "o": (0.003, 1e-5)}[kind]
    return a + b * rows if f == Format.BF16 else 0.9 * a + 0.5 * b * rows


def experts_gemm_ms(f: Format, rows: float, load: tuple[float, ...]) -> float:
    """Grouped GEMMs bound by the distinct experts' weights they read, plus a little per token copy."""
    per_expert = 0.002 if f == Format.BF16 else 0.0011
    return 0.003 + per_expert * expected_experts_touched(E, K, rows, load) + 2e-6 * rows * K


def non_gemm_ms(formats: dict[str, Format], rows: float, context: float) -> float:
    """Per layer: attention, norms, and the routing kernels (router, top-k, sort, gathers) a MoE layer adds;
    FP8 groups add a quantization kernel each."""
    fp8 = sum(1 for f in formats.values() if f == Format.FP8)
    return LAYERS * (0.02 + 2e-5 * rows + 1e-7 * rows * context + 0.05 + 1e-5 * rows) + 0.001 * fp8


def read_weights(group, rows: float, load) -> float:
    if not group.name.endswith(".experts"):
        return group.num_weights
    return group.num_weights * expected_experts_touched(E, K, rows, load) / E


def truth(formats: dict[str, Format], rows: float, context: float, load=UNIFORM) -> tuple[float, float]:
    fm = {g.name: formats.get(g.name, Format.BF16) for g in SHAPE.groups}
    t_ng = non_gemm_ms(fm, rows, context)
    t = t_ng
    for name, f in fm.items():
        kind = name.rsplit(".", 1)[-1]
        t += experts_gemm_ms(f, rows, load) if kind == "experts" else dense_gemm_ms(f, kind, rows)
    dynamic = sum(J_PER_WEIGHT[fm[g.name]] * read_weights(g, rows, load) for g in SHAPE.groups)
    return t, (P_IDLE_W * t + P_NON_GEMM_W * t_ng) / 1e3 + dynamic * (1 + rows / 1024)


def simulated_profile(batches=(1, 16, 64, 256), contexts=(256, 768), lengths=(512,), kinds=("qkv", "o", "experts")):
    """What `advisor profile` measures on the simulated GPU: random weights route uniformly."""
    def gemms(xs):
        return {f.value: {k: [experts_gemm_ms(f, x, UNIFORM) if k == "experts" else dense_gemm_ms(f, k, x)
                              for x in xs] for k in kinds} for f in (Format.BF16, Format.FP8)}

    dec = {"batches": list(batches), "contexts": list(contexts), "energy_contexts": list(contexts),
           "gemm_ms": gemms(batches), "step_ms": {}, "j_per_step": {},
           "experts_touched": [expected_experts_touched(E, K, b) for b in batches]}
    pre = {"batch": 1, "lengths": list(lengths), "gemm_ms": gemms(lengths), "step_ms": {}, "j_per_step": {},
           "experts_touched": [expected_experts_touched(E, K, n) for n in lengths]}
    for f in (Format.BF16, Format.FP8):
        uniform = {g.name: f for g in SHAPE.groups}
        dec["step_ms"][f.value] = {str(c): [truth(uniform, b, c)[0] for b in batches] for c in contexts}
        dec["j_per_step"][f.value] = {str(c): [truth(uniform, b, c)[1] for b in batches] for c in contexts}
        pre["step_ms"][f.value] = [truth(uniform, n, n / 2)[0] for n in lengths]
        pre["j_per_step"][f.value] = [truth(uniform, n, n / 2)[1] for n in lengths]
    return {"schema": SCHEMA, "version": VERSION, "key": profile_key(STATE, DIMS.to_dict()), "gpu": STATE.name,
            "gpu_kind": "h100", "driver": STATE.driver, "date": "2026-11-22", "formats": ["bf16", "fp8"],
            "model": DIMS.to_dict(), "decode": dec, "prefill": pre, "measured_at": 1.0, "idle_power_w": P_IDLE_W}


def plans() -> dict[str, Plan]:
    names = [g.name for g in SHAPE.groups]
    return {"experts-fp8": Plan({n: Format.FP8 if n.endswith(".experts") else Format.BF16 for n in names}),
            "attention-fp8": Plan({n: Format.FP8 if n.endswith((".qkv", ".o")) else Format.BF16 for n in names}),
            "layer1-fp8": Plan({n: Format.FP8 if n.startswith("layers.1.") else Format.BF16 for n in names}),
            "fp8": Plan({n: Format.FP8 for n in names})}


def test_the_routed_experts_are_one_priced_group_per_layer_and_routers_are_not_groups():
    kinds = {g.name.rsplit(".", 1)[-1] for g in SHAPE.groups}
    assert kinds == {"qkv", "o", "experts"} and len(SHAPE.groups) == 3 * LAYERS
    assert not any("gate" in m and "experts" not in m for g in SHAPE.groups for m in g.members)


@pytest.mark.parametrize("name", ["experts-fp8", "attention-fp8", "layer1-fp8", "fp8"])
@pytest.mark.parametrize("batch", [1, 16, 32, 256])
def test_mixed_moe_plans_are_predicted_from_the_all_bf16_and_all_fp8_steps(name, batch):
    model = ModelProfileCostModel(simulated_profile(), SHAPE)
    plan = plans()[name]
    ms, j = model.decode_step(plan, batch, 512)  # a context between the profiled ones
    t_true, j_true = truth(dict(plan.formats), batch, 512)
    profiled = batch in (1, 16, 64, 256)
    assert ms == pytest.approx(t_true, rel=1e-6 if profiled else 0.03)
    assert j == pytest.approx(j_true, rel=0.01 if profiled else 0.03)
    _, pj = model.prefill(plan, 512)
    assert pj == pytest.approx(truth(dict(plan.formats), 512, 256)[1], rel=0.01)


def test_the_models_own_routing_moves_the_experts_gemms_and_says_so():
    prof = simulated_profile()
    uniform = ModelProfileCostModel(prof, SHAPE)
    skewed = ModelProfileCostModel(prof, SHAPE.with_expert_load({i: SKEWED for i in range(LAYERS)}))
    assert "profile's routing" in uniform.label and "routing measured on the calibration tokens" in skewed.label
    plan = plans()["experts-fp8"]
    for batch in (16, 64):
        _, j_uniform = uniform.decode_step(plan, batch, 512)
        _, j_skewed = skewed.decode_step(plan, batch, 512)
        j_true = truth(dict(plan.formats), batch, 512, SKEWED)[1]
        assert j_skewed < j_uniform  # a skewed router reads fewer distinct experts per step
        # the uniform steps' dynamic energy follows the weights read, the non-GEMM kernels' part too (two
        # uniform steps cannot separate it), so a skewed routing moves it a little too far: 2.2% here
        assert j_skewed == pytest.approx(j_true, rel=0.03)
    # one token reads exactly top_k experts whatever the routing
    assert skewed.decode_step(plan, 1, 512) == pytest.approx(uniform.decode_step(plan, 1, 512))


def test_a_profile_without_the_experts_kind_is_refused_for_a_moe_model():
    with pytest.raises(InputError, match="experts"):
        ModelProfileCostModel(simulated_profile(kinds=("qkv", "o")), SHAPE)


# Qwen3-30B-A3B's published config.json (its text fields): the shipped H200 per-model profile is of this shape
QWEN3_30B_A3B = dict(attention_bias=False, decoder_sparse_step=1, head_dim=128, hidden_act="silu", hidden_size=2048,
                     intermediate_size=6144, max_position_embeddings=40960, max_window_layers=48, mlp_only_layers=[],
                     moe_intermediate_size=768, norm_topk_prob=True, num_attention_heads=32, num_experts=128,
                     num_experts_per_tok=8, num_hidden_layers=48, num_key_value_heads=4, rms_norm_eps=1e-06,
                     rope_scaling=None, rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=False,
                     use_sliding_window=False, vocab_size=151936)


def test_a_shipped_per_model_profile_prices_its_model_without_a_gpu_and_a_users_own_comes_first(tmp_path):
    from advisor.energy.prediction import make_predicted_model
    from advisor.energy.profiling import ProfileStore
    from advisor.formats import GPU
    from advisor.recipe.schema import Workload

    cfg = transformers.Qwen3MoeConfig(**QWEN3_30B_A3B)
    with torch.device("meta"):
        shape = model_shape(transformers.AutoModelForCausalLM.from_config(cfg))
    store = ProfileStore(tmp_path)
    model = make_predicted_model(shape, GPU.H200, model_config=cfg, store=store)
    assert model.label.startswith("predicted (per-model profile shipped with precision-advisor, NVIDIA H200")
    w = Workload(name="chat", batch_size=16, input_tokens=512, output_tokens=256)
    names = [g.name for g in shape.groups]
    bf16, fp8 = (model.estimate(Plan({n: f for n in names}), w) for f in (Format.BF16, Format.FP8))
    assert fp8.j_per_token < bf16.j_per_token and not bf16.measured
    # no shipped profile for an H100, nor for another shape: the layer profile prices them, and says so
    assert "per-model" not in make_predicted_model(shape, GPU.H100, model_config=cfg, store=store).label
    assert "per-model" not in make_predicted_model(SHAPE, GPU.H200, model_config=CONFIG, store=store).label
    # the user's own profile of the same model and GPU kind is preferred
    own = dict(store.find_for_kind("h200", model.primary.digest))
    own.pop("shipped")
    store.save(own)
    assert make_predicted_model(shape, GPU.H200, model_config=cfg, store=store).label.startswith(
        "predicted (per-model profile, NVIDIA H200")
