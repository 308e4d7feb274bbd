"""The product-path distributed benchmark's bookkeeping on a CPU: each GPU's meterings and the bound they set
(its GPU runs are rare; a script broken here would only be found there)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
