"""A MoE's device costs as vLLM runs it: routed experts from a measured table of vLLM's fused MoE, the rest from the
GPU profile's layer model, and the predicted tier as it was for plans the table does not hold."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from advisor.energy.prediction import (
    MoeKernelTable,
    VllmMoeDevice,
    VllmServedModel,
    make_predicted_model,
    vllm_device,
    without_routed_experts,
)
from advisor.energy.profiling import shipped_vllm_profile, validate_vllm_profile
from advisor.errors import InputError
from advisor.formats import GPU, Format
from advisor.plan import Plan

ROOT = Path(__file__).resolve().parents[1]
TOKENS, MS = (1, 16, 64), (0.05, 0.10, 0.20)


def _table(formats=("bf16", "fp8")) -> dict:
    rows = [{"experts": 128, "top_k": 8, "hidden": 2048, "intermediate": 768, "format": f, "tokens": t,
             "ms_per_layer": ms * (2 if f == "bf16" else 1), "j_per_layer": 0.4 * ms}
            for f in formats for t, ms in zip(TOKENS, MS, strict=True)]
    return {"gpu": "NVIDIA H200", "date": "2026-12-01", "vllm_version": "0.26.0", "command": "c", "source": "s",
            "rows": rows}


@pytest.fixture(scope="module")
def moe():
    sys.path.insert(0, str(ROOT / "benchmarks" / "engine_true"))
    from served_rows import shape_of

    return shape_of("qwen3-30b-a3b")[0]


class Fallback:
    """The predicted tier as it was: constant costs, so that a plan it prices is told apart."""

    gpus, label = 1, "predicted (the fallback)"

    def decode_step(self, plan, batch, context):
        return 99.0, 9.0

    def prefill(self, plan, length):
        return 199.0, 19.0

    def pass_is_decode_step(self, plan):
        return True

    def without_step_cap(self):
        return self

    def step_source(self, plan):
        return self.label


def test_the_routed_experts_are_priced_from_vllm_s_fused_moe_and_the_rest_from_the_layer_model(moe):
    rest_shape = without_routed_experts(moe)
    assert not rest_shape.is_moe and rest_shape.router_weights == 0
    assert [g.name for g in rest_shape.groups] == [g.name for g in moe.groups if not g.name.endswith(".experts")]
    rest = make_predicted_model(rest_shape, GPU.H200, per_model=False)
    device = VllmMoeDevice(rest, MoeKernelTable(_table()), moe, Fallback())
    names = [g.name for g in moe.groups]
    fp8 = Plan.uniform(names, Format.FP8)
    rest_fp8 = Plan({g: f for g, f in fp8.formats.items() if not g.endswith(".experts")})
    layers = sum(g.is_moe for g in moe.layers)
    assert layers == 48
    for batch, per_layer in ((16, 0.10), (40, 0.15), (1, 0.05)):  # 40: halfway between the table's 16 and 64
        ms, j = device.decode_step(fp8, batch, 640)
        r_ms, r_j = rest.decode_step(rest_fp8, batch, 640)
        assert ms == pytest.approx(r_ms + layers * per_layer) and j == pytest.approx(r_j + layers * 0.4 * per_layer)
    bf16 = Plan.uniform(names, Format.BF16)  # the experts' format picks the row: BF16's are twice as slow here
    rest_bf16 = Plan({g: f for g, f in bf16.formats.items() if not g.endswith(".experts")})
    assert device.decode_step(bf16, 16, 0)[0] == pytest.approx(rest.decode_step(rest_bf16, 16, 0)[0] + layers * 0.2)
    assert device.prefill(fp8, 64)[0] == pytest.approx(rest.prefill(rest_fp8, 64)[0] + layers * 0.2)
    assert device.step_source(fp8).startswith("predicted (vLLM 0.26.0's fused MoE measured on NVIDIA H200, 2026-12-01")


def test_a_plan_whose_experts_the_table_does_not_hold_is_priced_as_before(moe):
    rest = make_predicted_model(without_routed_experts(moe), GPU.H200, per_model=False)
    device = VllmMoeDevice(rest, MoeKernelTable(_table(formats=("fp8",))), moe, Fallback())
    names = [g.name for g in moe.groups]
    bf16 = Plan.uniform(names, Format.BF16)
    assert device.decode_step(bf16, 16, 0) == (99.0, 9.0) and device.prefill(bf16, 512) == (199.0, 19.0)
    assert device.step_source(bf16) == "predicted (the fallback)" and device.pass_is_decode_step(bf16)
    other = {**_table(), "rows": [dict(r, experts=64) for r in _table()["rows"]]}  # another geometry
    assert not MoeKernelTable(other).covers(moe, Plan.uniform(names, Format.FP8))


def test_the_served_label_names_the_measured_fused_moe_where_it_prices_the_plan(moe):
    profile = {**shipped_vllm_profile(GPU.H200), "moe_kernels": _table(formats=("fp8",))}
    predicted = make_predicted_model(moe, GPU.H200)
    served = VllmServedModel(vllm_device(predicted, moe, GPU.H200, profile["moe_kernels"]), moe, GPU.H200, profile)
    names = [g.name for g in moe.groups]
    fp8, bf16 = Plan.uniform(names, Format.FP8), Plan.uniform(names, Format.BF16)
    assert "fused MoE measured on NVIDIA H200, 2026-12-01, at uniform routing" in served.step_source(fp8)
    assert "fused MoE is not measured" not in served.step_source(fp8)
    assert "fused MoE is not measured" in served.step_source(bf16)  # BF16 experts: not in this table
    assert vllm_device(predicted, moe, GPU.H200, None) is predicted


def test_a_profile_s_moe_table_is_checked():
    profile = {**shipped_vllm_profile(GPU.H200), "moe_kernels": _table()}
    assert validate_vllm_profile(profile, "p")["moe_kernels"]["rows"][0]["experts"] == 128
    for bad in ({"format": "int4"}, {"tokens": 0}, {"ms_per_layer": float("nan")}, {"experts": "128"}):
        table = _table()
        table["rows"][0] = {**table["rows"][0], **bad}
        with pytest.raises(InputError, match="moe_kernels is not a table"):
            validate_vllm_profile({**profile, "moe_kernels": table}, "p")


def test_the_fit_takes_a_kernel_table_of_its_own_gpu_only(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "engine_true"))
    from vllm_step_fit import moe_table

    out = {"gpu_smi": "NVIDIA H200, 580.159.04, 700.00 W", "date": "2026-12-01", "vllm_version": "0.26.0",
           "command": "python3 benchmarks/device/vllm_moe_kernels.py --out k.json",
           "rows": [dict(r, layers_in_graph=6, power_w=400.0) for r in _table()["rows"]]}
    path = tmp_path / "k.json"
    path.write_text(json.dumps(out))
    table = moe_table([str(path)], "h200")
    assert table["gpu"] == "NVIDIA H200" and len(table["rows"]) == 6 and "power_w" not in table["rows"][0]
    validate_vllm_profile({**shipped_vllm_profile(GPU.H200), "moe_kernels": table}, "p")
    with pytest.raises(SystemExit, match="not on an h100"):
        moe_table([str(path)], "h100")


def test_kernel_tables_of_several_runs_are_merged_the_later_run_s_geometry_winning(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "engine_true"))
    from vllm_step_fit import moe_table

    def run(name: str, date: str, rows: list[dict], version: str = "0.26.0") -> str:
        path = tmp_path / name
        path.write_text(json.dumps({"gpu_smi": "NVIDIA H200, 580.159.04, 700.00 W", "date": date,
                                    "vllm_version": version, "command": name, "rows": rows}))
        return str(path)

    first = _table()["rows"]
    other = [dict(r, experts=8, top_k=2) for r in first]
    again = [dict(r, ms_per_layer=9.0) for r in first if r["format"] == "fp8"]
    table = moe_table([run("a", "2026-12-01", first), run("b", "2026-12-02", other + again)], "h200")
    assert len(table["rows"]) == 12 and table["date"] == "2026-12-02" and table["command"] == "a; b"
    fp8 = [r for r in table["rows"] if r["experts"] == 128 and r["format"] == "fp8"]
    assert [r["ms_per_layer"] for r in fp8] == [9.0] * 3
    bf16 = [r for r in table["rows"] if r["experts"] == 128 and r["format"] == "bf16"]
    assert [r["ms_per_layer"] for r in bf16] == [0.1, 0.2, 0.4]
    with pytest.raises(SystemExit, match="one of each"):
        moe_table([run("a", "2026-12-01", first), run("c", "2026-12-02", other, version="0.27.0")], "h200")


def test_a_kernel_table_alone_is_written_into_the_profile_and_nothing_is_fitted(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "engine_true"))
    from vllm_step_fit import main

    shipped = {k: v for k, v in shipped_vllm_profile(GPU.H200).items() if k != "moe_kernels"}
    profile = tmp_path / "h200.json"
    profile.write_text(json.dumps(shipped))
    kernels = tmp_path / "k.json"
    kernels.write_text(json.dumps({"gpu_smi": "NVIDIA H200, 580.159.04, 700.00 W", "date": "2026-12-01",
                                   "vllm_version": "0.26.0", "command": "c", "rows": _table()["rows"]}))
    main(["--gpu", "h200", "--moe-kernels", str(kernels), "--profile-out", str(profile)])
    written = json.loads(profile.read_text())
    assert written["params"] == shipped["params"] and written["source"] == shipped["source"]
    assert written["moe_kernels"]["rows"] == _table()["rows"] and written["moe_kernels"]["date"] == "2026-12-01"
    # a later run of another geometry adds to the table; the first geometry's rows stay
    kernels.write_text(json.dumps({"gpu_smi": "NVIDIA H200, 580.159.04, 700.00 W", "date": "2026-12-02",
                                   "vllm_version": "0.26.0", "command": "d",
                                   "rows": [dict(r, experts=8, top_k=2) for r in _table()["rows"]]}))
    main(["--gpu", "h200", "--moe-kernels", str(kernels), "--profile-out", str(profile)])
    table = json.loads(profile.read_text())["moe_kernels"]
    assert len(table["rows"]) == 12 and {r["experts"] for r in table["rows"]} == {128, 8}
    assert table["command"] == "c; d" and table["date"] == "2026-12-02"
