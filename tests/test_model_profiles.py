"""Per-model profiles (keying, store, cost model) and their place in the two energy tiers, on a simulated
GPU measured through the real meter (no GPU needed)."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial

import pytest

from advisor.energy.meter import EnergyMeter, GPUState, MeterConfig
from advisor.energy.prediction import ModelProfileCostModel
from advisor.energy.profiling import (
    ALT_FP8,
    LAST_QUARTER_FP8,
    MLP_FP8,
    REFERENCE_SHAPES,
    RUNTIME_VERSION,
    ProfileStore,
    corner_format,
    is_attention,
    key_digest,
    last_quarter_format,
    mixing_format,
    model_digest,
    profile_key,
)
from advisor.energy.profiling import MODEL_SCHEMA as SCHEMA
from advisor.energy.profiling import MODEL_VERSION as VERSION
from advisor.energy.runtime import DecoderDims
from advisor.errors import InputError, UnsupportedError
from advisor.formats import GPU, Format
from advisor.plan import DENSE_GROUP_KINDS, Plan
from advisor.recipe.schema import Workload
from advisor.testing import SimulatedGPU, VirtualClock

REF = REFERENCE_SHAPES["SmolLM2-135M"]
LAYERS = 4
SHAPE = REF.shape(LAYERS)
DIMS = DecoderDims.from_shape(SHAPE)  # what the runtime builds without the model's config
METER = MeterConfig(warmup_s=0.05, min_window_s=0.3, min_ticks=3, repeats=2, idle_s=0.1, depth=64)
# the simulated physics: per-layer GEMM ms (a + b * rows) per format, non-GEMM ms, powers
GEMM = {Format.BF16: {"qkv": (0.004, 2e-5), "o": (0.003, 1e-5), "gate_up": (0.008, 5e-5), "down": (0.005, 3e-5)}}
GEMM[Format.FP8] = {k: (a * 0.9, b * 0.5) for k, (a, b) in GEMM[Format.BF16].items()}
# energy: idle power over the whole step, a dynamic power over the non-GEMM kernels, and each GEMM's dynamic
# energy per weight (bytes read, multiply-adds), FP8 cheaper; GEMM times are latency floors, so a group's share
# of the GEMM time (MLP ~65%) is not its share of the weights (MLP 75%). Attention's FP8 saves more per weight
# than the MLP's (as on an H200 at batch 1: reports/benchmarks/layer_additivity.md), so a kind's share of
# all-FP8's saving is not its share of the weights either.
P_IDLE_W, P_NON_GEMM_W = 100.0, 150.0
J_PER_WEIGHT = {(Format.BF16, False): 4e-9, (Format.FP8, False): 1.5e-9,
                (Format.BF16, True): 4e-9, (Format.FP8, True): 0.2e-9}  # (format, attention)


def gemm_ms(f: Format, kind: str, rows: float) -> float:
    a, b = GEMM[f][kind]
    return a + b * rows


def ng_ms(f: Format, rows: float, context: float, phase: str, quant_ms: float = 0.001) -> float:
    """One layer's non-GEMM ms: a floor, activations, KV (decode) or attention (prefill); FP8 quantizes more."""
    per = 0.02 + 2e-5 * rows + (1e-7 * rows * context if phase == "decode" else 1e-8 * rows * rows)
    return per + (quant_ms if f == Format.FP8 else 0.0)


def mixing(formats: dict[str, Format]) -> float:
    """Per kind, s (1 - s) of the share s of its weights in FP8, weighted by the kind's part of all-FP8's
    dynamic saving: what a simulated GPU that charges for mixing formats across layers charges for."""
    out, saving = 0.0, {}
    for attention in (True, False):
        groups = [g for g in SHAPE.groups if is_attention(g.name) == attention]
        per_weight = J_PER_WEIGHT[Format.BF16, attention] - J_PER_WEIGHT[Format.FP8, attention]
        saving[attention] = per_weight * sum(g.num_weights for g in groups)
    for attention, part in saving.items():
        groups = [g for g in SHAPE.groups if is_attention(g.name) == attention]
        s = sum(g.num_weights for g in groups if formats.get(g.name) == Format.FP8) / sum(g.num_weights for g in groups)
        out += part / sum(saving.values()) * s * (1 - s)
    return out


