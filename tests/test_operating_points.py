"""Operating points under a latency objective (advisor.search.operating), the recommendation on them,
the payback of the search, and the objective's recipe errors. Synthetic step-time models only: no model
is loaded."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from advisor.cli import app
from advisor.energy.meter import CPU_WATTS_PER_CORE, EnergyWindow, GPUState, SummedCounter
from advisor.errors import InputError
from advisor.formats import GPU, GPU_SPECS, Format
from advisor.models.shape import llama_shape
from advisor.plan import Plan
from advisor.recipe.schema import Recipe, Workload, validate_recipe
from advisor.recipe.workload_flags import parse_workload_flag
from advisor.report.schema import OperatingPointRecord
from advisor.search.frontier import Candidate, recommend
from advisor.search.operating import (
    KV_MEMORY_SHARE,
    SearchEnergy,
    describe_days,
    kv_batch_limit,
    largest_meeting,
    operating_point,
    payback,
    steady_state,
    weight_bytes,
)
from advisor.search.study import study_key

SHAPE = llama_shape("model.layers", 2, 256, 512, 4, 2, 1000)
H100 = GPU_SPECS[GPU.H100]
BF16_PLAN = Plan.uniform(SHAPE.groups, Format.BF16)
FP8_PLAN = Plan.uniform(SHAPE.groups, Format.FP8)


class LinearSteps:
    """decode ms = base + per_seq * batch (+ ``bump`` ms for batches in ``bump_at``), at ``watts``; a prefill of
    ``prefill_ms``. Per format, so that plans differ."""

    def __init__(self, base, per_seq, watts, prefill_ms=0.0, bump=0.0, bump_at=range(0)):
        self.base, self.per_seq, self.watts, self.prefill_ms = base, per_seq, watts, prefill_ms
        self.bump, self.bump_at = bump, bump_at

    def decode_step(self, plan, batch, context):
        fmt = plan.uniform_format()
        ms = self.base[fmt] + self.per_seq[fmt] * batch + (self.bump if batch in self.bump_at else 0.0)
        return ms, self.watts[fmt] * ms / 1e3

    def prefill(self, plan, length):
        fmt = plan.uniform_format()
        return self.prefill_ms, self.watts[fmt] * self.prefill_ms / 1e3


# FP8: a larger fixed cost per step (quantizing activations), a smaller one per sequence
STEPS = LinearSteps(base={Format.BF16: 1.0, Format.FP8: 1.5}, per_seq={Format.BF16: 0.02, Format.FP8: 0.01},
                    watts={Format.BF16: 500.0, Format.FP8: 500.0})


def served(**objective) -> Workload:
    return Workload(name="w", input_tokens=64, output_tokens=64, **objective)


def point(plan, workload, steps=STEPS):
    return operating_point(steps, SHAPE, H100, plan, workload, "predicted (synthetic)")


def test_the_largest_batch_of_monotone_step_times_is_exact():
    # without prefills TPOT is the decode step: 1 + 0.02 b <= 4.2 ms up to b = 160 (between grid points 128 and 192)
    op = point(BF16_PLAN, served(tpot_ms=4.2))
    assert op.meets and op.state.batch == 160 and op.bound == "objective"
    assert op.state.tpot_ms <= 4.2 < STEPS.decode_step(BF16_PLAN, 161, 0)[0]


def test_a_slow_region_of_the_step_times_does_not_hide_larger_batches():
    # a kernel change makes batches 20-40 slow; 41..200 meet the objective again
    bumpy = LinearSteps(STEPS.base, STEPS.per_seq, STEPS.watts, bump=5.0, bump_at=range(20, 41))
    assert point(BF16_PLAN, served(tpot_ms=5.0), bumpy).state.batch == 200
    assert largest_meeting(lambda b: b <= 3 or 8 <= b <= 100, 1024) == 100
    assert largest_meeting(lambda b: False, 1024) is None and largest_meeting(lambda b: True, 0) is None


def test_steady_state_prefills_lengthen_tpot_and_ttft_and_p90_more_than_p50():
    with_prefill = LinearSteps(STEPS.base, STEPS.per_seq, STEPS.watts, prefill_ms=3.0)
    p50 = steady_state(with_prefill, BF16_PLAN, served(tpot_ms=100.0), 64)
    p90 = steady_state(with_prefill, BF16_PLAN, served(tpot_ms=100.0, percentile="p90"), 64)
    decode_ms, decode_j = with_prefill.decode_step(BF16_PLAN, 64, 0)
    assert decode_ms < p50.tpot_ms < p90.tpot_ms and p50.ttft_ms < p90.ttft_ms
    assert p50.ttft_ms >= decode_ms + 3.0  # its own prefill rides one step
    # each step admits 64 / 64 = 1 request on average: J/token = decode J / B + prefill J / L_out
    assert p50.j_per_token == pytest.approx(decode_j / 64 + 500.0 * 3.0 / 1e3 / 64)
    assert p50.tokens_per_s == pytest.approx(64 / ((decode_ms + 3.0) / 1e3))


def test_the_kv_cache_bounds_the_batch_and_smaller_weights_leave_room():
    big = llama_shape("model.layers", 32, 4096, 14336, 32, 8, 128256)
    long = Workload(name="long", input_tokens=30_000, output_tokens=2_000, tpot_ms=1e4)
    bf16, fp8 = (kv_batch_limit(big, Plan.uniform(big.groups, f), H100, long) for f in (Format.BF16, Format.FP8))
    per_request = big.kv_bytes(32_000)
    assert bf16 == int((80e9 * KV_MEMORY_SHARE - weight_bytes(big, Plan.uniform(big.groups, Format.BF16)))
                       // per_request)
    assert fp8 > bf16 > 0
    op = operating_point(STEPS, big, H100, Plan.uniform(big.groups, Format.BF16), long, "synthetic")
    assert op.bound == "memory" and op.state.batch == bf16


def test_the_concurrency_limit_bounds_the_batch():
    op = point(BF16_PLAN, served(tpot_ms=1e4, max_concurrency=48))
    assert op.state.batch == 48 and op.bound == "max_concurrency"


def test_a_power_cap_stretches_the_steps_it_would_exceed():
    uncapped = steady_state(STEPS, BF16_PLAN, served(tpot_ms=10.0), 32)
    capped = steady_state(STEPS, BF16_PLAN, served(tpot_ms=10.0), 32, power_cap_w=250.0)
    assert capped.tpot_ms == pytest.approx(2 * uncapped.tpot_ms)  # 500 W stretched to 250 W: twice the time
    assert capped.j_per_token == pytest.approx(uncapped.j_per_token)  # energy held
    assert capped.power_w == pytest.approx(250.0)
    assert steady_state(STEPS, BF16_PLAN, served(tpot_ms=10.0), 32, power_cap_w=900.0) == uncapped


def cand(trial, plan, j, feasible=True):
    return Candidate(trial, plan, 0.0 if plan is BF16_PLAN else 0.01, 10.0, {"w": j}, feasible)


def rule(workload, steps=STEPS, fixed=(2.0, 1.5)):
    cands = [cand(0, BF16_PLAN, fixed[0]), cand(1, FP8_PLAN, fixed[1])]
    points = {(p.plan_id, p.workload): p for p in (point(BF16_PLAN, workload, steps), point(FP8_PLAN, workload, steps))}
    return recommend(cands, ["w"], operating=points), points


def test_an_objective_no_plan_meets_keeps_bf16_and_says_so():
    rec, points = rule(served(tpot_ms=0.5))
    assert not any(p.meets for p in points.values())
    assert rec.candidate.plan.id == BF16_PLAN.id and "no plan meets the latency objective of 'w'" in rec.reason


def test_an_objective_only_bf16_meets_keeps_bf16():
    rec, points = rule(served(tpot_ms=1.2))  # FP8's step never drops below 1.5 ms
    assert points[(BF16_PLAN.id, "w")].meets and not points[(FP8_PLAN.id, "w")].meets
    assert rec.candidate.plan.id == BF16_PLAN.id and "no plan meets" not in rec.reason


def test_an_objective_only_fp8_meets_recommends_fp8():
    fast_fp8 = LinearSteps({Format.BF16: 2.0, Format.FP8: 0.8}, STEPS.per_seq, STEPS.watts)
    rec, points = rule(served(tpot_ms=1.5), fast_fp8)
    assert not points[(BF16_PLAN.id, "w")].meets and rec.candidate.plan.id == FP8_PLAN.id


def test_an_objective_all_meet_prices_each_plan_at_its_own_largest_batch():
    rec, points = rule(served(tpot_ms=5.0))
    bf16, fp8 = points[(BF16_PLAN.id, "w")], points[(FP8_PLAN.id, "w")]
    assert (bf16.state.batch, fp8.state.batch) == (200, 350)
    assert fp8.j_per_token < bf16.j_per_token and rec.candidate.plan.id == FP8_PLAN.id
    assert f"{100 * (1 - fp8.j_per_token / bf16.j_per_token):.1f}% less energy" in rec.reason


def test_a_plan_cheaper_at_the_stated_batch_but_not_at_the_operating_points_is_not_recommended():
    hot_fp8 = LinearSteps(STEPS.base, STEPS.per_seq, {Format.BF16: 500.0, Format.FP8: 1500.0})
    rec, points = rule(served(tpot_ms=5.0), hot_fp8, fixed=(2.0, 1.0))  # FP8 cheaper at the stated batch
    assert points[(FP8_PLAN.id, "w")].j_per_token > points[(BF16_PLAN.id, "w")].j_per_token
    assert rec.candidate.plan.id == BF16_PLAN.id


def test_the_stored_point_reads_back_as_the_summary_record():
    op = point(FP8_PLAN, served(tpot_ms=5.0))
    record = OperatingPointRecord.model_validate(op.to_dict())
    assert (record.batch, record.j_per_token, record.meets) == (op.state.batch, op.j_per_token, True)
    assert record.curve[0][0] == 1 and record.curve[-1][0] == 1024


def test_payback_arithmetic():
    spent = SearchEnergy(8.64e6, 600.0, "measured (NVML)", True)
    # 1 request/s of 100 tokens: 8.64e6 tokens a day; 0.1 J/token saved: 8.64e5 J a day; 8.64e6 J: 10 days
    pay = payback(spent, "w", 1.0, 100, 0.2, 0.1)
    assert pay.tokens_per_day == 8.64e6 and pay.saved_j_per_day == pytest.approx(8.64e5)
    assert pay.days == pytest.approx(10.0) and describe_days(pay.days) == "10.0 days"
    assert payback(spent, "w", 1.0, 100, 0.2, 0.2).days is None
    assert describe_days(None).startswith("never") and describe_days(0.5) == "12.0 hours"
    both = spent.plus(SearchEnergy(1.0, 1.0, "estimated (CPU)", False))
    assert both.joules == 8.64e6 + 1 and not both.measured and "earlier: estimated (CPU)" in both.source


def test_without_a_gpu_the_search_energy_is_an_estimate_labelled_so(monkeypatch):
    import advisor.energy.meter._window as window_module

    monkeypatch.setattr(window_module, "visible_gpu_count", lambda: 0)  # the CPU path, on a GPU machine too
    monkeypatch.setattr(window_module, "cpu_seconds", iter([10.0, 13.0]).__next__)
    spent = EnergyWindow("search").begin().end()
    assert spent.joules == 3.0 * CPU_WATTS_PER_CORE and not spent.measured
    assert spent.source.startswith("estimated (3 CPU seconds")


class _Counter:
    """A GPU's NVML counter: ``mj`` read after read."""

    def __init__(self, *mj: int) -> None:
        self.reads = iter(mj)

    def energy_mj(self) -> int:
        return next(self.reads)

    def state(self) -> GPUState:
        return GPUState("NVIDIA H200", 0, "580", 700.0, 1980, 3201, 40, 100.0, "GPU-a")


