"""Shipped GPU profiles (GEMM tables + anchor models): the fit, the power limit, the table, the choice."""

from __future__ import annotations

import pytest

from advisor.energy.prediction import GpuProfileCostModel, at_power_limit, energy_features, fit_gpu_profile, ng_features
from advisor.energy.profiling import FORMATS, REFERENCE_SHAPES, GemmTable, Geometry, nk_key, step_parts
from advisor.energy.profiling import GPU_SCHEMA as SCHEMA
from advisor.energy.profiling import GPU_VERSION as VERSION
from advisor.formats import GPU, Format
from advisor.plan import Plan
from advisor.recipe.schema import Workload

M = [1, 4, 16, 64, 256, 1024]
ANCHORS = {"SmolLM2-360M": 6, "Llama-3.2-1B": 4, "Qwen2.5-1.5B": 5, "Qwen2.5-14B": 2}
TEST = REFERENCE_SHAPES["Qwen2.5-0.5B"]
# ground truth: per-layer floor, per activation byte, per KV byte (decode) or attention FLOP (prefill), and a
# constant per step that is the same in both formats (embedding, final norm, launch)
NG = {("decode", Format.BF16): [0.011, 1e-9, 3e-10, 0.03], ("decode", Format.FP8): [0.014, 2e-9, 3e-10, 0.03],
      ("prefill", Format.BF16): [0.013, 1e-9, 8e-12, 0.3], ("prefill", Format.FP8): [0.024, 1e-9, 7e-12, 0.3]}
ENERGY = [230.0, 1.1e-10, 9e-13, 6e-13]
LIMIT_W = 700.0


def gemm_ms(fmt: Format, n: int, k: int, m: int) -> float:
    byte = 2 if fmt == Format.BF16 else 1
    return 0.003 + n * k * byte / 2.5e9 + 2 * m * n * k / (6e11 if fmt == Format.BF16 else 1.2e12)


def table() -> dict:
    shapes = [REFERENCE_SHAPES[n] for n in ANCHORS] + [TEST]
    nks = {nk for s in shapes for nk in s.gemm_nk().values()}
    return {f.value: {nk_key(n, k): [gemm_ms(f, n, k, m) for m in M] for n, k in nks} for f in FORMATS}


def anchor_profile(geo: Geometry, tab: GemmTable, dims: dict, features=energy_features, energy=ENERGY) -> dict:
    d = {"batches": [1, 16, 64], "contexts": [512, 2048], "step_ms": {}, "j_per_step": {}}
    p = {"lengths": [512, 2048], "step_ms": {}, "j_per_step": {}}
    for f in FORMATS:
        uniform = {name: f for name, *_ in geo.groups}

        def step(phase: str, x: int, c: int, f: Format = f, uniform: dict = uniform) -> tuple[float, float]:
            parts = step_parts(geo, tab, uniform, phase, x, c)
            t = parts["gemm_ms"] + sum(a * b for a, b in zip(NG[(phase, f)], ng_features(parts, phase), strict=True))
            return t, sum(a * b for a, b in zip(energy, features(t, parts), strict=True))

        d["step_ms"][f.value] = {str(c): [step("decode", b, c)[0] for b in d["batches"]] for c in d["contexts"]}
        d["j_per_step"][f.value] = {str(c): [step("decode", b, c)[1] for b in d["batches"]] for c in d["contexts"]}
        p["step_ms"][f.value] = [step("prefill", n, n)[0] for n in p["lengths"]]
        p["j_per_step"][f.value] = [step("prefill", n, n)[1] for n in p["lengths"]]
    return {"model": dims, "decode": d, "prefill": p}


