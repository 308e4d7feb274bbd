"""The profile cost model and profile files (CPU only, shipped profiles as fixtures)."""

from __future__ import annotations

import json

import pytest

from advisor.energy.prediction import ProfileCostModel
from advisor.energy.profiling import interp, load_profile, shipped_profile, validate_profile
from advisor.errors import InputError, UnsupportedError
from advisor.formats import GPU, Format
from advisor.models.shape import llama_shape
from advisor.plan import Plan
from advisor.recipe.schema import Workload

SHAPE = llama_shape("model.layers", 32, 4096, 14336, 32, 8, 128256, 128)
OTHER = llama_shape("model.layers", 28, 3072, 8192, 24, 8, 128256, 128)  # Llama-3.2-3B: no shipped per-model profile
NAMES = [g.name for g in SHAPE.groups]
BF16 = Plan.uniform(NAMES, Format.BF16)
FP8 = Plan.uniform(NAMES, Format.FP8)
MLP_FP8 = Plan({n: Format.FP8 if n.endswith(("gate_up", "down")) else Format.BF16 for n in NAMES})


@pytest.fixture(scope="module")
def h200():
    prof = shipped_profile(GPU.H200)
    assert prof is not None, "advisor/profiles/h200_*.json is missing"
    return prof


@pytest.fixture(scope="module")
def model(h200):
    return ProfileCostModel(h200, SHAPE)


def test_interp():
    assert interp([1, 2, 4], [10, 20, 40], 3) == pytest.approx(30)
    assert interp([1, 2, 4], [10, 20, 40], 8) == pytest.approx(80)  # extrapolates the last segment
    assert interp([1, 4], [0, 2], 2, log_x=True) == pytest.approx(1)
    assert interp([5], [7], 100) == 7


def test_shipped_h200_profile_is_measured_and_labelled(h200, model):
    assert h200["verified"] is True and h200["source"] == "measured"
    assert "H200" in h200["gpu"] and h200["driver"] and h200["command"]
    assert model.label.startswith("predicted (profile NVIDIA H200, measured ")
    assert model.measured is False
    from advisor.estimate import EnergyModel

    assert isinstance(model, EnergyModel)


def test_shipped_h100_profile_reproduces_its_measurements():
    h100 = shipped_profile(GPU.H100)
    assert h100 is not None and h100["verified"] is True and "H100" in h100["gpu"]
    cm = ProfileCostModel(h100, SHAPE)
    d = h100["decode"]
    for fmt, plan in (("bf16", BF16), ("fp8", FP8)):
        for b, j in zip(d["energy_batches"], d["j_per_step"][fmt], strict=True):
            assert cm.decode_step(plan, b, d["contexts"][0])[1] == pytest.approx(j, rel=1e-6)


@pytest.mark.parametrize("fmt,plan", [("bf16", BF16), ("fp8", FP8)])
def test_uniform_plans_reproduce_the_profile_measurements(h200, model, fmt, plan):
    d = h200["decode"]
    for b, j in zip(d["energy_batches"], d["j_per_step"][fmt], strict=True):
        _, pred = model.decode_step(plan, b, d["contexts"][0])
        assert pred == pytest.approx(j, rel=1e-6)
    p = h200["prefill"]
    for length, j in zip(p["lengths"], p["j_per_step"][fmt], strict=True):
        assert model.prefill(plan, length)[1] == pytest.approx(j, rel=1e-6)


def test_mixed_plan_lies_between_bf16_and_fp8(model):
    for b in (1, 16, 64, 128):
        e_bf16 = model.decode_step(BF16, b, 512)[1]
        e_fp8 = model.decode_step(FP8, b, 512)[1]
        e_mix = model.decode_step(MLP_FP8, b, 512)[1]
        assert e_fp8 < e_mix < e_bf16


def test_energy_per_token_falls_with_batch_and_step_grows_with_context(model):
    per_token = [model.decode_step(FP8, b, 512)[1] / b for b in (1, 8, 16, 32, 64, 128)]
    assert per_token == sorted(per_token, reverse=True)
    assert model.decode_step(BF16, 16, 2048)[0] > model.decode_step(BF16, 16, 512)[0]


def test_estimate_combines_prefill_and_decode(model):
    w = Workload(name="chat", batch_size=16, input_tokens=512, output_tokens=256)
    e = model.estimate(FP8, w)
    _, step_j = model.decode_step(FP8, 16, 512 + 128)
    _, pre_j = model.prefill(FP8, 512)
    assert e.j_per_token == pytest.approx((pre_j + 256 * step_j / 16) / 256)
    assert e.decode_j_per_token == pytest.approx(step_j / 16)
    assert e.prefill_j_per_input_token == pytest.approx(pre_j / 512)
    assert not e.measured and e.source == model.label
    assert model.estimate(FP8, w).j_per_token < model.estimate(BF16, w).j_per_token


