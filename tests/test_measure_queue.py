"""The measured tier as a queue in the study's storage: workers meter disjoint plans on their own (fake) GPUs, a
worker killed mid-measurement has its plan measured by another, units that disagree are reported, and one process
measures what and in the order the stage always did."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from optuna.trial import TrialState
from rich.console import Console

from advisor.formats import Format
from advisor.models.shape import ModelShape
from advisor.plan import LayerGroup, Plan
from advisor.recipe import validate_recipe
from advisor.report.summary import build_summary, write_report
from advisor.search.measured import QUEUE_SUFFIX, set_round
from advisor.search.policy import measurement_targets
from advisor.search.storage import open_storage
from advisor.search.study import candidates, open_owned_study, run_search, save_run_meta
from advisor.search.trial_record import measured_drifts, measured_energy, measured_units
from advisor.testing import AdditiveEvaluator, FakeMeasuredGPU
from advisor.workflows.measured_tier import energy_stage, worker_stage
from advisor.workflows.progress import ProgressReporter

ROOT = Path(__file__).resolve().parents[1]
GROUPS = tuple(LayerGroup(f"layers.{i}.{r}", (f"m{i}{r}",), ((64, 64),)) for i in range(3) for r in ("qkv", "down"))

WORKER = textwrap.dedent("""
    import sys, time, optuna
    from advisor.recipe import validate_recipe
    from advisor.search.measured import QUEUE_SUFFIX
    from advisor.search.storage import open_storage
    from advisor.testing import FakeMeasuredGPU
    from advisor.workflows.measured_tier import worker_stage
    from advisor.workflows.progress import ProgressReporter
    from rich.console import Console

    url, out, delay, gated = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4] == "gated"
    recipe = validate_recipe({"name": "m", "target": "b200", "out": out, "storage": url})
    storage = open_storage(url)
    study = optuna.load_study(study_name="m", storage=storage)


    class Gated(FakeMeasuredGPU):
        # holds its first plan until the coordinator has taken one: on a busy machine the coordinator can
        # otherwise be late enough to find the queue empty, and the split would depend on the machine's load
        def estimate(self, plan, workload):
            global gated
            end = time.monotonic() + 60
            while gated and time.monotonic() < end and not any(
                    t.user_attrs.get("kind") == "plan" and t.user_attrs.get("unit", {}).get("gpu_uuid") == "GPU-a"
                    for t in optuna.load_study(study_name="m" + QUEUE_SUFFIX, storage=storage).get_trials()):
                time.sleep(0.02)
            gated = False
            return super().estimate(plan, workload)


    print("ready", flush=True)
    n = worker_stage(study, storage, Gated("GPU-b", delay_s=delay), recipe,
                     ProgressReporter(Console(stderr=True), heartbeat=False), poll_s=0.02)
    print(n, flush=True)