def simulated_gpu_profile() -> dict:
    """A GPU profile of the simulated H100: GEMM tables and the anchors' profiles."""
    prof = {"schema": SCHEMA, "version": VERSION, "gpu": "NVIDIA H100 80GB HBM3", "gpu_kind": "h100",
            "driver": "580", "date": "2026-11-22", "power_limit_w": LIMIT_W, "formats": ["bf16", "fp8"],
            "m_buckets": M, "gemm_ms": table(), "verified": True, "anchors": {}}
    tab = GemmTable(prof)
    for name, layers in ANCHORS.items():
        dims = REFERENCE_SHAPES[name].dims(layers).to_dict()
        prof["anchors"][name] = anchor_profile(Geometry.from_dims(dims), tab, dims)
    return prof


@pytest.fixture(scope="module")
def profile() -> dict:
    return simulated_gpu_profile()


def test_the_fit_recovers_the_anchor_physics_and_prices_an_unseen_model(profile):
    fit = fit_gpu_profile(profile)
    assert fit["energy"] == pytest.approx(ENERGY, rel=1e-3)
    for (phase, f), coef in NG.items():  # the per-format floors, and the one constant shared by both formats
        assert fit["non_gemm"][f"{phase}:{f.value}"] == pytest.approx(coef, rel=1e-3, abs=1e-12)
    model = GpuProfileCostModel({**profile, "fit": fit}, TEST.shape(3))
    truth = anchor_profile(Geometry.from_dims(TEST.dims(3).to_dict()), GemmTable(profile), TEST.dims(3).to_dict())
    for f in FORMATS:
        plan = Plan({g.name: f for g in TEST.shape(3).groups})
        for i, b in enumerate((1, 16, 64)):
            t, j = model.decode_step(plan, b, 2048)
            assert t == pytest.approx(truth["decode"]["step_ms"][f.value]["2048"][i], rel=1e-3)
            assert j == pytest.approx(truth["decode"]["j_per_step"][f.value]["2048"][i], rel=1e-3)
        assert model.prefill(plan, 512)[1] == pytest.approx(truth["prefill"]["j_per_step"][f.value][0], rel=1e-3)
    assert "4 anchor models" in model.label and "unverified" not in model.label


def _gemm_time_apart(t_ms: float, parts: dict) -> list[float]:
    g = min(parts["gemm_ms"], t_ms)
    return [g / 1e3, (t_ms - g) / 1e3, parts["bytes"], parts["flops"][Format.BF16], parts["flops"][Format.FP8]]


def test_another_energy_form_is_fitted_and_priced_when_given(profile):
    """A GPU whose GEMMs and the rest draw different static power: the shipped form misprices it, the form that
    has both terms, given to the fit and the cost model, recovers it (what benchmarks/studies/shipped_fit_ceiling.py
    compares)."""
    energy = [150.0, 320.0, 1.1e-10, 9e-13, 6e-13]
    prof = {**profile, "anchors": {}}
    tab = GemmTable(prof)
    for name, layers in ANCHORS.items():
        dims = REFERENCE_SHAPES[name].dims(layers).to_dict()
        prof["anchors"][name] = anchor_profile(Geometry.from_dims(dims), tab, dims, _gemm_time_apart, energy)
    truth = anchor_profile(Geometry.from_dims(TEST.dims(3).to_dict()), tab, TEST.dims(3).to_dict(),
                           _gemm_time_apart, energy)["decode"]["j_per_step"]["bf16"]["512"]
    plan = Plan({g.name: Format.BF16 for g in TEST.shape(3).groups})
    split = GpuProfileCostModel(prof, TEST.shape(3), features=_gemm_time_apart)
    assert split.fit["energy"] == pytest.approx(energy, rel=1e-3)
    assert [split.decode_step(plan, b, 512)[1] for b in (1, 16, 64)] == pytest.approx(truth, rel=1e-3)
    shipped = GpuProfileCostModel(prof, TEST.shape(3))
    errors = [shipped.decode_step(plan, b, 512)[1] / j - 1 for b, j in zip((1, 16, 64), truth, strict=True)]
    assert max(abs(e) for e in errors) > 0.01