def test_the_search_window_sums_every_gpu_the_run_sees(monkeypatch):
    """Zeus's begin/end window over all GPUs: the workers' GPUs count, not only GPU 0."""
    import advisor.energy.meter._summed as summed_module
    import advisor.energy.meter._window as window_module

    opened = []

    def open_gpus(n: int) -> SummedCounter:
        opened.append(n)
        return SummedCounter([_Counter(1_000, 61_000), _Counter(5_000, 35_000), _Counter(0, 9_000)][:n])

    monkeypatch.setattr(window_module, "visible_gpu_count", lambda: 3)
    monkeypatch.setattr(summed_module, "open_gpus_counter", open_gpus)
    spent = EnergyWindow("search").begin().end()
    assert opened == [3] and spent.measured and spent.name == "search"
    assert spent.joules == pytest.approx(99.0)  # 60 + 30 + 9 J
    assert spent.source == "measured (NVML, 3x NVIDIA H200, whole run)"


@pytest.mark.parametrize(("workload", "site", "says"), [
    ({"percentile": "p90"}, {}, "states no objective"),
    ({"max_concurrency": 64}, {}, "states no objective"),
    ({"tpot_ms": 10, "ttft_ms": 5}, {}, "ttft_ms 5 is below tpot_ms 10"),
    ({"tpot_ms": 0}, {}, "tpot_ms: got 0"),
    ({"tpot_ms": 10, "percentile": "p99"}, {}, "percentile"),
    ({"tpot_ms": 10, "max_concurrency": 0}, {}, "max_concurrency"),
    ({"tpot_ms": 10}, {"power_cap_w": 50}, "idle power"),
])
def test_a_missing_or_impossible_objective_is_one_input_error(workload, site, says):
    with pytest.raises(InputError, match=says):
        validate_recipe({"target": "h100", "workloads": [{"name": "w", **workload}], "site": site})