def truth(formats: dict[str, Format], rows: float, context: float, phase: str,
          mixing_j: float = 0.0, quant_ms: dict[str, float] | None = None,
          last_layer_gain: float = 1.0) -> tuple[float, float]:
    """(ms, J) of a step of any plan on the simulated GPU; ``mixing_j`` x :func:`mixing` more for mixing;
    ``quant_ms``: the non-GEMM ms an FP8 group of each kind adds (default 0.001 for every kind);
    ``last_layer_gain``: how many times its weights' share FP8 saves in the last layer (the last quarter of
    :data:`LAYERS`) at a decode step (as on H100s: the module doc of advisor.energy.profiling)."""
    n = len(SHAPE.groups)
    t_ng = sum(ng_ms(formats.get(g.name, Format.BF16), rows, context, phase,
                     (quant_ms or {}).get(g.name.rsplit(".", 1)[-1], 0.001)) for g in SHAPE.groups) / n * LAYERS
    gb = sum(gemm_ms(Format.BF16, g.name.rsplit(".", 1)[-1], rows) for g in SHAPE.groups
             if formats.get(g.name, Format.BF16) == Format.BF16)
    gf = sum(gemm_ms(Format.FP8, g.name.rsplit(".", 1)[-1], rows) for g in SHAPE.groups
             if formats.get(g.name) == Format.FP8)
    t = t_ng + gb + gf
    def per_weight(g) -> float:
        f, att = formats.get(g.name, Format.BF16), is_attention(g.name)
        last = phase == "decode" and g.name.startswith(f"layers.{LAYERS - 1}.")
        bf16 = J_PER_WEIGHT[Format.BF16, att]
        return bf16 - (bf16 - J_PER_WEIGHT[f, att]) * (last_layer_gain if last else 1.0)

    dynamic = sum(per_weight(g) * g.num_weights for g in SHAPE.groups)
    return t, (P_IDLE_W * t + P_NON_GEMM_W * t_ng) / 1e3 + dynamic * (1 + rows / 1024) + mixing_j * mixing(formats)


def meter_on(gpu: SimulatedGPU, clock: VirtualClock) -> EnergyMeter:
    return EnergyMeter(gpu, METER, clock=clock, sleep=clock.sleep)


def simulated_profile(state: GPUState, batches=(1, 16, 64), contexts=(512, 2048), lengths=(512,),
                      mixing_j: float = 0.0, quant_ms: dict[str, float] | None = None,
                      last_layer_gain: float = 1.0) -> dict:
    """A per-model profile of the simulated GPU: times from its physics, energies through the real meter."""
    clock = VirtualClock()
    gpu = SimulatedGPU(clock, tick_s=0.01, idle_w=P_IDLE_W)
    meter = meter_on(gpu, clock)

    def measure(ms: float, j: float) -> float:
        gpu.step_s, gpu.busy_w = ms / 1e3, j / (ms / 1e3)
        return meter.measure(lambda: gpu.launch()).j_per_step

    dec = {"batches": list(batches), "contexts": list(contexts), "energy_contexts": list(contexts),
           "gemm_ms": {}, "step_ms": {}, "j_per_step": {}}
    pre = {"batch": 1, "lengths": list(lengths), "gemm_ms": {}, "step_ms": {}, "j_per_step": {}}
    for f in (Format.BF16, Format.FP8):
        uniform = {g.name: f for g in SHAPE.groups}
        dec["gemm_ms"][f.value] = {k: [gemm_ms(f, k, b) for b in batches] for k in DENSE_GROUP_KINDS}
        pre["gemm_ms"][f.value] = {k: [gemm_ms(f, k, n) for n in lengths] for k in DENSE_GROUP_KINDS}
        dec["step_ms"][f.value] = {str(c): [truth(uniform, b, c, "decode", quant_ms=quant_ms)[0] for b in batches]
                                   for c in contexts}
        dec["j_per_step"][f.value] = {str(c): [measure(*truth(uniform, b, c, "decode", quant_ms=quant_ms,
                                                              last_layer_gain=last_layer_gain))
                                               for b in batches] for c in contexts}
        pre["step_ms"][f.value] = [truth(uniform, n, n, "prefill", quant_ms=quant_ms)[0] for n in lengths]
        pre["j_per_step"][f.value] = [measure(*truth(uniform, n, n, "prefill", quant_ms=quant_ms)) for n in lengths]
    last = partial(last_quarter_format, num_layers=LAYERS)
    for name, fmt_of in ((MLP_FP8, corner_format), (ALT_FP8, mixing_format), (LAST_QUARTER_FP8, last)):
        corner = {g.name: fmt_of(g.name) for g in SHAPE.groups}

        def at(rows, context, phase, corner=corner):
            return truth(corner, rows, context, phase, mixing_j, quant_ms, last_layer_gain)

        if name != ALT_FP8:  # the mixing point is metered in prefill only
            dec[name] = {"step_ms": {str(c): [at(b, c, "decode")[0] for b in batches] for c in contexts},
                         "j_per_step": {str(c): [measure(*at(b, c, "decode")) for b in batches] for c in contexts}}
        if name != LAST_QUARTER_FP8:  # the position point in decode only
            pre[name] = {"step_ms": [at(n, n, "prefill")[0] for n in lengths],
                         "j_per_step": [measure(*at(n, n, "prefill")) for n in lengths]}
    return {"schema": SCHEMA, "version": VERSION, "key": profile_key(state, DIMS.to_dict()), "gpu": state.name,
            "gpu_kind": "h100", "driver": state.driver, "date": "2026-11-22", "formats": ["bf16", "fp8"],
            "model": DIMS.to_dict(), "decode": dec, "prefill": pre, "measured_at": 1.0,
            "idle_power_w": meter.idle_power_w()}


