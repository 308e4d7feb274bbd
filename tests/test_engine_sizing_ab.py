"""benchmarks/device/engine_sizing_ab.py on the CPU with the fake vLLM: its arms are the engine sizings round 3 of
reports/benchmarks/verify_time.md compared (and the two crossed), and one arm serves the checkpoint sized as it says
and meters every batch (the GPU run's step Z must not stop on the script)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def ab(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "device"))
    import engine_sizing_ab

    return engine_sizing_ab


def test_the_arms_cross_the_two_sizings_engine_size_and_graphs(ab):
    table = ab.arms(240, 300, [80, 136, 240], 512)
    a, b, c, d, s = (table[k] for k in "ABCDS")
    assert (a["max_num_seqs"], b["max_num_seqs"], c["max_num_seqs"], d["max_num_seqs"]) == (240, 300, 240, 300)
    assert c["graphs"] == b["graphs"] and d["graphs"] == a["graphs"]  # each knob moved alone
    between = {name: [g for g in arm["graphs"] if 256 < g < 512] for name, arm in table.items()}
    assert between["B"] and not between["A"]  # only B captures decode graphs above 256 (512 on: prefills joining)
    assert set(s["graphs"]) < set(a["graphs"]) and {1, 80, 136, 240} <= set(s["graphs"])
    assert all({80, 136, 240} <= set(arm["graphs"]) for arm in table.values())  # every metered batch captured


def test_one_arm_serves_the_checkpoint_sized_as_the_arm_says_and_meters_each_batch(ab, monkeypatch, tmp_path):
    from advisor.energy.meter import MeterConfig
    from advisor.testing_vllm import ConstantPowerCounter, fake_vllm

    vllm = fake_vllm(step_s=0.001)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setattr("advisor.energy.meter.open_gpus_counter", lambda _n: ConstantPowerCounter())
    monkeypatch.setattr("advisor.deploy.vllm.STEADY_LOAD_METER", MeterConfig(
        warmup_s=0.2, min_window_s=0.2, min_ticks=5, repeats=2, idle_s=0.05, max_cv=0.5, until_stable_s=1.0))
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "vocab_size": 64}))
    args = argparse.Namespace(checkpoint=str(ck), batches=[2, 4], input_tokens=8, output_tokens=4)
    arm = ab.arms(4, 6, [2, 4], 8)["B"]
    out = ab.one_arm(args, arm)
    (llm,) = vllm.instances
    assert llm.kwargs["max_num_seqs"] == 6
    assert llm.kwargs["compilation_config"]["cudagraph_capture_sizes"] == arm["graphs"]
    assert [r["batch"] for r in out["rows"]] == [2, 4]
    assert all(r["j_per_token"] > 0 and r["batch_full"] for r in out["rows"])
    assert out["engine_start_s"] >= 0 and out["vllm_version"] == vllm.__version__
