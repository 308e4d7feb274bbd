"""benchmarks/device/vllm_served_steps.py (what runs on the GPU, checked here without it) and its report,
benchmarks/engine_true/served_steps_report.py: which step an interval times, the admissions, and the two forms of
an uncaptured step's cost."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks" / "device"), str(ROOT / "benchmarks" / "engine_true")]
import served_steps_report as report  # noqa: E402
import vllm_served_steps  # noqa: E402

from advisor.deploy.checkpoint import capture_bound  # noqa: E402
from advisor.energy.prediction._vllm_step import capture_sizes  # noqa: E402
from advisor.testing_vllm import _Engine, fake_vllm  # noqa: E402

COLUMNS = ["ms", "prompts", "prompt_tokens", "decodes", "context"]


def test_capture_bound_is_the_advisor_s_the_wide_one_or_vllm_s_default():
    assert vllm_served_steps.capture_bound("advisor", 128) == 640 == capture_bound(128, 512)  # the advisor's own
    assert vllm_served_steps.capture_bound("wide", 128) == 2176
    assert vllm_served_steps.capture_bound("default", 128) is None


class _Counting(_Engine):
    """The project's fake vLLM engine (a token a step for each request until its max_tokens), counting the output
    lengths asked for and the requests that join each step (added since the step before)."""

    def __init__(self, batch: int) -> None:
        super().__init__(fake_vllm(step_s=0.0), batch)
        self.asked: list[int] = []
        self.joined: list[int] = []
        self._new = 0

    def add_request(self, rid, prompt, params):
        self.asked.append(params.max_tokens)
        self._new += 1
        return super().add_request(rid, prompt, params)

    def step(self):
        self.joined.append(self._new)
        self._new = 0
        return super().step()


def test_a_spread_load_staggers_its_first_round_and_draws_the_later_lengths_within_the_spread():
    load_class = vllm_served_steps.spread_load(vllm_served_steps.advisors_steady_load(), 0.5)
    engine = _Counting(4)
    load = load_class(engine.module, engine, 4, 16, 256, 1000)
    for i in range(4):
        load._add(max(1, round(256 * (i + 1) / 4)) if i < 3 else 100)  # the staggered first round
    first = list(engine.asked)
    for _ in range(200):
        load._add(256)  # a replacement
    later = engine.asked[4:]
    assert first == [64, 128, 192, 100]
    assert min(later) >= 128 and max(later) <= 384 and len(set(later)) > 50


def test_a_step_is_timed_by_the_interval_stamped_at_the_step_before_it():
    row = {"steps_columns": COLUMNS, "steps": [[5.0, 0, 0, 64, 600.0], [15.0, 0, 0, 64, 601.0],
                                               [6.0, 1, 512, 63, 602.0], [5.5, 0, 0, 64, 603.0]]}
    steps = report.timed_steps(row)
    assert [(s["prompts"], s["ms"]) for s in steps] == [(0, 5.0), (1, 15.0), (0, 6.0)]


def test_admission_shares_against_poisson_and_regular():
    steps = [{"prompts": p} for p in [0, 1] * 50]
    shares = report.admissions(steps, 0.5)
    assert shares["measured"] == [0.5, 0.5, 0.0, 0.0, 0.0]
    assert shares["regular"] == [0.5, 0.5, 0.0, 0.0, 0.0]
    assert shares["poisson"][0] == pytest.approx(math.exp(-0.5))
    assert sum(shares["poisson"]) == pytest.approx(1.0)
    assert report.admissions(steps, 1.0)["regular"] == [0.0, 1.0, 0.0, 0.0, 0.0]


def test_overlapped_launches_cost_only_where_they_outrun_the_gpu():
    captured = [(10.0, False)] * 100
    assert report.overlapped(captured, 50.0) == pytest.approx(10.0)
    # launches of 8 ms under a 10 ms step: hidden
    assert report.overlapped([(10.0, True)] * 100, 8.0) == pytest.approx(10.0)
    # every step uncaptured and its launches 14 ms: the host sets the pace
    assert report.overlapped([(10.0, True)] * 100, 14.0) == pytest.approx(14.0)
    # one uncaptured step in two, launches 14 ms: the captured step between gives the host room
    alternating = [(10.0, True), (10.0, False)] * 50
    assert report.overlapped(alternating, 14.0) < 12.0


def test_the_fits_recover_the_form_the_sequences_were_made_with():
    seqs = []
    for share in (0.0, 0.25, 0.5, 1.0):
        seq = [(8.0 + 4 * (i % 3), i % 4 < 4 * share) for i in range(400)]
        measured = sum(1.02 * d + (0.2 * 32 if e else 0.0) for d, e in seq) / len(seq)
        seqs.append((measured, seq, 32))
    fits = report.eager_fits(seqs)
    assert fits["added"]["launch_ms_per_layer"] == pytest.approx(0.2, rel=0.02)
    assert fits["added"]["device_scale"] == pytest.approx(1.02, rel=0.01)
    assert fits["added"]["rms_pct"] < 0.1


def _served_run(shape: str = "Llama-3.1-8B", launch_scale: float = 1.0) -> dict:
    """A run of batch 128 under the advisor's bound as the shipped model prices its steps (alternating 0 and 1
    prompts, as the fixed-length load admits), its steps with a prompt ``launch_scale`` times as long."""
    pricer = report.Pricer(shape)
    sizes = list(capture_sizes(vllm_served_steps.capture_bound("advisor", 128), 16384))
    serving = report.VllmServing(128, 16384, None, tuple(sizes))
    steps = []
    for i in range(60):
        prompts = i % 2
        ms, _ = pricer.step(serving, 128 - prompts, 640.0, prompts, 512 * prompts, 512)
        steps.append([0.0, prompts, 512 * prompts, 128 - prompts, 640.0])
        steps[i - 1 if i else 0][0] = ms * (launch_scale if prompts else 1.0)  # the interval before times this one
    return {"gpu": "NVIDIA H200", "driver": "580.159.04, 700.00 W", "vllm_version": "0.26.0", "shape": shape,
            "date": "2026-12-01T04:07:40", "input_tokens": 512, "output_tokens": 256, "budget": 16384,
            "rows": [{"batch": 128, "bound": "advisor", "spread": 0.0, "max_capture_size": 640, "capture_sizes": sizes,
                      "tokens_per_s": 8800.0, "j_per_token": 0.078, "steps_columns": COLUMNS, "steps": steps}]}


def test_the_report_prices_the_runs_and_lists_the_runs_that_failed(tmp_path):
    run = _served_run()
    run["rows"].append({"batch": 256, "bound": "wide", "error": "Traceback ...\nCUDA out of memory"})
    source = tmp_path / "run.json"
    source.write_text(json.dumps(run))
    out = tmp_path / "r"
    report.main([str(source), "--report", str(out)])
    d = json.loads(out.with_suffix(".json").read_text())
    (row,) = d["rows"]
    assert row["admissions"]["measured"][:2] == pytest.approx([0.5, 0.5], abs=0.02)
    groups = {(g["k"], g["graph"]): g for g in row["groups"]}
    for key in (("0", "full"), ("1", "piecewise")):
        assert groups[key]["measured_ms_p50"] == pytest.approx(groups[key]["predicted_ms_p50"], rel=1e-6)
    assert d["errors"] == [{"source": str(source), "batch": 256, "bound": "wide", "error": "CUDA out of memory"}]
    md = out.with_suffix(".md").read_text()
    assert "## Prompts admitted a step" in md and "## What an uncaptured step costs" in md
    assert "batch 256, wide" in md and "CUDA out of memory" in md


def test_runs_of_several_shapes_are_fitted_together_and_each_shape_alone(tmp_path):
    paths = []
    for shape in ("Llama-3.1-8B", "qwen3-4b"):
        paths.append(tmp_path / f"{shape}.json")
        paths[-1].write_text(json.dumps(_served_run(shape, launch_scale=1.3 if shape == "qwen3-4b" else 1.0)))
    d = report.analyse([str(p) for p in paths])
    assert list(d["eager_fits"]) == [report.ALL, "Llama-3.1-8B", "qwen3-4b"]
    eight_b, four_b = d["rows"]
    # one row a shape: its own shape's fit prices it, and no other shape's
    assert abs(eight_b["eager_fit_error_pct"]["Llama-3.1-8B"]["added"]) < 0.5
    assert abs(four_b["eager_fit_error_pct"]["qwen3-4b"]["added"]) < 0.5
    assert "qwen3-4b" not in eight_b["eager_fit_error_pct"]
    md = report.markdown({**d, "command": "x", "shipped_launch_us_per_layer": 312.0})
    assert "| qwen3-4b | added |" in md and "fitted over its shape" in md


def test_a_run_of_a_published_shape_is_served_from_its_config_and_priced_as_that_shape():
    config = vllm_served_steps.model_config("qwen3-4b")
    assert (config["num_hidden_layers"], config["hidden_size"], config["torch_dtype"]) == (36, 2560, "bfloat16")
    assert vllm_served_steps.model_config("Llama-3.1-8B")["num_hidden_layers"] == 32
    pricer = report.Pricer("qwen3-4b")
    assert pricer.layers == 36
    assert pricer.launch_ms == pytest.approx(pricer.model.terms.eager_us_per_layer * 36 / 1e3)


def _joined_shares(spread: float, batch: int = 128, output: int = 256, steps: int = 3000) -> list[float]:
    load_class = vllm_served_steps.spread_load(vllm_served_steps.advisors_steady_load(), spread)
    engine = _Counting(batch)
    load = load_class(engine.module, engine, batch, 4, output, 1000).start()
    deadline = time.monotonic() + 60
    while len(engine.joined) < steps and time.monotonic() < deadline:
        time.sleep(0.01)
    load.stop()
    steady = engine.joined[2 * output:steps]  # after the staggered first round
    return [sum(1 for k in steady if min(k, 2) == n) / len(steady) for n in range(3)]


def test_the_advisor_s_fixed_length_load_admits_prompts_regularly_and_a_spread_one_does_not():
    """The premise of the report's admissions table: every output as long, a request ends every L_out / B steps
    (batch 128, 256 out: steps of none and of one prompt alternate); spread lengths end them at random."""
    assert _joined_shares(0.0) == pytest.approx([0.5, 0.5, 0.0], abs=0.01)
    none, one, more = _joined_shares(0.5)
    assert more > 0.04 and none > 0.55  # Poisson of mean 0.5: 0.61 / 0.30 / 0.09