STATE = GPUState("NVIDIA H100 80GB HBM3", 0, "580.1", 700.0, 1980, 2619, 40, 0.0, uuid="GPU-a")


@pytest.fixture(scope="module")
def profile() -> dict:
    return simulated_profile(STATE)


def plans() -> dict[str, Plan]:
    names = [g.name for g in SHAPE.groups]
    return {"bf16": Plan({n: Format.BF16 for n in names}), "fp8": Plan({n: Format.FP8 for n in names}),
            "mlp": Plan({n: Format.FP8 if n.endswith(("gate_up", "down")) else Format.BF16 for n in names}),
            "layer1": Plan({n: Format.FP8 if n.startswith("layers.1.") else Format.BF16 for n in names}),
            "attention+layer1": Plan({n: Format.FP8 if is_attention(n) or n.startswith("layers.1.") else Format.BF16
                                      for n in names})}


def without_corner(profile: dict) -> dict:
    """The profile as stored before the kind corner was metered."""
    old = json.loads(json.dumps(profile))
    for phase in ("decode", "prefill"):
        old[phase].pop(MLP_FP8)
    return old


# -- keying and the store -----------------------------------------------------------------


def test_the_key_changes_with_the_gpu_unit_its_settings_the_model_and_the_runtime():
    base = profile_key(STATE, DIMS.to_dict())
    assert profile_key(STATE, DIMS.to_dict()) == base
    for other in (replace(STATE, uuid="GPU-b"), replace(STATE, driver="590.0"), replace(STATE, power_limit_w=500.0)):
        assert profile_key(other, DIMS.to_dict()) != base
    assert profile_key(STATE, REF.dims(LAYERS).to_dict())["model"] != base["model"]  # its own layers
    assert profile_key(STATE, DIMS.to_dict(), runtime="older")["runtime"] != base["runtime"]
    assert len({key_digest(base), key_digest(profile_key(replace(STATE, uuid="GPU-b"), DIMS.to_dict()))}) == 2


def test_the_store_reuses_only_an_exact_key_and_predicts_from_the_newest_of_a_kind(tmp_path, profile):
    store = ProfileStore(tmp_path)
    store.save(profile)
    assert store.find(profile["key"], "h100")["key"] == profile["key"]
    other = profile_key(replace(STATE, driver="590.0"), DIMS.to_dict())
    assert store.find(other, "h100") is None
    newer = {**profile, "key": other, "driver": "590.0", "measured_at": 2.0}
    store.save(newer)
    assert store.find_for_kind("h100", model_digest(DIMS.to_dict()))["driver"] == "590.0"
    assert store.find_for_kind("h100", model_digest(DIMS.to_dict()), runtime="other") is None
    assert store.find_for_kind("h200", model_digest(DIMS.to_dict())) is None
    (store.path_for(profile).parent / "broken.json").write_text("{")
    assert store.find(profile["key"], "h100") is not None  # a damaged file is skipped, not fatal
    assert profile["key"]["runtime"] == RUNTIME_VERSION