def test_a_mixed_plan_costs_between_the_uniform_ones(profile):
    shape = TEST.shape(3)
    model = GpuProfileCostModel(profile, shape)
    w = Workload(batch_size=16)
    e = {k: model.estimate(Plan({g.name: (Format.FP8 if k == "fp8" or (k == "mlp" and g.name.endswith(
        ("gate_up", "down"))) else Format.BF16) for g in shape.groups}), w).j_per_token for k in ("bf16", "mlp", "fp8")}
    assert e["fp8"] < e["mlp"] < e["bf16"]


def test_a_step_above_the_power_limit_runs_at_the_limit_and_longer():
    assert at_power_limit(10.0, 5.0, 700.0) == (10.0, 5.0)  # 500 W: untouched
    t, j = at_power_limit(10.0, 8.0, 400.0)  # 800 W asked of a 400 W GPU
    assert t == pytest.approx(10.0 * 2 ** (1 / 3)) and j / (t / 1e3) == pytest.approx(400.0)


def test_the_table_is_monotone_in_rows_and_scales_shapes_it_lacks(profile):
    prof = {**profile, "gemm_ms": {"bf16": {"100x100": [0.02, 0.01, 0.012, 0.03, 0.05, 0.09], "10x10": [0.005] * 6}}}
    tab = GemmTable(prof)
    assert tab.ms_at(Format.BF16, 100, 100, 1) == pytest.approx(0.01)  # the first bucket's start-up delay is gone
    assert tab.ms_at(Format.BF16, 100, 100, 4) == pytest.approx(0.01)
    bigger = tab.ms_at(Format.BF16, 200, 100, 64)
    # the nearest shape's time above the kernel floor (the fastest GEMM at 64 rows), times the weight ratio
    assert bigger == pytest.approx(0.005 + (0.03 - 0.005) * 2) and (200, 100) in tab.approximate


def test_h100_predictions_use_the_shipped_gpu_profile_and_fall_back_where_it_cannot_price():
    from advisor.energy.prediction import make_energy_model

    shape = REFERENCE_SHAPES["SmolLM2-135M"].shape()
    model = make_energy_model("predicted", shape, GPU.H100)
    # a 135M model's layers lie below the metered GEMM energies' threshold: the mean of both energy forms
    assert "the mean of a form fitted to 5 anchor models and of GEMM energies metered on 2 units" in model.label
    # the shipped profile's own error band:
    assert "error against measurements on twenty-nine H100 units" in model.label
    w = Workload(batch_size=16)
    plan = Plan.uniform(shape.groups, Format.FP8)
    assert "GEMM tables" in model.estimate(plan, w).source
    kv = model.estimate(Plan(dict(plan.formats), kv_cache=Format.FP8), w)
    assert kv.source.startswith("predicted (profile NVIDIA H100") and "no FP8 KV-cache" in kv.source
    assert "unverified" in make_energy_model("predicted", shape, GPU.B200).label  # datasheet-derived, says so


def test_the_label_says_when_a_family_is_priced_as_llama_like_layers():
    from advisor.energy.profiling import shipped_gpu_profile
    from advisor.models.groups import model_shape
    from advisor.testing import random_model, tiny_config

    shipped = shipped_gpu_profile(GPU.H100)
    llama_like = GpuProfileCostModel(shipped, REFERENCE_SHAPES["SmolLM2-135M"].shape())
    assert "Llama-like" not in llama_like.label
    gemma = GpuProfileCostModel(shipped, model_shape(random_model(tiny_config("gemma2"))))
    assert "non-GEMM work priced as Llama-like layers" in gemma.label
    plan = Plan.uniform(model_shape(random_model(tiny_config("gemma2"))).groups, Format.FP8)
    assert "Llama-like" in gemma.estimate(plan, Workload(batch_size=4)).source


@pytest.mark.parametrize("name, outside", [("SmolLM2-135M", True), ("Llama-3.1-8B", False),
                                           ("Llama-3.1-70B", True)])
