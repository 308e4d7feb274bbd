"""The large-model benchmarks run end to end on the tiny shape on a CPU, as they do on the GPU machines with the real
shapes: their GPU runs are rare and long, so a script broken here would only be found there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> None:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


def test_large_models_identical_and_search_on_the_tiny_shape(tmp_path):
    common = ["--shape", "tiny", "--device", "cpu", "--work", str(tmp_path), "--out", str(tmp_path / "out")]
    _run("benchmarks/large_models.py", "identical", *common)
    _run("benchmarks/large_models.py", "search", "--trials", "3", *common)
    summary = tmp_path / "runs" / "tiny" / "summary.json"
    _run("benchmarks/large_models.py", "measure", "--summary", str(summary), *common)
    identical, search, measure = json.loads((tmp_path / "out" / "large_models.json").read_text())["runs"]
    assert identical["bit_identical"] is True and set(identical["stages_s"]) == {"folded", "packed"}
    assert search["rc"] == 0 and search["stages_s"]["trials_run"] == 3
    # no GPU here: every baseline and front plan listed with its predicted J/token, none measured
    baselines = json.loads(summary.read_text())["baselines"]
    assert {e["label"] for e in measure["energy_here"]} >= set(baselines)
    assert all(e["measured_j_per_token"] is None and "no NVIDIA GPU" in e["why_not_measured"]
               for e in measure["energy_here"])
    table = (tmp_path / "out" / "large_models.md").read_text()
    assert table.count("| tiny |") == 3 and "## tiny: J/token of the baselines and the front" in table


def test_large_models_identical_on_a_tiny_mixture_of_experts(tmp_path):
    _run("benchmarks/large_models.py", "identical", "--shape", "tiny-moe", "--device", "cpu", "--work", str(tmp_path),
         "--out", str(tmp_path / "out"))
    (record,) = json.loads((tmp_path / "out" / "large_models.json").read_text())["runs"]
    assert record["bit_identical"] is True
    # FP8 and NVFP4, 2 layers, each q, k, v, o and the experts' fused gate_up and down
    assert record["packed_bank"]["kept_bf16"] == [] and record["packed_bank"]["packed"] == 2 * 2 * (4 + 2)


def test_the_multi_gpu_benchmark_dry_run(tmp_path):
    _run("benchmarks/device/large_models_multi_gpu.py", "all", "--dry-run", "--work", str(tmp_path),
         "--out", str(tmp_path / "out"))
    report = json.loads((tmp_path / "out" / "large_models_multi_gpu.json").read_text())
    assert {"checkpoint", "plan", "search", "export", "serve"} <= set(report)
    assert report["search"]["rc"] == 0


def test_the_distributed_benchmark_counts_each_gpus_meterings(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "device"))
    import distributed_gpu

    summary = {"trials": [{"trial": 0, "plan_id": "bf16"}], "baselines": {"all-bf16": 0},
               "measured_units": [{"gpu_uuid": "GPU-a", "gpu": "H100", "plans": ["bf16", "p1", "p2"]},
                                  {"gpu_uuid": "GPU-b", "gpu": "H100", "plans": ["p3"]}],
               "measured_drift": [{"source": "measured (H100) on GPU-a"}, {"source": "measured (H100) on GPU-b"}]}
    # GPU-b meters its own all-BF16 first, then its plan, then all-BF16 again
    assert distributed_gpu.meterings_per_gpu(summary) == {"GPU-a": 4, "GPU-b": 3}
    runs = []
    for workers, meterings in ((1, {"GPU-a": 5}), (2, {"GPU-a": 4, "GPU-b": 3})):
        run = {"workers": workers, "label": "warm", "trials": 6, "wall_s": 100.0 / workers, "exit_code": 0,
               "command": "advisor search", "date": "2026-11-27", "gpus": [{"name": "H100", "driver": "580"}],
               "stages_s": {"measured_s": 90.0 / workers}, "plans_measured_per_gpu": meterings,
               "meterings_per_gpu": meterings, "unit_agreement": None}
        runs.append(tmp_path / f"run_{workers}.json")
        runs[-1].write_text(json.dumps(run))
    done = subprocess.run([sys.executable, "benchmarks/device/distributed_gpu.py", "collect", *map(str, runs),
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    two = json.loads((tmp_path / "distributed_gpu.json").read_text())["runs"][1]
    assert two["speedup_vs_1_worker"] == 2.0 and two["meterings_bound_speedup"] == 1.25
