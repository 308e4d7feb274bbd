"""Per-model profiles found by layer geometry, averaged over GPU units, and the ones shipped in the package."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from test_model_profiles import DIMS, SHAPE, STATE, plans, simulated_profile

from advisor.energy.prediction import ModelProfileCostModel
from advisor.energy.profiling import (
    LAST_QUARTER_FP8,
    POINTS,
    REFERENCE_SHAPES,
    RUNTIME_VERSION,
    ProfileStore,
    geometry_digest,
    mean_profile,
    model_digest,
    shipped_model_profiles,
)
from advisor.energy.runtime import DecoderDims
from advisor.errors import InputError
from advisor.formats import GPU


def scaled(value, scale: float):
    if isinstance(value, dict):
        return {k: scaled(v, scale) for k, v in value.items()}
    return [x * scale for x in value]


def unit(uuid: str, scale: float) -> dict:
    """The simulated profile as metered on another GPU unit that draws ``scale`` times the energy."""
    p = json.loads(json.dumps(simulated_profile(replace(STATE, uuid=uuid))))
    for phase in ("decode", "prefill"):
        for section in (p[phase], *(p[phase][c] for c in POINTS if c in p[phase])):
            section["j_per_step"] = scaled(section["j_per_step"], scale)
    return p


@pytest.fixture(scope="module")
def two_units() -> list[dict]:
    return [unit("GPU-a", 1.0), unit("GPU-b", 1.1)]


def renamed(dims_dict: dict, **changes) -> dict:
    return {**dims_dict, **changes}


# -- geometry ---------------------------------------------------------------------------------------


def test_the_geometry_ignores_names_and_norm_constants_but_not_any_shape():
    base = DIMS.to_dict()
    other_name = renamed(base, family="Fine-tune", model_type="qwen2", rms_eps=1e-6)
    assert model_digest(other_name) != model_digest(base)
    assert geometry_digest(other_name) == geometry_digest(base)
    wider = DecoderDims.from_shape(replace(SHAPE, hidden_size=SHAPE.hidden_size + 64)).to_dict()
    assert geometry_digest(wider) != geometry_digest(base)
    untied = renamed(base, tied_embeddings=not base["tied_embeddings"])
    assert geometry_digest(untied) != geometry_digest(base)


def test_the_demo_model_has_the_geometry_of_the_shape_the_shipped_profiles_measured():
    """SmolLM2-135M-Instruct read from its GGUF file (family, eps from the file) and the reference shape that
    energy_transfer_collect.py ran on random weights: different models by digest, the same kernels."""
    from transformers import AutoConfig

    from advisor.models.loading import _demo_location

    where, gguf = _demo_location()
    real = DecoderDims.from_config(AutoConfig.from_pretrained(where, gguf_file=gguf)).to_dict()
    measured = REFERENCE_SHAPES["SmolLM2-135M"].dims().to_dict()
    assert model_digest(real) != model_digest(measured)
    assert geometry_digest(real) == geometry_digest(measured)


LLAMA3_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_type": "llama3"}
#: the published configs' fields that shape a step (hub ids in the comments), as a user's config.json gives them
PUBLISHED = {
    "SmolLM2-360M": ("llama", dict(  # HuggingFaceTB/SmolLM2-360M-Instruct
        hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15, num_key_value_heads=5,
        vocab_size=49152, max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=1e5, tie_word_embeddings=True)),
    "Qwen2.5-0.5B": ("qwen2", dict(  # Qwen/Qwen2.5-0.5B-Instruct: q/k/v biases, sliding window off
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1e6,
        tie_word_embeddings=True, sliding_window=32768, use_sliding_window=False)),
    "Llama-3.2-1B": ("llama", dict(  # meta-llama/Llama-3.2-1B-Instruct
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        head_dim=64, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=5e5,
        rope_scaling={**LLAMA3_ROPE, "factor": 32.0}, tie_word_embeddings=True)),
    "Llama-3.1-8B": ("llama", dict(  # meta-llama/Llama-3.1-8B-Instruct
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=5e5,
        rope_scaling=LLAMA3_ROPE, tie_word_embeddings=False)),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_configs_have_the_geometry_of_the_shapes_measured(name):
    from transformers import AutoConfig

    model_type, fields = PUBLISHED[name]
    real = DecoderDims.from_config(AutoConfig.for_model(model_type, **fields)).to_dict()
    measured = REFERENCE_SHAPES[name].dims().to_dict()
    assert geometry_digest(real) == geometry_digest(measured)
    fewer = {**fields, "num_hidden_layers": fields["num_hidden_layers"] - 1}
    one_layer_less = AutoConfig.for_model(model_type, **fewer)
    assert geometry_digest(DecoderDims.from_config(one_layer_less).to_dict()) != geometry_digest(measured)


def test_q_k_v_biases_are_part_of_the_geometry():
    ref = REFERENCE_SHAPES["Qwen2.5-0.5B"]
    assert geometry_digest(replace(ref, qkv_bias=False).dims().to_dict()) != geometry_digest(ref.dims().to_dict())


# -- the store ---------------------------------------------------------------------------------------


def test_the_store_takes_the_models_own_profile_before_one_of_the_same_geometry(tmp_path, two_units):
    own, shipped = ProfileStore(tmp_path / "own", shipped=tmp_path / "shipped"), tmp_path / "shipped"
    twin = {**two_units[1], "model": renamed(DIMS.to_dict(), family="Twin", rms_eps=1e-6)}
    twin["key"] = {**twin["key"], "model": model_digest(twin["model"])}
    ProfileStore(shipped).save(twin)
    digest, geometry = model_digest(DIMS.to_dict()), geometry_digest(DIMS.to_dict())
    assert own.find_for_kind("h100", digest) is None  # by digest alone, a twin is not this model
    found = own.find_for_kind("h100", digest, geometry=geometry)
    assert found["same_geometry"] and found["shipped"] and found["model"]["family"] == "Twin"
    assert own.find_for_kind("h200", digest, geometry=geometry) is None
    ProfileStore(shipped).save(two_units[0])  # this model's own, shipped
    found = own.find_for_kind("h100", digest, geometry=geometry)
    assert found["shipped"] and "same_geometry" not in found
    own.save({**twin, "measured_at": 0.5})  # the user's own profile of a twin comes before anything shipped
    found = own.find_for_kind("h100", digest, geometry=geometry)
    assert found["same_geometry"] and "shipped" not in found


# -- the mean over units ---------------------------------------------------------------------------


def test_the_mean_of_two_units_prices_between_them_and_names_them(two_units):
    mean = mean_profile(two_units, runtime=RUNTIME_VERSION, command="python x.py")
    assert [u["gpu_uuid"] for u in mean["units"]] == ["GPU-a", "GPU-b"]
    assert mean["key"]["gpu_uuid"] is None and mean["gpu_uuid"] is None
    models = [ModelProfileCostModel(p, SHAPE) for p in (*two_units, mean)]
    for plan in plans().values():  # the mixing bend weighs kinds by ratios of savings: equal to within 1e-6
        a, b, m = (model.decode_step(plan, 16, 640)[1] for model in models)
        assert m == pytest.approx((a + b) / 2, rel=1e-6) and a != pytest.approx(b, rel=0.05)
        a, b, m = (model.prefill(plan, 512)[1] for model in models)
        assert m == pytest.approx((a + b) / 2, rel=1e-6)
    label = ModelProfileCostModel({**mean, "shipped": True, "same_geometry": True, "caveat": "within 4%"},
                                  SHAPE).label
    assert "same layer geometry" in label and "shipped" in label and "mean of 2 GPU units" in label
    assert label.endswith("; within 4%)")


def test_the_mean_refuses_profiles_it_cannot_average(two_units):
    a, b = two_units
    with pytest.raises(InputError, match="same GPU unit"):
        mean_profile([a, a], runtime=RUNTIME_VERSION, command="")
    fewer = json.loads(json.dumps(b))
    fewer["decode"]["batches"] = [1, 16, 32]
    with pytest.raises(InputError, match="differ"):
        mean_profile([a, fewer], runtime=RUNTIME_VERSION, command="")
    wider = {**b, "model": DecoderDims.from_shape(replace(SHAPE, hidden_size=640)).to_dict()}
    with pytest.raises(InputError, match="geometry"):
        mean_profile([a, wider], runtime=RUNTIME_VERSION, command="")
    with pytest.raises(InputError, match="gpu_kind"):
        mean_profile([a, {**b, "gpu_kind": "h200"}], runtime=RUNTIME_VERSION, command="")


def test_a_unit_profiled_before_the_position_point_averages_with_later_ones_on_their_common_points(two_units):
    a, b = two_units
    assert LAST_QUARTER_FP8 in a["decode"] and LAST_QUARTER_FP8 in b["decode"]
    older = json.loads(json.dumps(b))
    older["decode"].pop(LAST_QUARTER_FP8)
    mean = mean_profile([a, older], runtime=RUNTIME_VERSION, command="")
    assert LAST_QUARTER_FP8 not in mean["decode"] and "no position point" in ModelProfileCostModel(mean, SHAPE).label
    both = mean_profile([a, b], runtime=RUNTIME_VERSION, command="")
    assert both["decode"][LAST_QUARTER_FP8]["j_per_step"] != a["decode"][LAST_QUARTER_FP8]["j_per_step"]


# -- what the package ships -------------------------------------------------------------------------


def shipped_files() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(shipped_model_profiles().glob("*/*/*.json"))]


def test_every_shipped_profile_is_found_for_a_model_of_its_geometry():
    profiles = [p for p in shipped_files() if p.get("units")]
    for kind in ("h100", "h200"):
        assert {p["model"]["family"] for p in profiles if p["gpu_kind"] == kind} >= {"SmolLM2-135M", *PUBLISHED}
    for p in profiles:
        assert len(p["units"]) >= 2 and p["key"]["runtime"] == RUNTIME_VERSION and p.get("caveat")
        twin = renamed(p["model"], family="a fine-tune", rms_eps=1e-6)
        found = ProfileStore(root="/nonexistent").find_for_kind(p["gpu_kind"], model_digest(twin),
                                                                 geometry=geometry_digest(twin))
        assert found is not None and geometry_digest(found["model"]) == geometry_digest(p["model"])


def test_the_demo_model_is_priced_from_its_shipped_profile_on_an_h100(tmp_path, monkeypatch):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from advisor.energy.prediction import make_predicted_model
    from advisor.models.adapters.geometry import model_shape
    from advisor.models.loading import _demo_location

    monkeypatch.setenv("ADVISOR_PROFILE_DIR", str(tmp_path))  # no profile of the user's own
    where, gguf = _demo_location()
    config = AutoConfig.from_pretrained(where, gguf_file=gguf)
    with torch.device("meta"):
        shape = model_shape(AutoModelForCausalLM.from_config(config))
    for target in (GPU.H100, GPU.H200):
        label = make_predicted_model(shape, target, model_config=config).label
        assert "per-model profile of the same layer geometry (SmolLM2-135M) shipped" in label, label
        assert "GPU profile" not in label


def test_a_profile_of_one_prompt_length_scales_other_prompts_per_token_and_says_so(two_units):
    """A stored or shipped profile was measured for other workloads: a 2048-token prompt must not cost what the
    profiled 512-token one did, and what lies outside the profiled points is named in the label."""
    from advisor.recipe.schema import Workload

    model = ModelProfileCostModel(two_units[0], SHAPE)
    plan = plans()["mlp"]
    ms, j = model.prefill(plan, 512)
    assert model.prefill(plan, 2048) == pytest.approx((4 * ms, 4 * j))
    inside = model.estimate(plan, Workload(batch_size=16, input_tokens=512, output_tokens=256)).source
    assert "extrapolated" not in inside and "scaled" not in inside and inside == model.label
    outside = model.estimate(plan, Workload(batch_size=128, input_tokens=2048, output_tokens=256)).source
    assert outside.endswith("; batch 128 extrapolated from the profiled 1-64; prefill scaled per token from "
                            "512-token prompts)")