def test_the_same_model_read_from_a_gguf_file_keys_as_from_its_hf_config():
    """The demo GGUF stores SmolLM2-135M-Instruct's rms_norm_eps (1e-05) as float32; its digest must still be the
    one the HF config gives, so a profile measured from either is found for the other."""
    from transformers import AutoConfig, LlamaConfig

    from advisor.models.loading import _demo_location

    where, gguf = _demo_location()
    from_gguf = AutoConfig.from_pretrained(where, gguf_file=gguf)
    assert from_gguf.rms_norm_eps != 1e-5  # float32's nearest value, not 1e-05
    from_hf = LlamaConfig(**{k: getattr(from_gguf, k) for k in (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "vocab_size", "tie_word_embeddings", "hidden_act")}, rms_norm_eps=1e-5)
    digests = {model_digest(DecoderDims.from_config(c).to_dict()) for c in (from_gguf, from_hf)}
    assert len(digests) == 1
    other = LlamaConfig(**{**from_hf.to_dict(), "rms_norm_eps": 1e-6})
    assert model_digest(DecoderDims.from_config(other).to_dict()) not in digests


# -- the cost model ---------------------------------------------------------------------------


def test_a_prefill_that_mixes_formats_across_layers_is_bent_by_the_mixing_point_and_a_decode_step_is_not():
    """A simulated GPU that charges for mixing formats across layers (a fifth of all-FP8's saving at the mixing
    point): the profile's mixing point bends a prefill's line between all-BF16 and all-FP8, so mixed plans'
    prefills come within 1%, and miss by more than 2% from the same profile without that point; plans that mix
    nothing move not at all. Decode steps stay on the line either way: on H100s the point's decode deviation
    came from which layers it holds, and bent contiguous plans the wrong way (profile_point_trials.md)."""
    uniform = {f: truth({g.name: f for g in SHAPE.groups}, 512, 512, "prefill")[1] for f in (Format.BF16, Format.FP8)}
    mixing_j = 0.2 * (uniform[Format.BF16] - uniform[Format.FP8]) / mixing(
        {g.name: mixing_format(g.name) for g in SHAPE.groups})
    bent = simulated_profile(STATE, mixing_j=mixing_j)
    straight = json.loads(json.dumps(bent))
    straight["prefill"].pop(ALT_FP8)
    with_point, without = ModelProfileCostModel(bent, SHAPE), ModelProfileCostModel(straight, SHAPE)
    assert "no mixing point" in without.label and "no mixing point" not in with_point.label
    for name in ("layer1", "attention+layer1"):
        plan = plans()[name]
        j_true = truth(dict(plan.formats), 512, 512, "prefill", mixing_j)[1]
        assert with_point.prefill(plan, 512)[1] == pytest.approx(j_true, rel=0.01)
        assert abs(without.prefill(plan, 512)[1] / j_true - 1) > 0.02
        assert with_point.decode_step(plan, 16, 640) == pytest.approx(without.decode_step(plan, 16, 640), rel=1e-9)
    for name in ("bf16", "fp8", "mlp"):
        plan = plans()[name]
        assert with_point.prefill(plan, 512) == pytest.approx(without.prefill(plan, 512), rel=1e-9)