def test_the_label_says_when_a_models_layers_lie_outside_the_anchors(name, outside):
    from advisor.energy.profiling import shipped_gpu_profile

    model = GpuProfileCostModel(shipped_gpu_profile(GPU.H100), REFERENCE_SHAPES[name].shape(4))
    assert ("outside the anchors'" in model.label) == outside


def test_a_known_flaw_of_a_shipped_profile_is_in_every_label():
    from advisor.energy.profiling import shipped_gpu_profile

    shape = REFERENCE_SHAPES["SmolLM2-135M"].shape(4)
    profile = shipped_gpu_profile(GPU.H100)
    flawed = {**profile, "caveat": "anchors metered with an old meter: small models over-predicted"}
    assert "small models over-predicted" in GpuProfileCostModel(flawed, shape).label
    assert "over-predicted" not in GpuProfileCostModel(profile, shape).label


# -- metered GEMM energy (advisor.energy.profiling) --------------------------------------------------------------

GEMM_W = 300.0  # the simulated GPU's GEMMs draw this while they run, so a step's GEMM J is 300 W x its GEMM time
REST = [140.0, 1.4e-10, 4e-9, 1.3e-12]  # P_rest, per KV byte, per activation byte, per attention FLOP
BIG = REFERENCE_SHAPES["Llama-3.1-8B"]  # 218M weights per layer: priced by the metered GEMMs


def _metered(t_ms: float, parts: dict) -> list[float]:
    from advisor.energy.profiling import rest_features

    return [parts["gemm_ms"] / 1e3, *rest_features(t_ms, parts)]


def _gemm_energy_profile(profile: dict) -> dict:
    """``profile`` on a GPU whose steps cost their GEMMs' metered J plus REST, with the GEMM energy section
    assembled from a simulated collect run and anchors metered on that same unit."""
    from advisor.energy.profiling import gemm_energy_section

    shapes = [REFERENCE_SHAPES[n] for n in ANCHORS] + [TEST, BIG]
    nks = {nk for s in shapes for nk in s.gemm_nk().values()}
    prof = {**profile, "power_limit_w": 1e6, "gemm_ms": {f.value: {nk_key(n, k): [gemm_ms(f, n, k, m) for m in M]
                                                                 for n, k in nks} for f in FORMATS}}
    collect = {"gpu_uuid": "GPU-sim", "date": "2026-11-23", "command": "gemm_energy_collect.py", "m_buckets": M,
               "gemm": {f.value: {nk_key(n, k): [{"j": GEMM_W * gemm_ms(f, n, k, m) / 1e3} for m in M]
                                  for n, k in nks} for f in FORMATS}}
    tab = GemmTable(prof)
    anchors = {}
    for name, layers in ANCHORS.items():
        dims = REFERENCE_SHAPES[name].dims(layers).to_dict()
        anchors[name] = anchor_profile(Geometry.from_dims(dims), tab, dims, _metered, [GEMM_W, *REST])
    run = {"gpu_uuid": "GPU-sim", "command": "energy_transfer_collect.py --anchors", "anchors": anchors}
    return {**prof, "gemm_energy": gemm_energy_section(prof, [(collect, run)])}