def test_nvfp4_on_a_hopper_profile_is_unsupported(model):
    with pytest.raises(UnsupportedError, match="nvfp4"):
        model.estimate(Plan.uniform(NAMES, Format.NVFP4), Workload())


def test_b200_profile_is_unverified_and_supports_nvfp4():
    prof = shipped_profile(GPU.B200)
    assert prof is not None and prof["verified"] is False and prof["source"] == "datasheet-derived"
    cm = ProfileCostModel(prof, SHAPE)
    assert "unverified" in cm.label
    w = Workload(batch_size=64)
    e = {f: cm.estimate(Plan.uniform(NAMES, f), w).j_per_token for f in Format}
    assert e[Format.NVFP4] < e[Format.FP8] < e[Format.BF16]


def test_a_smaller_model_costs_less(model, h200):
    small = llama_shape("model.layers", 16, 2048, 8192, 16, 8, 32000, 128)
    cm = ProfileCostModel(h200, small)
    names = [g.name for g in small.groups]
    w = Workload(batch_size=16)
    assert cm.estimate(Plan.uniform(names, Format.BF16), w).j_per_token < model.estimate(BF16, w).j_per_token


def test_scaled_and_extrapolated_predictions_say_so(model, h200):
    assert "scaled" not in model.label  # the profiled shape itself
    near = ProfileCostModel(h200, llama_shape("model.layers", 16, 2048, 8192, 16, 8, 32000, 128))
    assert "scaled from its Llama-3.1-8B shape" in near.label and "extrapolated" not in near.label
    smollm2 = ProfileCostModel(h200, llama_shape("model.layers", 30, 576, 1536, 9, 3, 49152, 64))
    assert smollm2.per_layer_weight_ratio < 0.02
    assert smollm2.label.endswith(": extrapolated)")


def test_unknown_group_kind_is_an_input_error(h200):
    shape = llama_shape("model.layers", 1, 64, 128, 4, 4, 100)
    bad = type(shape)(
        **{**shape.__dict__, "groups": (*shape.groups[:1], type(shape.groups[0])("x.proj", ("x",), ((64, 64),)))}
    )
    with pytest.raises(InputError, match="profiled kinds"):
        ProfileCostModel(h200, bad)


def test_profile_validation(tmp_path, h200):
    with pytest.raises(InputError, match="schema"):
        validate_profile({"schema": "other"})
    broken = dict(h200)
    del broken["decode"]
    with pytest.raises(InputError, match="decode"):
        validate_profile(broken)
    p = tmp_path / "p.json"
    p.write_text(json.dumps(h200))
    assert load_profile(p)["gpu"] == h200["gpu"]
    p.write_text("{not json")
    with pytest.raises(InputError, match="not JSON"):
        load_profile(p)
    with pytest.raises(InputError, match="cannot read"):
        load_profile(tmp_path / "missing.json")


# -- the --energy choice (advisor/energy/prediction) -------------------------------------


def test_make_energy_model_predicted_uses_the_shipped_profiles():
    from advisor.energy.prediction import make_energy_model

    # the Llama-3.1-8B geometry has per-model profiles shipped for H100 and H200 (means over units): they come first
    for gpu in (GPU.H100, GPU.H200):
        label = make_energy_model("predicted", SHAPE, gpu).label
        assert "per-model profile of the same layer geometry (Llama-3.1-8B) shipped" in label
    # other geometries on H100 and H200: the shipped GPU profiles (GEMM tables + anchors, measured) win over the
    # layer profile
    h100 = make_energy_model("predicted", OTHER, GPU.H100)
    assert h100.label.startswith("predicted (GPU profile NVIDIA H100 80GB HBM3, measured")
    h200 = make_energy_model("predicted", OTHER, GPU.H200)
    assert h200.label.startswith("predicted (GPU profile NVIDIA H200, measured") and "unverified" not in h200.label
    w = Workload(batch_size=16)
    bf16, fp8 = Plan.uniform(OTHER.groups, Format.BF16), Plan.uniform(OTHER.groups, Format.FP8)
    assert h200.estimate(fp8, w).j_per_token < h200.estimate(bf16, w).j_per_token
    # the H200 and H100 tables differ (two GPUs measured), so the predictions do
    assert h200.estimate(bf16, w).j_per_token != h100.estimate(bf16, w).j_per_token
    # B200 keeps the datasheet-derived layer profile, labelled unverified; an FP8 KV cache on H200 falls back
    b200 = make_energy_model("predicted", SHAPE, GPU.B200)
    assert isinstance(b200, ProfileCostModel) and "unverified" in b200.label
    kv = h200.estimate(Plan.uniform(OTHER.groups, Format.FP8, Format.FP8), w)
    assert kv.source.startswith("predicted (profile NVIDIA H200") and "no FP8 KV-cache" in kv.source