""")


@dataclass
class Ctx:
    measured_model: FakeMeasuredGPU


@pytest.fixture
def searched(request, tmp_path):
    """A finished search (fake evaluator) in a journal file (or PostgreSQL: ``indirect`` parameter), owned by this
    process as `advisor search` owns it."""
    url = f"journal:{tmp_path / 'study.journal'}"
    if getattr(request, "param", "journal") == "postgresql":
        url = request.getfixturevalue("postgres_server").create_database(f"q{abs(hash(str(tmp_path))) % 10**8}")
    recipe = validate_recipe({"name": "m", "target": "b200", "out": str(tmp_path), "accuracy": {"max_kl": 0.1},
                              "storage": url,
                              "search": {"trials": 12, "seed": 1, "sampler": "random", "measured_candidates": 3}})
    recipe.run_dir.mkdir(parents=True)
    owned = open_owned_study(recipe, False, {"test": 1}, lambda _msg: None)
    save_run_meta(owned.study, {"version": "test", "recipe": recipe.model_dump(mode="json"),
                                "shape": ModelShape(GROUPS, 3, 64, 4, 4, 16, 100, 6400).to_dict(),
                                "model": {"name": "fake", "fingerprint": "0"}})
    run_search(owned.study, AdditiveEvaluator(), recipe, GROUPS)
    yield owned.study, recipe
    owned.release()


def _stage(study, recipe, model) -> str:
    buf = io.StringIO()
    energy_stage(study, Ctx(model), recipe, ProgressReporter(Console(file=buf, width=200), heartbeat=False))
    return buf.getvalue()


def _targets(study, recipe) -> list[Plan]:
    q = measurement_targets(study, ["chat"], recipe.search.measured_candidates)
    return [q.reference, *q.baselines, *q.candidates]


def _queue_trials(recipe):
    import optuna

    try:
        return optuna.load_study(study_name="m" + QUEUE_SUFFIX, storage=open_storage(recipe.storage_url)).get_trials()
    except KeyError:  # the coordinator has not opened the queue yet
        return []


def _start_worker(recipe, tmp_path: Path, delay_s: float, gated: bool = False) -> subprocess.Popen:
    """A worker process on GPU-b; ``gated``: it holds its first plan until the coordinator has taken one."""
    proc = subprocess.Popen([sys.executable, "-c", WORKER, recipe.storage_url, str(tmp_path / "w"), str(delay_s),
                             "gated" if gated else "free"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    return proc


def test_one_process_measures_what_and_in_the_order_the_stage_always_did(searched):
    """--workers 1: all-BF16, the other baselines and the candidates in the policy's order (each plan once: the
    stage before the queue measured a candidate that is also a baseline twice), all-BF16 again; each record is the
    model's estimate with its unit named; NVFP4 stays predicted."""
    study, recipe = searched
    targets = _targets(study, recipe)
    fake = FakeMeasuredGPU("GPU-a")
    log = _stage(study, recipe, fake)
    runnable = [p for p in targets if Format.NVFP4 not in p.formats.values()]  # a candidate may be a baseline too
    assert fake.calls == list(dict.fromkeys(p.id for p in runnable)) + [targets[0].id]
    measured = measured_energy(study)
    assert set(measured) == {p.id for p in runnable} and "stays predicted" in log
    for plan in runnable:
        (e,) = measured[plan.id]
        expected = FakeMeasuredGPU().estimate(plan, recipe.workloads[0])
        assert e.j_per_token == pytest.approx(expected.j_per_token)
        assert e.source == f"{expected.source} on GPU-a"
    (unit,) = measured_units(study).values()
    assert unit.gpu_uuid == "GPU-a" and unit.plans == list(dict.fromkeys(p.id for p in runnable))
    (check,) = measured_drifts(study)
    assert check.drift_pct["chat"] == pytest.approx(0.0) and "GPU-a" in check.source
    assert "drift check: all-bf16 measured again drew +0.0% on 'chat'" in log


@pytest.mark.parametrize("searched", ["journal", "postgresql"], indirect=True)
def test_two_workers_measure_disjoint_plans_each_on_its_gpu_and_the_coordinator_merges(searched, tmp_path):
    study, recipe = searched
    set_round(study, "pending")
    worker = _start_worker(recipe, tmp_path, 0.2, gated=True)
    coordinator = FakeMeasuredGPU("GPU-a", delay_s=0.2)
    _stage(study, recipe, coordinator)
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    done = [t for t in _queue_trials(recipe) if t.state == TrialState.COMPLETE and t.user_attrs["kind"] == "plan"]
    counts = Counter(t.user_attrs["plan_id"] for t in done)
    assert set(counts.values()) == {1}  # no plan measured twice
    by_unit = Counter(t.user_attrs["unit"]["gpu_uuid"] for t in done)
    assert set(by_unit) == {"GPU-a", "GPU-b"} and by_unit["GPU-b"] == int(out.split()[-1])
    runnable = {p.id for p in _targets(study, recipe) if Format.NVFP4 not in p.formats.values()}
    measured = measured_energy(study)
    assert set(measured) == runnable
    units = measured_units(study)
    assert sorted(units) == ["GPU-a", "GPU-b"]
    assert sorted(p for u in units.values() for p in u.plans) == sorted(runnable)
    for unit in units.values():
        assert all(measured[p][0].source.endswith(f"on {unit.gpu_uuid}") for p in unit.plans)
    summary = build_summary(study)
    assert summary.unit_agreement["agree"] is True and summary.unit_agreement["spread_pct"] == pytest.approx(0.0)
    assert "Measured on 2 GPUs" in write_report(study, recipe.run_dir).read_text()


