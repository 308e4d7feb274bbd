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


def test_the_memory_sampler_watches_only_the_gpus_this_run_sees(monkeypatch):
    # NVML ignores CUDA_VISIBLE_DEVICES: two runs side by side on one node must not take each other's memory
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from large_models import visible_handles

    class FakeNvml:
        @staticmethod
        def nvmlDeviceGetCount():
            return 4

        @staticmethod
        def nvmlDeviceGetHandleByIndex(i):
            return f"index {i}"

        @staticmethod
        def nvmlDeviceGetHandleByUUID(uuid):
            return f"uuid {uuid}"

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_handles(FakeNvml) == ["index 0", "index 1", "index 2", "index 3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert visible_handles(FakeNvml) == ["index 3", "index 1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-ab12, 2")
    assert visible_handles(FakeNvml) == ["uuid GPU-ab12", "index 2"]