def test_workload_flags_state_an_objective():
    assert parse_workload_flag("chat:tpot=8,ttft=500,p=p90,max_concurrency=256") == (
        "chat", {"tpot_ms": 8.0, "ttft_ms": 500.0, "percentile": "p90", "max_concurrency": 256})
    with pytest.raises(InputError, match="tpot must be a number of milliseconds"):
        parse_workload_flag("chat:tpot=fast")


def test_the_cli_refuses_an_impossible_objective_in_one_line(tmp_path):
    res = CliRunner().invoke(app, ["search", "--workload", "chat:tpot=10,ttft=5", "--out", str(tmp_path)])
    assert res.exit_code == 2
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "ttft_ms 5 is below tpot_ms 10" in errors[0]


def test_an_objective_does_not_change_the_study_key():
    plain = Recipe(workloads=[Workload(name="w")])
    stated = Recipe(workloads=[Workload(name="w", tpot_ms=8.0, percentile="p90")], site={"requests_per_s": 3})
    assert study_key(plain, {}) == study_key(stated, {})


def _summary_with(points, workload):
    return {"workloads": [workload.model_dump()], "operating_points": [p.to_dict() for p in points],
            "recommendation": {"plan_id": BF16_PLAN.id}, "baselines": {"all-bf16": 0},
            "trials": [{"trial": 0, "plan_id": BF16_PLAN.id, "formats": {g.name: "bf16" for g in SHAPE.groups}}],
            "payback": None}