def test_a_worker_killed_mid_measurement_has_its_plan_measured_again(searched, tmp_path):
    study, recipe = searched
    set_round(study, "pending")
    victim = _start_worker(recipe, tmp_path, 3.0)  # long measurements: the kill lands inside one
    victim_took_one = threading.Event()  # the coordinator holds its first plan until then: a late worker has one
    holder = threading.Thread(target=_stage, args=(study, recipe, _WaitsFor(victim_took_one, "GPU-a", delay_s=0.3)))
    holder.start()
    end = time.monotonic() + 60
    while not any(t.state == TrialState.RUNNING and t.user_attrs.get("worker", {}).get("pid") == victim.pid
                  for t in _queue_trials(recipe)):
        assert time.monotonic() < end, "the worker never took a plan"
        time.sleep(0.05)
    victim_took_one.set()
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    holder.join(timeout=120)
    assert not holder.is_alive()
    trials = _queue_trials(recipe)
    (killed,) = [t for t in trials if t.state == TrialState.FAIL]
    assert killed.user_attrs["worker"]["pid"] == victim.pid
    (retried,) = [t for t in trials if t.system_attrs.get("failed_trial") == killed.number]
    assert retried.user_attrs["plan_id"] == killed.user_attrs["plan_id"]
    assert retried.state == TrialState.COMPLETE or "stays_predicted" in retried.user_attrs  # NVFP4: refused
    assert retried.user_attrs["unit"]["gpu_uuid"] == "GPU-a"
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert set(measured_energy(study)) == {p.id for p in _targets(study, recipe)
                                           if Format.NVFP4 not in p.formats.values()}


def test_units_whose_all_bf16_disagree_beyond_the_drift_are_reported_and_put_on_one_scale(searched):
    """A second unit drawing 10% more than the first, each steady against itself (0% drift): the report says the
    units disagree, and summary.json carries the spread and the tolerance. The plans the second unit measured
    compete at the first unit's scale (their number times the ratio of the units' all-BF16), labelled so; a
    plan measured there would otherwise look 10% dearer than the same plan measured on the first."""
    study, recipe = searched
    set_round(study, "pending")
    storage = open_storage(recipe.storage_url)
    coordinator = _Signalling("GPU-a", delay_s=0.2)
    other = _WaitsFor(coordinator.took_a_plan, "GPU-b", scale=1.1, delay_s=0.05)
    worker = threading.Thread(target=worker_stage, args=(study, storage, other, recipe,
                                                         ProgressReporter(Console(file=io.StringIO()))),
                              kwargs={"poll_s": 0.01})
    worker.start()
    printed = _stage(study, recipe, coordinator)
    worker.join(timeout=60)
    assert other.calls  # both units measured
    assert "differ by 10.0% on 'chat'" in printed and "put on GPU-a's scale" in printed
    check = build_summary(study).unit_agreement
    assert check["agree"] is False and check["tolerance_pct"] == pytest.approx(0.0)
    assert check["spread_pct"] == pytest.approx(10.0)
    assert check["reference_j_per_token"]["GPU-b"] == pytest.approx(1.1 * check["reference_j_per_token"]["GPU-a"])
    md = write_report(study, recipe.run_dir).read_text()
    assert "the units disagree: their all-BF16 differ by 10.0% on 'chat'" in md
    assert "GPU-a" in md and "GPU-b" in md
    assert check["scaled_to"] == "GPU-a" and "put on GPU-a's scale" in md
    raw, units = measured_energy(study), measured_units(study)
    assert units["GPU-b"].plans and units["GPU-a"].plans
    truth = FakeMeasuredGPU("GPU-a")  # what the first unit draws for the same plan
    chosen = {c.plan.id: c for c in candidates(study)}
    for plan_id in units["GPU-b"].plans:
        c = chosen[plan_id]
        same_plan_on_a = truth.estimate(c.plan, recipe.workloads[0]).j_per_token
        assert raw[plan_id][0].j_per_token == pytest.approx(1.1 * same_plan_on_a)
        assert c.energy("chat") == pytest.approx(same_plan_on_a)
    for plan_id in units["GPU-a"].plans:
        assert chosen[plan_id].energy("chat") == raw[plan_id][0].j_per_token
    records = {r["plan_id"]: r for r in build_summary(study).model_dump(mode="json")["trials"]}
    assert all("put on GPU-a's scale" in records[p]["energy"][0]["source"] for p in units["GPU-b"].plans)


