"""benchmarks/device/vllm_eager_steps.py's report (no GPU): the step with and without its graph, per layer, and the
served runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "device"))
import vllm_eager_steps  # noqa: E402


def _run(rows: list[dict]) -> dict:
    return {"gpu": "NVIDIA H200", "driver": "580.159.04", "vllm_version": "0.26.0", "torch": "2.11.0",
            "date": "2026-12-01T01:41:00", "command": "python3 vllm_eager_steps.py --out e.json", "rows": rows}


def _timed(layers: int, mode: str, ms: dict[str, float]) -> dict:
    return {"layers": layers, "mode": mode, "capture_sizes": [1, 32], "engine_start_s": 40.0,
            "lengths": {k: {"median_ms": v, "min_ms": v, "ms": [v]} for k, v in ms.items()}}


def test_the_report_gives_each_case_s_difference_per_layer_and_the_served_runs(tmp_path):
    single = _run([_timed(32, "captured", {"64": 9.0, "1024": 27.3}), _timed(32, "uncaptured", {"64": 16.68,
                                                                                                 "1024": 27.3})])
    waves = _run([_timed(32, "captured", {"2x512": 28.0, "1x512": 16.0}),
                  _timed(32, "uncaptured", {"2x512": 27.68, "1x512": 20.0})])
    served = _run([{"layers": 64, "mode": "uncaptured", "capture_sizes": [1, 128], "engine_start_s": 50.0,
                    "served": {"in_flight": 64, "requests": 320, "output_tokens": 81598, "wall_s": 26.86,
                               "tokens_per_s": 3038.0}}])
    paths = []
    for i, run in enumerate((single, waves, served)):
        paths.append(str(tmp_path / f"r{i}.json"))
        Path(paths[-1]).write_text(json.dumps(run))
    stem = tmp_path / "report"
    vllm_eager_steps.render(paths, stem)
    per_layer = json.loads(stem.with_suffix(".json").read_text())["per_layer_us"]
    assert per_layer["run 1, 32 layers"] == {"64": pytest.approx(240.0), "1024": 0.0}  # (16.68 - 9.0) ms / 32
    assert list(per_layer["run 2, 32 layers"]) == ["1x512", "2x512"]  # ordered by the step's prompt tokens
    assert per_layer["run 2, 32 layers"]["2x512"] == pytest.approx(-10.0)
    md = stem.with_suffix(".md").read_text()
    assert "| 1 | 32 | 64 | 9.00 | 16.68 | +7.68 | +240 |" in md
    assert "| 3 | 64 | uncaptured (up to 128) | 64 | 320 | 81598 | 26.86 | 3038 |" in md
