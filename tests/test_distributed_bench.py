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
    two_gpus, four_gpus = ["GPU-a", "GPU-b"], ["GPU-a2", "GPU-b2", "GPU-c2", "GPU-d2"]
    for host, workers, wall, meterings in ((two_gpus, 1, 100.0, {"GPU-a": 5}),
                                           (two_gpus, 2, 50.0, {"GPU-a": 4, "GPU-b": 3}),
                                           (four_gpus, 1, 120.0, {"GPU-a2": 5}),  # another machine, slower
                                           (four_gpus, 4, 40.0, {"GPU-a2": 2, "GPU-b2": 2, "GPU-c2": 2})):
        run = {"workers": workers, "label": "warm", "trials": 6, "wall_s": wall, "exit_code": 0,
               "command": "advisor search", "date": "2026-11-27",
               "gpus": [{"name": "H100", "driver": "580", "uuid": u} for u in host],
               "stages_s": {"measured_s": 0.9 * wall}, "plans_measured_per_gpu": meterings,
               "meterings_per_gpu": meterings, "unit_agreement": None}
        runs.append(tmp_path / f"run_{len(host)}_{workers}.json")
        runs[-1].write_text(json.dumps(run))
    done = subprocess.run([sys.executable, "benchmarks/device/distributed_gpu.py", "collect", *map(str, runs),
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "distributed_gpu.json").read_text())["runs"]
    assert rows[1]["speedup_vs_1_worker"] == 2.0 and rows[1]["meterings_bound_speedup"] == 1.25
    # each machine's rows against its own 1-worker run
    assert rows[3]["speedup_vs_1_worker"] == 3.0 and rows[3]["meterings_bound_speedup"] == 2.5
    assert "2 x H100 and 4 x H100" in (tmp_path / "distributed_gpu.md").read_text()