def test_metered_gemm_energy_prices_large_layers_and_small_ones_by_its_small_layers_rule(profile):
    prof = _gemm_energy_profile(profile)
    assert prof["gemm_energy"]["rest"] == pytest.approx(REST, rel=1e-3)  # the rest's physics, from the anchors
    tab = GemmTable(prof)
    big = GpuProfileCostModel(prof, BIG.shape(2))
    dims = BIG.dims(2).to_dict()
    truth = anchor_profile(Geometry.from_dims(dims), tab, dims, _metered, [GEMM_W, *REST])
    for f in FORMATS:
        plan = Plan({g.name: f for g in BIG.shape(2).groups})
        for i, b in enumerate((1, 16, 64)):
            assert big.decode_step(plan, b, 512)[1] == pytest.approx(truth["decode"]["j_per_step"][f.value]["512"][i],
                                                                     rel=1e-3)
        assert big.prefill(plan, 2048)[1] == pytest.approx(truth["prefill"]["j_per_step"][f.value][1], rel=1e-3)
    assert "GEMM energies metered on one unit 2026-11-23" in big.label and "4 anchor models metered" in big.label
    # a model of small layers: with the "fitted" rule (profiles built before it), the fitted form alone, exactly as
    # without the section; with "mean" (built since), the mean of that and of the metered form below the threshold
    plain = GpuProfileCostModel({k: v for k, v in prof.items() if k != "gemm_energy"}, TEST.shape(3))
    assert prof["gemm_energy"]["small_layers"] == "mean"
    old = {**prof, "gemm_energy": {k: v for k, v in prof["gemm_energy"].items() if k != "small_layers"}}
    fitted, mean = GpuProfileCostModel(old, TEST.shape(3)), GpuProfileCostModel(prof, TEST.shape(3))
    metered = GpuProfileCostModel({**prof, "gemm_energy": {**prof["gemm_energy"], "min_layer_weights": 0}},
                                  TEST.shape(3))
    plan = Plan.uniform(TEST.shape(3).groups, Format.FP8)
    assert fitted.decode_step(plan, 16, 640) == plain.decode_step(plan, 16, 640)
    assert fitted.label == plain.label and "metered" not in fitted.label
    for step in (lambda m: m.decode_step(plan, 16, 640), lambda m: m.prefill(plan, 512)):
        (t, j), (_, j_fit), (_, j_met) = step(mean), step(plain), step(metered)
        assert t == step(plain)[0] and j_fit != pytest.approx(j_met, rel=0.01)  # the two forms differ here
        assert j == pytest.approx((j_fit + j_met) / 2, rel=1e-12)
    assert "the mean of a form fitted to" in mean.label and "GEMM energies metered on one unit" in mean.label


def test_a_gemm_energy_section_without_its_rest_is_refused(profile):
    from advisor.errors import InputError

    prof = _gemm_energy_profile(profile)
    broken = {**prof, "gemm_energy": {k: v for k, v in prof["gemm_energy"].items() if k != "rest"}}
    with pytest.raises(InputError, match="gemm_energy section lacks rest"):
        GpuProfileCostModel(broken, BIG.shape(2))


def test_an_unknown_small_layers_rule_is_refused(profile):
    from advisor.errors import InputError

    prof = _gemm_energy_profile(profile)
    odd = {**prof, "gemm_energy": {**prof["gemm_energy"], "small_layers": "median"}}
    with pytest.raises(InputError, match="small_layers 'median'; expected one of fitted, mean"):
        GpuProfileCostModel(odd, TEST.shape(3))


def test_several_units_gemm_energies_are_averaged_and_each_needs_its_own_anchors(profile):
    from advisor.energy.profiling import gemm_energy_section, mean_table
    from advisor.errors import InputError

    one = {"m_buckets": [1, 64], "j": {"bf16": {"8x8": [1.0, 3.0], "16x8": [2.0, 2.0]}}}
    two = {"m_buckets": [1, 64], "j": {"bf16": {"8x8": [3.0, 5.0]}, "fp8": {"8x8": [0.5, 0.7]}}}
    assert mean_table([one, two])["j"] == {"bf16": {"8x8": [2.0, 4.0], "16x8": [2.0, 2.0]}, "fp8": {"8x8": [0.5, 0.7]}}
    with pytest.raises(InputError, match="different row counts"):
        mean_table([one, {**two, "m_buckets": [1, 16]}])
    collect = {"gpu_uuid": "GPU-a", "date": "d", "command": "c", "m_buckets": [1], "gemm": {}}
    with pytest.raises(InputError, match="each unit's must be metered on that unit"):
        gemm_energy_section(profile, [(collect, {"gpu_uuid": "GPU-b", "command": "c", "anchors": {"x": {}}})])