def test_the_position_point_shares_a_decode_saving_between_the_last_quarter_and_the_other_layers():
    """A simulated GPU whose last layer (the last quarter of four) saves three times its weights' share in FP8 at a
    decode step: with the profile's position point, plans holding other layers in FP8 (the middle two, the first
    and last, attention everywhere plus one layer) come within 1% at every batch; from the same profile without
    the point they miss by more than 3%. The profiled plans are unchanged, and prefills (no position point) too."""
    names = [g.name for g in SHAPE.groups]
    layouts = (lambda n: n.split(".")[1] in ("1", "2"), lambda n: n.split(".")[1] in ("0", "3"),  # middle, outer
               lambda n: is_attention(n) or n.startswith("layers.1."))
    with_point = simulated_profile(STATE, last_layer_gain=3.0)
    stored_before = json.loads(json.dumps(with_point))
    stored_before["decode"].pop(LAST_QUARTER_FP8)
    model, old = ModelProfileCostModel(with_point, SHAPE), ModelProfileCostModel(stored_before, SHAPE)
    assert "no position point" in old.label and "no position point" not in model.label
    for in_fp8 in layouts:
        plan = Plan({n: Format.FP8 if in_fp8(n) else Format.BF16 for n in names})
        for batch in (1, 16, 64):
            j_true = truth(dict(plan.formats), batch, 640, "decode", last_layer_gain=3.0)[1]
            assert model.decode_step(plan, batch, 640)[1] == pytest.approx(j_true, rel=0.01)
            assert abs(old.decode_step(plan, batch, 640)[1] / j_true - 1) > 0.03
        assert model.prefill(plan, 512) == pytest.approx(old.prefill(plan, 512), rel=1e-9)
    for name in ("bf16", "fp8", "mlp"):
        assert model.decode_step(plans()[name], 16, 640)[1] == pytest.approx(
            old.decode_step(plans()[name], 16, 640)[1], rel=1e-9)


@pytest.mark.parametrize("name", ["bf16", "fp8", "mlp", "layer1", "attention+layer1"])
@pytest.mark.parametrize("batch", [1, 16, 40, 64])
def test_any_plan_is_predicted_within_a_percent_of_the_simulated_gpu(profile, name, batch):
    model = ModelProfileCostModel(profile, SHAPE)
    plan = plans()[name]
    context = 640  # between the profiled contexts
    ms, j = model.decode_step(plan, batch, context)
    t_true, j_true = truth(dict(plan.formats), batch, context, "decode")
    assert ms == pytest.approx(t_true, rel=1e-6) if batch in (1, 16, 64) else ms == pytest.approx(t_true, rel=0.02)
    assert j == pytest.approx(j_true, rel=0.01)
    _, pj = model.prefill(plan, 512)
    assert pj == pytest.approx(truth(dict(plan.formats), 512, 512, "prefill")[1], rel=0.01)


@pytest.mark.parametrize("name", ["mlp", "attention+layer1"])
def test_without_the_kind_corner_a_kind_heavy_plan_is_priced_by_its_weights_and_misses(profile, name):
    """Stored before the corner (or fed a GPU where kinds save in proportion to weights), the cost model shares
    all-FP8's saving by weight; on a GPU where attention saves more per weight, that misses such plans."""
    plan = plans()[name]
    j_true = truth(dict(plan.formats), 16, 640, "decode")[1]
    j_old = ModelProfileCostModel(without_corner(profile), SHAPE).decode_step(plan, 16, 640)[1]
    j_new = ModelProfileCostModel(profile, SHAPE).decode_step(plan, 16, 640)[1]
    assert abs(j_new / j_true - 1) < 0.01 < abs(j_old / j_true - 1)
    assert "no kind corner" in ModelProfileCostModel(without_corner(profile), SHAPE).label
    assert "no kind corner" not in ModelProfileCostModel(profile, SHAPE).label
    uniform = plans()["fp8"]
    assert ModelProfileCostModel(without_corner(profile), SHAPE).decode_step(uniform, 16, 640)[1] == pytest.approx(
        ModelProfileCostModel(profile, SHAPE).decode_step(uniform, 16, 640)[1], rel=1e-9)


def test_the_kind_corner_moves_the_non_gemm_time_by_kind():
    """On a GPU where an FP8 MLP group adds five times the non-GEMM time an FP8 attention group does (its
    activation quantization is wider), the corner's own step time comes back as profiled and a kind-heavy plan's
    time is exact; shared over all groups alike (a profile without the corner), both miss by more than 1%."""
    quant_ms = {"qkv": 0.001, "o": 0.001, "gate_up": 0.005, "down": 0.005}
    prof = simulated_profile(STATE, quant_ms=quant_ms)
    with_corner, without = ModelProfileCostModel(prof, SHAPE), ModelProfileCostModel(without_corner(prof), SHAPE)
    for name in ("mlp", "attention+layer1"):
        plan = plans()[name]
        t_true = truth(dict(plan.formats), 16, 640, "decode", quant_ms=quant_ms)[0]
        assert with_corner.decode_step(plan, 16, 640)[0] == pytest.approx(t_true, rel=1e-6)
        assert abs(without.decode_step(plan, 16, 640)[0] / t_true - 1) > 0.01
        assert with_corner.prefill(plan, 512)[0] == pytest.approx(
            truth(dict(plan.formats), 512, 512, "prefill", quant_ms=quant_ms)[0], rel=1e-6)