class _Signalling(FakeMeasuredGPU):
    """A coordinator's fake GPU that says when it has taken a plan (its first estimate)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.took_a_plan = threading.Event()

    def estimate(self, plan, workload):
        self.took_a_plan.set()
        return super().estimate(plan, workload)


class _WaitsFor(FakeMeasuredGPU):
    """A fake GPU holding its first plan until ``event``: both units measure, however busy the machine."""

    def __init__(self, event: threading.Event, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.event = event

    def estimate(self, plan, workload):
        self.event.wait(timeout=60)
        return super().estimate(plan, workload)


def test_a_worker_on_the_coordinators_gpu_stays_out(searched):
    study, recipe = searched
    same = FakeMeasuredGPU("GPU-a")
    set_round(study, "open", _unit("GPU-a"), _targets(study, recipe)[0])
    assert worker_stage(study, open_storage(recipe.storage_url), same, recipe,
                        ProgressReporter(Console(file=io.StringIO()))) == 0
    assert same.calls == []


def _unit(uuid: str):
    from advisor.search.measured import Unit

    return Unit(uuid, "Fake GPU")


def test_a_plan_retried_from_a_dead_worker_is_labelled_with_the_unit_that_measured_it(searched):
    """Optuna's retry copies the dead trial's attributes, the dead unit's all-BF16 among them: the unit that takes
    the plan records its own."""
    from datetime import datetime

    from advisor.search.measured import Measurer, Merged, enqueue, merge, open_queue
    from advisor.search.storage import this_worker

    study, recipe = searched
    reference, fp8 = Plan.uniform(GROUPS, Format.BF16), Plan.uniform(GROUPS, Format.FP8)
    chat = recipe.workloads[0]
    queue = open_queue(study, open_storage(recipe.storage_url))
    enqueue(queue, [reference], set())
    dead = FakeMeasuredGPU("GPU-b", scale=2.0).estimate(reference, chat)
    queue.enqueue_trial({}, user_attrs={"kind": "plan", "plan_id": fp8.id, "plan": fp8.params(),
                                        "unit": {"gpu_uuid": "GPU-b", "gpu": "Fake GPU"},
                                        "unit_reference": [dead.to_dict()]})
    Measurer(study, queue, FakeMeasuredGPU("GPU-a"), recipe.workloads, reference, this_worker("GPU-a")).serve()
    merge(study, queue, Merged(since=datetime.min), lambda _line: None)
    units = measured_units(study)
    assert set(units) == {"GPU-a"} and units["GPU-a"].plans == [reference.id, fp8.id]
    (taken,) = [t for t in queue.get_trials() if t.user_attrs.get("plan_id") == fp8.id]
    assert taken.user_attrs["unit"]["gpu_uuid"] == "GPU-a" and not taken.user_attrs["unit_reference"]
    own = FakeMeasuredGPU().estimate(reference, chat)
    assert units["GPU-a"].reference[0].j_per_token == pytest.approx(own.j_per_token)
    assert measured_energy(study)[fp8.id][0].source.endswith("on GPU-a")


def test_a_plan_whose_measurement_raised_in_a_worker_is_named_and_not_retried(searched):
    """An error (not a death) fails the plan's queue trial as a trial's error fails it: no retry, one line."""
    from datetime import datetime

    from advisor.search.measured import Measurer, enqueue, failed_plans, open_queue
    from advisor.search.storage import this_worker

    study, recipe = searched
    since = datetime.now()
    fp8 = Plan.uniform(GROUPS, Format.FP8)

    class OutOfMemory(FakeMeasuredGPU):
        def estimate(self, plan, workload):
            if plan.id == fp8.id:
                raise RuntimeError("CUDA out of memory")
            return super().estimate(plan, workload)

    queue = open_queue(study, open_storage(recipe.storage_url))
    enqueue(queue, [fp8], set())
    with pytest.raises(RuntimeError, match="out of memory"):
        Measurer(study, queue, OutOfMemory("GPU-b"), recipe.workloads, Plan.uniform(GROUPS, Format.BF16),
                 this_worker("GPU-b")).serve()
    (line,) = failed_plans(study, queue, since)
    assert "all-fp8: measuring it failed" in line and "on GPU-b" in line and line.endswith("it stays predicted")
    assert not queue.get_trials(states=(TrialState.WAITING,))


HOOK = textwrap.dedent("""
    # Every process of the run (the coordinator and its `advisor worker` children) meters on a fake GPU of its own.
    import os, sys
    import advisor.energy.prediction as prediction
    from advisor.testing import FakeMeasuredGPU

    real = prediction.make_energy_tiers
    delay = 12.0 if "search" in sys.argv else 0.3  # the coordinator is slow: the worker joins before the queue empties
    # (12 s a plan: a worker that starts slowly on 2 busy cores, its torch import alone 20-30 s, still joins)

    def fake(mode, shape, target, *args, **kwargs):
        predicted, _ = real("predicted", shape, target, *args, **kwargs)
        return predicted, FakeMeasuredGPU(f"GPU-fake-{os.getpid()}", delay_s=delay)

    prediction.make_energy_tiers = fake