def test_gemm_energy_is_read_per_row_count_and_scaled_for_a_shape_it_lacks():
    from advisor.energy.profiling import GemmEnergy, table_of_collect

    table = GemmEnergy(table_of_collect({"m_buckets": [1, 64], "gemm": {
        "bf16": {"100x100": [{"j": 1.0}, {"j": 3.0}]}, "fp8": {"100x100": [{"j": 0.5}, {"j": 1.5}]}}}))
    assert table.gemm_j(Format.BF16, 100, 100, 1) == pytest.approx(1.0)
    assert table.gemm_j(Format.FP8, 100, 100, 32.5) == pytest.approx(1.0)  # halfway between the buckets
    assert not table.approximate
    assert table.gemm_j(Format.BF16, 200, 100, 64) == pytest.approx(6.0)  # twice the weights, from 100x100
    assert table.approximate == {"bf16 200x100 (from 100x100)"}


def test_measuring_a_gpu_profile_adds_the_metered_section_from_its_own_anchors(monkeypatch):
    """`advisor profile` without --model, with the GPU work simulated: tables, anchors, then each GEMM's energy; the
    profile it returns carries a gemm_energy section from this unit's anchors that prices a large model."""
    import advisor.energy.measure as measure
    import advisor.energy.meter as meter_mod
    import advisor.energy.profiling._gemm_table as gemm_table
    import advisor.energy.profiling._model as model_profile
    import advisor.energy.runtime._cuda_tools as cuda_tools
    from advisor.energy.meter import GPUState

    state = GPUState(name="NVIDIA H100 80GB HBM3", index=0, driver="580", power_limit_w=1e6, sm_clock_mhz=1980,
                     mem_clock_mhz=2619, temperature_c=40, power_w=70.0, uuid="GPU-sim")

    class Meter:
        counter = type("Counter", (), {"state": staticmethod(lambda: state)})()

        def idle_power_w(self) -> float:
            return 70.0

    torch = type("Torch", (), {"__version__": "sim", "cuda": type("Cuda", (), {
        "current_device": staticmethod(lambda: 0)})})
    monkeypatch.setattr(measure, "torch_with_gpu", lambda: torch)
    monkeypatch.setattr(meter_mod, "open_meter", lambda device, config: Meter())
    monkeypatch.setattr(cuda_tools, "copy_bandwidth_gb_s", lambda: 3000.0)
    monkeypatch.setattr(cuda_tools, "release_cuda_memory", lambda: None)
    monkeypatch.setattr(measure.Bench, "create", classmethod(lambda cls, dims, max_pos: None))
    monkeypatch.setattr(gemm_table, "gemm_row_ms", lambda n, k, fmt, ms, *a: [gemm_ms(fmt, n, k, m) for m in ms])
    asked = []

    def metered(meter, shapes, rows=gemm_table.ENERGY_ROWS, **kw):
        asked.append(len(shapes))
        return {f.value: {nk_key(n, k): [{"j": GEMM_W * gemm_ms(f, n, k, m) / 1e3} for m in rows] for n, k in shapes}
                for f in FORMATS}, {}

    monkeypatch.setattr(gemm_table, "measure_gemm_energy", metered)
    monkeypatch.setattr(gemm_table, "M_BUCKETS", tuple(M))
    from advisor.energy.profiling import table_nk

    tab = GemmTable({"m_buckets": M, "gemm_ms": {f.value: {nk_key(n, k): [gemm_ms(f, n, k, m) for m in M]
                                                          for n, k in table_nk()} for f in FORMATS}})

    def anchor(dims, **kw):
        d = dims.to_dict()
        return anchor_profile(Geometry.from_dims(d), tab, d, _metered, [GEMM_W, *REST])

    monkeypatch.setattr(model_profile, "measure_model_profile", anchor)
    said: list[str] = []
    profile = gemm_table.measure_gpu_profile("advisor profile", anchors=tuple(ANCHORS.items()), log=said.append)
    assert said[0].startswith("GPU profile of ") and f"{len(ANCHORS)} anchor models" in said[0]
    assert [line for line in said if line.startswith("anchor ")][-1].startswith(f"anchor {len(ANCHORS)}/")
    section = profile["gemm_energy"]
    assert asked and section["units"][0]["gpu_uuid"] == "GPU-sim" and section["anchors"] == sorted(ANCHORS)
    assert section["rest"] == pytest.approx(REST, rel=1e-3)
    model = GpuProfileCostModel(profile, BIG.shape(2))
    assert "GEMM energies metered on one unit" in model.label