@pytest.mark.parametrize("name", ["bf16", "fp8"])
def test_a_uniform_steps_joules_are_linear_in_the_context_between_the_profiled_ones(profile, name):
    """A decode step's time and J grow linearly with the KV bytes it reads; its power does not. With the
    long-context steps drawing far more power (as SmolLM2-135M's batch 64 did on an H100: 277 W at context
    320, 382 W at 1280), interpolating the power and multiplying by the time would put a mid-context step
    low; the J of a uniform plan is the line between the profiled J."""
    hot = json.loads(json.dumps(profile))
    for f in ("bf16", "fp8"):
        hot["decode"]["j_per_step"][f]["2048"] = [2 * j for j in hot["decode"]["j_per_step"][f]["2048"]]
    model = ModelProfileCostModel(hot, SHAPE)
    plan = plans()[name]
    for i, batch in enumerate((1, 16, 64)):
        j512, j2048 = (hot["decode"]["j_per_step"][name][c][i] for c in ("512", "2048"))
        assert model.decode_step(plan, batch, 512)[1] == pytest.approx(j512, rel=1e-9)
        assert model.decode_step(plan, batch, 2048)[1] == pytest.approx(j2048, rel=1e-9)
        assert model.decode_step(plan, batch, 1280)[1] == pytest.approx((j512 + j2048) / 2, rel=1e-9)


def test_the_label_counts_the_profile_points_the_meter_could_not_steady(profile):
    assert "unstable" not in ModelProfileCostModel(profile, SHAPE).label  # no CVs recorded: none counted
    shaky = json.loads(json.dumps(profile))
    for phase in ("decode", "prefill"):
        shaky[phase]["cv"] = {f: ({c: [0.002] * len(v) for c, v in shaky[phase]["j_per_step"][f].items()}
                                  if phase == "decode" else [0.002] * len(shaky[phase]["j_per_step"][f]))
                              for f in ("bf16", "fp8")}
    assert "unstable" not in ModelProfileCostModel(shaky, SHAPE).label
    shaky["decode"]["cv"]["fp8"]["2048"][0] = 0.093
    assert "1 of its 14 metered points unstable" in ModelProfileCostModel(shaky, SHAPE).label
    shaky["prefill"][MLP_FP8]["cv"] = [0.02]  # the kind corner's points count too
    shaky["decode"][MLP_FP8]["cv"] = {c: [0.002] * len(v) for c, v in shaky["decode"][MLP_FP8]["j_per_step"].items()}
    assert "2 of its 21 metered points unstable" in ModelProfileCostModel(shaky, SHAPE).label


def test_the_label_gives_the_temperatures_the_profile_was_metered_at(profile):
    assert " C" not in ModelProfileCostModel(profile, SHAPE).label  # stored before temperatures were
    warm = json.loads(json.dumps(profile))
    for phase in ("decode", "prefill"):
        warm[phase]["temperature_c"] = {f: ({c: [50.0] * len(v) for c, v in warm[phase]["j_per_step"][f].items()}
                                            if phase == "decode" else [50.0] * len(warm[phase]["j_per_step"][f]))
                                        for f in ("bf16", "fp8")}
    warm["prefill"]["temperature_c"]["bf16"][0] = 57.5
    warm["decode"]["temperature_c"]["fp8"]["512"][1] = 47.0
    assert "; metered at 47-58 C" in ModelProfileCostModel(warm, SHAPE).label