def test_make_energy_model_auto_without_a_target_gpu_predicts(monkeypatch):
    from advisor.energy.prediction import _tiers as select

    monkeypatch.setattr(select, "gpu_here", lambda: (None, None))
    m = select.make_energy_model("auto", OTHER, GPU.H200)
    assert m.measured is False and "profile NVIDIA H200" in m.label
    monkeypatch.setattr(select, "gpu_here", lambda: (GPU.H100, "NVIDIA H100 80GB HBM3"))
    assert select.make_energy_model("auto", SHAPE, GPU.H200).measured is False


def test_make_energy_model_rejects_bad_modes_and_mismatched_profiles(tmp_path, h200):
    from advisor.energy.prediction import make_energy_model

    with pytest.raises(InputError, match="--energy"):
        make_energy_model("guess", SHAPE, GPU.H200)
    p = tmp_path / "p.json"
    p.write_text(json.dumps(h200))
    with pytest.raises(InputError, match="target is b200"):
        make_energy_model("predicted", SHAPE, GPU.B200, profile=p)
    assert make_energy_model("predicted", SHAPE, GPU.H200, profile=p).measured is False


def test_measured_without_a_gpu_is_a_setup_error(monkeypatch):
    import torch  # a hard dependency

    from advisor.energy.prediction import make_energy_model
    from advisor.errors import SetupError

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    with pytest.raises(SetupError):
        make_energy_model("measured", SHAPE, GPU.H200)


def test_measure_command_checks_its_flags(tmp_path):
    from advisor.cli.energy import measure

    with pytest.raises(InputError, match="--batch"):
        measure(tmp_path / "plan.json", batch=0)
    with pytest.raises(InputError, match="cannot read plan"):
        measure(tmp_path / "plan.json")
    (tmp_path / "plan.json").write_text(json.dumps({"formats": {"layers.0.qkv": "fp8"}}))
    with pytest.raises(InputError, match="does not match"):
        measure(tmp_path / "plan.json")
    with pytest.raises(InputError, match="--target"):
        measure(tmp_path / "plan.json", target="a100")


def test_cli_energy_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, advisor.cli.energy; print('torch' in sys.modules, 'pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False False"


def test_predicted_falls_back_to_the_roofline_for_layers_no_profile_covers():
    from advisor.energy.prediction import RooflineEnergyModel, make_energy_model
    from advisor.models.shape import ModelShape
    from advisor.plan import LayerGroup

    generic = ModelShape((LayerGroup("encoder.fc1", ("encoder.fc1",), ((64, 256),)),), 1, 64, 4, 4, 16, 100, 6400)
    for gpu in (GPU.H100, GPU.H200):  # the GPU profiles price decoder groups only: an encoder's fc1 is not one
        assert isinstance(make_energy_model("predicted", generic, gpu), RooflineEnergyModel)


def test_fp8_kv_cache_halves_the_context_dependent_part_of_the_decode_step(model):
    fp8_kv = FP8.with_kv_cache(Format.FP8)
    ms = {c: model.decode_step(FP8, 64, c)[0] for c in (512, 2048)}
    ms_kv = {c: model.decode_step(fp8_kv, 64, c)[0] for c in (512, 2048)}
    assert ms_kv[2048] - ms_kv[512] == pytest.approx((ms[2048] - ms[512]) / 2)  # the slope (KV read) halves
    assert 0 < ms[512] - ms_kv[512] < ms[2048] - ms_kv[2048]
    assert model.prefill(fp8_kv, 512) == model.prefill(FP8, 512)
    long = Workload(name="long", batch_size=64, input_tokens=8192, output_tokens=512)
    est = model.estimate(fp8_kv, long)
    assert est.j_per_token < model.estimate(FP8, long).j_per_token
    assert "FP8 KV cache" in est.source and "FP8 KV" not in model.estimate(FP8, long).source


def test_the_kv_read_scales_with_the_kv_cache_s_bytes_per_token_not_with_the_hidden_size(h200):
    """A model of the profiled layers and width with a quarter of its KV heads (or a tensor-parallel shard of it)
    reads a quarter of the KV cache per step: the part of the decode step that grows with the context shrinks 4x,
    while the rest of the non-GEMM time (layers x hidden) stays."""
    fewer = llama_shape("model.layers", 32, 4096, 14336, 32, 2, 128256, 128)
    full, quarter = ProfileCostModel(h200, SHAPE), ProfileCostModel(h200, fewer)
    plan = Plan.uniform([g.name for g in fewer.groups], Format.BF16)

    def growth(cm, p):
        return cm.decode_step(p, 64, 4096)[0] - cm.decode_step(p, 64, 512)[0]

    assert growth(full, BF16) > 0
    assert growth(quarter, plan) == pytest.approx(growth(full, BF16) / 4)
    wider = llama_shape("model.layers", 32, 8192, 28672, 64, 8, 128256, 128)  # twice the width, the same KV heads
    wide_plan = Plan.uniform([g.name for g in wider.groups], Format.BF16)
    assert growth(ProfileCostModel(h200, wider), wide_plan) == pytest.approx(growth(full, BF16))