def test_a_gpu_profile_the_user_measured_is_stored_and_priced_before_the_shipped_one(tmp_path):
    """`advisor profile` without --model stores its GPU profile; predictions for that GPU kind take the newest
    one (by date), say so in the label, and fall back to the shipped profile for other kinds or damaged files."""
    from advisor.energy.prediction import make_predicted_model
    from advisor.energy.profiling import ProfileStore, shipped_gpu_profile

    store = ProfileStore(tmp_path / "store", shipped=tmp_path / "none")
    shape = REFERENCE_SHAPES["Qwen2.5-1.5B"].shape(4)
    assert "yours" not in make_predicted_model(shape, GPU.H100, store=store).label
    mine = {**shipped_gpu_profile(GPU.H100), "date": "2099-01-02", "gpu_uuid": "GPU-0000-aaaabbbbcccc"}
    older = {**mine, "date": "2099-01-01"}
    path = store.save_gpu_profile(mine)
    store.save_gpu_profile(older)
    (path.parent / "h100_gemm_2099-12-31.json").write_text("{broken")  # passed over
    assert path.name == "h100_gemm_2099-01-02_aaaabbbbcccc.json"
    model = make_predicted_model(shape, GPU.H100, store=store)
    assert f"2099-01-02, yours: {path}" in model.label
    assert "yours" not in make_predicted_model(REFERENCE_SHAPES["Qwen2.5-1.5B"].shape(4), GPU.H200,
                                               store=store).label


def test_a_caller_that_holds_the_mix_to_the_limit_gets_each_step_as_fitted(profile):
    from advisor.energy.prediction import RooflineEnergyModel, TensorParallelEnergyModel, WithFallback

    low = {**profile, "fit": fit_gpu_profile(profile), "power_limit_w": 1.0}  # every step is above this limit
    capped = GpuProfileCostModel(low, TEST.shape(3))
    plan = Plan.uniform(TEST.shape(3).groups, Format.BF16)
    uncapped = capped.without_step_cap()
    (t_cap, j_cap), (t, j) = capped.decode_step(plan, 16, 512), uncapped.decode_step(plan, 16, 512)
    assert j_cap / (t_cap / 1e3) == pytest.approx(1.0) and t_cap > t
    assert (t_cap, j_cap) == at_power_limit(t, j, 1.0)  # the same step, held to the limit on its own
    assert capped.cap_steps and not uncapped.cap_steps  # a copy: the built-in tier keeps its rule
    wrapped = WithFallback(capped, RooflineEnergyModel(TEST.shape(3), GPU.H100)).without_step_cap()
    assert wrapped.decode_step(plan, 16, 512) == (t, j) and wrapped.gpus == 1
    tp = TensorParallelEnergyModel(capped, 2, 64, 3).without_step_cap()
    assert not tp.per_gpu.cap_steps and tp.gpus == 2
    roofline = RooflineEnergyModel(TEST.shape(3), GPU.H100)
    assert roofline.without_step_cap() is roofline  # nothing to take off
    # a pass over n tokens is the GPU profile's decode step of n rows (its GEMMs read at n rows from the table), a
    # roofline's the slower of that and a prompt; wrappers answer as the model that prices the plan
    assert capped.pass_is_decode_step(plan) and wrapped.pass_is_decode_step(plan) and tp.pass_is_decode_step(plan)
    assert not roofline.pass_is_decode_step(plan)
    assert not WithFallback(roofline, capped).pass_is_decode_step(plan)