def test_fp8_saves_where_the_simulated_gpu_saves_and_the_estimate_is_labelled(profile):
    model = ModelProfileCostModel(profile, SHAPE)
    w = Workload(name="chat", batch_size=16, input_tokens=512, output_tokens=256)
    bf16, fp8, mlp = (model.estimate(plans()[k], w) for k in ("bf16", "fp8", "mlp"))
    assert fp8.j_per_token < mlp.j_per_token < bf16.j_per_token
    assert not fp8.measured and fp8.source.startswith("predicted (per-model profile, NVIDIA H100")


def test_the_profile_refuses_another_model_and_what_it_did_not_measure(profile):
    with pytest.raises(InputError, match="4-layer"):
        ModelProfileCostModel(profile, REF.shape(LAYERS + 2))
    model = ModelProfileCostModel(profile, SHAPE)
    with pytest.raises(UnsupportedError, match="KV"):
        model.decode_step(Plan(dict(plans()["bf16"].formats), kv_cache=Format.FP8), 16, 640)
    nvfp4 = Plan({g.name: Format.NVFP4 for g in SHAPE.groups})
    with pytest.raises(UnsupportedError, match="nvfp4"):
        model.decode_step(nvfp4, 16, 640)


# -- the two tiers: a search on a GPU of the target kind builds the profile once, then reuses it


class FakeMeasured:
    """The measured tier on a simulated GPU (what make_energy_tiers builds from the runtime)."""

    label, measured = "measured (simulated)", True

    def __init__(self, shape, target=None, model_config=None, state=STATE) -> None:
        self.dims, self._bench = DIMS, object()
        clock = VirtualClock()
        self.meter = meter_on(SimulatedGPU(clock, tick_s=0.01), clock)
        self.meter.counter.state = lambda: state

    free_total = (80 << 30, 80 << 30)

    def bench(self, positions: int):
        return self._bench

    def check_fits(self, workloads):
        from advisor.energy.measure import check_fits

        check_fits(SHAPE, workloads, *self.free_total)

    def estimate(self, plan, workload):
        raise AssertionError("not called here")


def test_a_measured_search_builds_the_per_model_profile_once_and_reuses_it(tmp_path, monkeypatch):
    from advisor.energy import measure
    from advisor.energy.prediction import _tiers as select
    from advisor.energy.profiling import _model as model_profile

    built: list[dict] = []

    def fake_measure(dims, batches, contexts, prefill_lengths, meter, bench, command, log):
        assert dims == DIMS and 16 in batches and min(contexts) <= 640 <= max(contexts)
        built.append(simulated_profile(meter.counter.state(), batches, contexts, prefill_lengths))
        return built[-1]

    monkeypatch.setattr(model_profile, "measure_model_profile", fake_measure)
    monkeypatch.setattr(measure, "MeasuredEnergyModel", FakeMeasured)
    store = ProfileStore(tmp_path)
    w = [Workload(name="chat", batch_size=16, input_tokens=512, output_tokens=256)]
    predicted, measured = select.make_energy_tiers("measured", SHAPE, GPU.H100, workloads=w, store=store)
    assert len(built) == 1 and measured.measured and "per-model profile" in predicted.label
    select.make_energy_tiers("measured", SHAPE, GPU.H100, workloads=w, store=store)
    assert len(built) == 1  # reused: same GPU, driver, power limit, model and runtime
    est = predicted.estimate(plans()["mlp"], w[0])
    assert est.j_per_token == pytest.approx(ModelProfileCostModel(built[0], SHAPE).estimate(plans()["mlp"], w[0])
                                            .j_per_token)
    # an FP8 KV cache is not in the profile: priced by the fallback, labelled, never an abort
    kv = predicted.estimate(Plan(dict(plans()["mlp"].formats), kv_cache=Format.FP8), w[0])
    assert "not in predicted (per-model profile" in kv.source
    # without a GPU, predicted uses the stored per-model profile of a GPU of the target kind
    monkeypatch.setattr(select, "gpu_here", lambda: (None, None))
    alone, none = select.make_energy_tiers("auto", SHAPE, GPU.H100, workloads=w, store=store)
    assert none is None and "per-model profile" in alone.label
    other, _ = select.make_energy_tiers("auto", SHAPE, GPU.H200, workloads=w, store=store)
    assert "per-model profile" not in other.label