""")


def test_advisor_search_with_two_workers_meters_the_front_on_both_gpus(tmp_path):
    """The product path: `advisor search --workers 2`, each process with its own (fake) measured GPU: the worker
    child waits for the queue after its trials, meters plans, and the report names both GPUs."""
    import yaml
    from conftest import tiny_recipe_dict

    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(HOOK)
    recipe = tiny_recipe_dict(tmp_path / "runs", trials=4, sampler="random", measured_candidates=3)
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({**recipe, "name": "e", "formats": ["bf16", "fp8"]}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "hook"), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", "from advisor.console import main; main()", "search", "-r",
                           str(tmp_path / "r.yaml"), "--workers", "2", "--energy", "auto"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "runs" / "e" / "summary.json").read_text())
    units = {u["gpu_uuid"]: u["plans"] for u in summary["measured_units"]}
    assert len(units) == 2 and all(units.values()), units  # both processes metered plans
    assert sorted(p for plans in units.values() for p in plans) == sorted(
        r["plan_id"] for r in {r["plan_id"]: r for r in summary["trials"] if r["energy_measured"]}.values())
    # a unit makes its drift check once it measured a plan besides all-BF16 (with the coordinator this slow, it
    # may have measured only all-BF16 while the worker took the rest)
    bf16 = next(r["plan_id"] for r in summary["trials"] if r["trial"] == summary["baselines"]["all-bf16"])
    owing = [uuid for uuid, plans in units.items() if set(plans) - {bf16}]
    assert summary["unit_agreement"]["agree"] is True and owing
    assert sorted(d["source"].rsplit(" on ", 1)[1] for d in summary["measured_drift"]) == sorted(owing)
    assert "Measured on 2 GPUs" in (tmp_path / "runs" / "e" / "report.md").read_text()
    assert "measured_s" in summary["timings_s"]
