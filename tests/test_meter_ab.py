"""benchmarks/device/meter_ab.py --around on the CPU with the fake vLLM: the slow path beside a verified plan meters
each objective's found batch and the graph sizes either side in an engine sized as verify's was (the GPU run's step
P must not stop on the script)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def ab(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "device"))
    import meter_ab

    return meter_ab


def verified_run(tmp_path: Path) -> Path:
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "vocab_size": 64}))
    run = tmp_path / "run"
    run.mkdir()
    options = {"max_num_seqs": 24, "compilation_config": {"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 24]}}
    search = {"batch": 16, "tpot_ms": 7.0, "j_per_token": 0.1, "meets": True, "trail": []}
    plans = [{"role": "bf16", "plan_id": "b", "checkpoint": "elsewhere", "vllm_options": {}, "operating": []},
             {"role": "recommendation", "plan_id": "r", "checkpoint": str(ck), "vllm_options": options,
              "operating": [{"workload": "tpot8", "batch": 24, "vllm_search": search},
                            {"workload": "tpot20", "batch": 24, "vllm_search": {**search, "batch": 24}},
                            {"workload": "fixed", "batch": 4, "vllm_search": None}]}]
    (run / "verify.json").write_text(json.dumps({"plans": plans}))
    (run / "summary.json").write_text(json.dumps({"workloads": [{"name": "tpot8", "tpot_ms": 8},
                                                               {"name": "tpot20", "tpot_ms": 20},
                                                               {"name": "fixed"}]}))
    return run


def test_the_slow_path_meters_each_found_batch_and_its_neighbours_as_verify_served_them(ab, monkeypatch, tmp_path):
    from advisor.energy.meter import MeterConfig
    from advisor.testing_vllm import ConstantPowerCounter, fake_vllm

    run = verified_run(tmp_path)
    checkpoint, slow, batches = ab.around(run, None)
    assert checkpoint == str(tmp_path / "ck") and slow["plan_id"] == "r"
    # 16: 8, 16, 24; 24: 16 and 24, nothing above verify's max_num_seqs; an objective-less workload is not searched
    assert batches == [8, 16, 24] and set(slow["objectives"]) == {"tpot8", "tpot20"}
    assert slow["objectives"]["tpot20"]["batches"] == [16, 24] and slow["objectives"]["tpot8"]["tpot_ms"] == 8

    vllm = fake_vllm(step_s=0.001)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setattr(ab, "open_gpus_counter", lambda _n: ConstantPowerCounter())
    monkeypatch.setattr(ab, "MeterConfig", lambda: MeterConfig(warmup_s=0.2, min_window_s=0.2, min_ticks=5,
                                                              repeats=2, idle_s=0.05, max_cv=0.5))
    environ: dict[str, str] = {}
    monkeypatch.setattr(ab.os, "environ", environ)  # what main sets, kept from the other tests
    out = tmp_path / "slow.json"
    monkeypatch.setattr(sys, "argv", ["meter_ab.py", "--around", str(run), "--out", str(out)])
    ab.main()
    (llm,) = vllm.instances
    assert llm.kwargs["max_num_seqs"] == 24  # verify's own engine for the plan
    assert llm.kwargs["compilation_config"]["cudagraph_capture_sizes"] == [1, 2, 4, 8, 16, 24]
    assert llm.kwargs["disable_log_stats"] is True
    assert environ["VLLM_USE_FLASHINFER_SAMPLER"] == "0"  # as verify's engine processes run
    data = json.loads(out.read_text())
    assert [(r["batch"], r["meter"]) for r in data["rows"]] == [(8, "classic"), (16, "classic"), (24, "classic")]
    assert all(r["j_per_token"] > 0 and r["tpot_ms_p50"] is not None for r in data["rows"])
    assert data["slow_path"]["objectives"]["tpot8"]["found"] == 16
    # the collector's table reads it: each objective's largest batch that met by the classic meter beside verify's
    import verify_time_collect

    table = "\n".join(verify_time_collect.render_slow_path(data))
    assert "| tpot8 (TPOT 8 ms) | 16 | 7.00, 0.10000 |" in table and "| tpot20 (TPOT 20 ms) | 24 |" in table


def test_a_plan_after_the_first_is_timed_from_the_plan_before_s_last_metering_to_its_own(monkeypatch):
    """verify_time_collect.py's figure for issue 57's 'at most 4 minutes a plan after the first', from each metering's
    clock time and length, in the order the plans ended (a held early engine meters after the plan before)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "device"))
    import verify_time_collect

    plans = [{"plan_id": "fp8", "meterings": [{"began_utc": "11:40:56", "seconds": 8.6},
                                              {"began_utc": "11:42:31", "seconds": 11.2}]},
             {"plan_id": "bf16", "meterings": [{"began_utc": "11:38:41", "seconds": 9.2},
                                               {"began_utc": "11:40:34", "seconds": 17.4}]},
             {"plan_id": "round 5's", "meterings": [{"seconds": 10.0}]}]  # no clock times: left out
    ended = verify_time_collect.plans_ended(plans)
    assert [(plan, f"{end:%H:%M:%S}") for plan, end, _ in ended] == [("bf16", "11:40:51"), ("fp8", "11:42:42")]
    assert ended[0][2] is None and ended[1][2] == pytest.approx(110.8, abs=0.01)