def test_a_per_model_profile_given_as_a_file_is_used_and_checked(tmp_path, profile):
    from advisor.energy.prediction import make_energy_model

    p = tmp_path / "p.json"
    p.write_text(json.dumps(profile))
    m = make_energy_model("predicted", SHAPE, GPU.H100, profile=p)
    assert "per-model profile" in m.label
    with pytest.raises(InputError, match="target is h200"):
        make_energy_model("predicted", SHAPE, GPU.H200, profile=p)


def test_a_model_whose_measurement_does_not_fit_the_gpu_is_refused_or_predicted(tmp_path, monkeypatch):
    from advisor.energy import measure
    from advisor.energy.measure import WORKSPACE_BYTES, bench_bytes
    from advisor.energy.prediction import _tiers as select
    from advisor.energy.profiling import _model as model_profile

    w = [Workload(name="chat", batch_size=16, input_tokens=512, output_tokens=256),
         Workload(name="long", batch_size=4, input_tokens=8000, output_tokens=192)]
    need = bench_bytes(SHAPE, w)
    weights = 2 * (SHAPE.quantizable_weights + SHAPE.vocab_size * SHAPE.hidden_size * 2) + SHAPE.quantizable_weights
    assert need - WORKSPACE_BYTES - weights == pytest.approx(4 * SHAPE.kv_bytes(8193))  # the larger KV cache

    class Small(FakeMeasured):
        free_total = (need - 1, 80 << 30)

    monkeypatch.setattr(measure, "MeasuredEnergyModel", Small)
    with pytest.raises(UnsupportedError, match=r"GiB of GPU memory .* use --energy predicted"):
        select.make_energy_tiers("measured", SHAPE, GPU.H100, workloads=w, store=ProfileStore(tmp_path))
    monkeypatch.setattr(select, "gpu_here", lambda: (GPU.H100, "NVIDIA H100 80GB HBM3"))
    predicted, measured = select.make_energy_tiers("auto", SHAPE, GPU.H100, workloads=w, store=ProfileStore(tmp_path))
    assert measured is None and predicted.label.startswith("predicted")
    Small.free_total = (need, 80 << 30)
    monkeypatch.setattr(model_profile, "measure_model_profile",
                        lambda dims, batches, contexts, prefill_lengths, meter, bench, command, log:
                        simulated_profile(meter.counter.state(), batches, contexts, prefill_lengths))
    _, measured = select.make_energy_tiers("auto", SHAPE, GPU.H100, workloads=w, store=ProfileStore(tmp_path))
    assert measured is not None  # just fits


def test_a_search_profiles_the_contexts_its_decode_steps_visit():
    """From the shortest input to the longest input plus output: the cost model interpolates inside what was
    metered, and a stored profile whose contexts bracket them is reused."""
    from advisor.energy.profiling import covers, profile_regime

    chat = Workload(name="chat", batch_size=16, input_tokens=512, output_tokens=256)
    regime = profile_regime([chat])
    assert regime == {"batches": (16,), "contexts": (512, 768), "prefill_lengths": (512,)}
    long = Workload(name="long", batch_size=1, input_tokens=128, output_tokens=1024)
    assert profile_regime([chat, long])["contexts"] == (128, 1152)
    wide = {"decode": {"batches": [1, 16, 64], "contexts": [320, 1280]}, "prefill": {"lengths": [512]}}
    assert covers(wide, regime) and not covers(wide, profile_regime([long]))


def test_a_metered_point_keeps_the_records_a_profile_stores():
    """What measure_model_profile (and the benchmarks that meter points beside it) keep of one metered step."""
    from types import SimpleNamespace

    from advisor.energy.profiling import metered_step

    clock = VirtualClock()
    gpu = SimulatedGPU(clock, tick_s=0.01, idle_w=P_IDLE_W)
    gpu.step_s, gpu.busy_w = 0.002, 300.0
    record = metered_step(meter_on(gpu, clock), SimpleNamespace(launch=gpu.launch, tokens_per_step=1.0), "point")
    assert set(record) == {"j", "w", "s", "cv", "t"}
    assert record["j"] == pytest.approx(0.6, rel=0.02) and record["w"] == pytest.approx(300.0, rel=0.02)
    assert record["s"] == pytest.approx(0.002, rel=0.02) and record["cv"] < 0.01