def test_the_report_section_says_when_no_plan_meets_and_draws_the_frontier(tmp_path):
    from advisor.report.operating_md import operating_lines, operating_section
    from advisor.report.plots import plot_operating_points

    none_meets = served(tpot_ms=0.5)
    summary = _summary_with([point(BF16_PLAN, none_meets), point(FP8_PLAN, none_meets)], none_meets)
    text = "\n".join(operating_section(summary))
    assert "No plan meets this objective" in text and "TPOT <= 0.5 ms (p50)" in text
    assert operating_lines(summary) == ["operating points on 'w' (predicted): all-bf16 meets no batch"]
    all_meet = served(tpot_ms=5.0)
    summary = _summary_with([point(BF16_PLAN, all_meet), point(FP8_PLAN, all_meet)], all_meet)
    text = "\n".join(operating_section(summary))
    assert "| **all-bf16" in text
    # predicted-only points say where such batches have missed as served, and how to meter them
    assert "advisor verify RUN_DIR --engine vllm" in text and "operating_points_8b.md" in text
    plot_operating_points(summary, tmp_path / "operating_points.png")
    assert (tmp_path / "operating_points.png").read_bytes()[:4] == b"\x89PNG"
    # points priced by the vLLM step model say what that model was checked on, not the built-in runtime's miss
    vllm = {**summary, "operating_points": [{**p, "source": "predicted (vLLM 0.26.0 step model: engine terms fitted "
                                             "on NVIDIA H200, ...)", "tpot_margin": 0.035}
                                        for p in summary["operating_points"]]}
    text = "\n".join(operating_section(vllm))
    assert "engine_true.md" in text and "operating_points_8b.md" not in text
    assert "predicted TPOT is 3.5% under the objective" in text  # the share the points were kept under
    assert "advisor verify RUN_DIR --engine vllm" in text
