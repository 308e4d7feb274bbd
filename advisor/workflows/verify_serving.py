"""`advisor verify`'s servings: each plan's export served once by vLLM in a process of its own (formats,
log-probabilities, every stated workload and each objective's operating batch, the batch search's further rounds
in the same engine), kept as it finishes (:mod:`advisor.deploy.verification._served_store`) and read back by a verify
of the same job; with ``workers`` over 1, that many plans at once, each engine on GPUs of its own
(:mod:`advisor.deploy.engine_slots`), all-BF16 and the recommendation on the same ones."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from advisor.deploy import serving_gpus
from advisor.deploy.engine_slots import Slot, engine_slots, run_on_slots
from advisor.deploy.serving_gpus import engine_memory_share
from advisor.deploy.verification import read_serving, serving_key, shown_role, write_serving
from advisor.deploy.vllm import ServeJob, VllmEnergyModel, run_in_child
from advisor.energy.meter import MeterConfig
from advisor.plan import Plan
from advisor.recipe.schema import Workload
from advisor.search.measured import BatchSearch, search_batches, step_up_ceiling
from advisor.search.operating import at_batch


class StartedServing(Protocol):
    """A role's serving started before :func:`serve_plans` (:class:`~advisor.workflows.verify_early.EarlyServing`):
    its answer once let meter, None where it failed."""

    role: str

    def result(self) -> dict[str, Any] | None: ...


def operating_workloads(summary: dict[str, Any], plan: Plan) -> list[Workload]:
    """The plan's operating points of the run (largest batch under each objective) as workloads to serve."""
    stated = {w["name"]: Workload(**w) for w in summary["workloads"]}
    return [at_batch(stated[p["workload"]], p["batch"]) for p in summary.get("operating_points") or []
            if p["plan_id"] == plan.id and p["workload"] in stated]


def operating_searches(summary: dict[str, Any], plan: Plan, step_up: bool = False) -> list[BatchSearch]:
    """The plan's operating points of the run as searches that start at their predicted batch; with ``step_up``, a
    predicted batch that meets is followed by a larger one (:func:`~advisor.search.measured.step_up_ceiling`), no
    larger than the plan's largest predicted operating batch: the engine's ``max_num_seqs`` stays what the team's
    serving config sets for that objective (an 8B's FP8 engines sized 300 for a step up served batch 80-240 6-11%
    slower than the same checkpoint in an engine sized 240, on one H200: reports/benchmarks/verify_time.md)."""
    stated = {w["name"]: Workload(**w) for w in summary["workloads"]}
    points = [p for p in summary.get("operating_points") or [] if p["plan_id"] == plan.id and p["workload"] in stated]
    bound = max((p["batch"] for p in points), default=0)
    return [BatchSearch(stated[p["workload"]], p["batch"], p.get("curve") or (), predicted=p,
                        step_up_to=min(step_up_ceiling(p["batch"]), bound) if step_up else 0) for p in points]


def search_ceiling(summary: dict[str, Any], plan: Plan, step_up: bool) -> int:
    """The largest batch the plan's operating searches may serve (its largest predicted operating batch): its engine
    is sized, and its CUDA graphs captured, for every batch up to it (a batch the engine did not capture would run
    padded to a larger one)."""
    return max((max(s.predicted_batch, s.step_up_to) for s in operating_searches(summary, plan, step_up)),
               default=0)


def serve_and_search(plan: Plan, job: ServeJob, summary: dict[str, Any], model: Any, step_up: bool = False,
                     hold: Callable[[], None] | None = None) -> dict[str, Any]:
    """``job`` served, and per objective (workload name, under ``searches``) vLLM's largest batch that meets it
    (:mod:`advisor.search.measured._batch_search`): the job's rows at the predicted batches are the first round, with
    its stated workloads' rows beside them, and a miss there serves the smaller batches in the same engine
    (``model``: a
    :class:`~advisor.deploy.vllm._engine.VllmEnergyModel` of the plan's checkpoint)."""
    searches = operating_searches(summary, plan, step_up)
    model.open_with(plan, job, hold=hold)
    stated = [Workload(**w) for w in summary["workloads"]]  # in the job: their rows bound the searches of their load
    found = search_batches(model, plan, searches, alongside=stated)
    return {**model.served(plan), "searches": {s.workload.name: f for s, f in zip(searches, found, strict=True)}}


@dataclass(frozen=True)
class Serving:
    """What serving any plan of a run takes, beside the plan and its checkpoint."""

    run_dir: Path
    summary: dict[str, Any]
    base: ServeJob  # the job every plan's is made from: tokens, items, meter, GPUs an engine spreads over
    energy: bool
    vllm_version: str
    gpu: str  # the GPU's name, for the measurements' labels and the kept servings' key
    runner: Callable[[ServeJob], dict[str, Any]] | None = None
    rounds_runner: Callable[[ServeJob, Any], dict[str, Any]] | None = None
    status: Callable[[str], None] = lambda _m: None
    step_up: bool = True  # a predicted operating batch that meets is followed by a larger one (not under --quick)


def role_job(role: str, plan: Plan, path: Path, s: Serving) -> tuple[ServeJob, str]:
    """The job serving ``role``'s plan from ``path``, and its key among kept servings."""
    workloads = [*s.summary["workloads"], *(w.model_dump() for w in operating_workloads(s.summary, plan))]
    job = replace(s.base, checkpoint=str(path), workloads=tuple(workloads) if s.energy else (),
                  max_batch=search_ceiling(s.summary, plan, s.step_up) if searched_in_serving(s, plan) else 0)
    return job, serving_key(job, s.vllm_version, s.gpu, searched=searched_in_serving(s, plan))


def kept_serving(role: str, plan: Plan, key: str, s: Serving) -> dict[str, Any] | None:
    kept = read_serving(s.run_dir, plan.id, key)
    if kept is not None:
        s.status(f"plan {plan.id} ({shown_role(role, plan.id)}): served by vLLM at {kept['served_at']}, read back "
                 f"from {kept['read_back_from']} (delete it to serve again)")
    return kept


def serve_role(role: str, plan: Plan, path: Path, job: ServeJob, key: str, s: Serving,
               hold: Callable[[], None] | None = None) -> dict[str, Any]:
    """``job`` served (and its plan's batch searches, in the same engine), then kept for a resumed verify; with
    ``hold``, a held job (:class:`~advisor.deploy.vllm.ServeJob`'s ``hold``) meters once ``hold()`` returns."""
    if searched_in_serving(s, plan):  # one engine for the serving and the batch search's further rounds
        model = VllmEnergyModel(lambda _plan: path, [], s.base.vocab_size, meter=MeterConfig(**s.base.meter),
                                gpu_label=s.gpu, vllm_version=s.vllm_version, gpus=s.base.tensor_parallel_size,
                                rounds_runner=s.rounds_runner)
        answer = serve_and_search(plan, job, s.summary, model, s.step_up, hold=hold)
    else:
        answer = (s.runner or run_in_child)(job)
    answer["devices"] = list(job.devices)
    try:
        write_serving(s.run_dir, plan.id, key, answer)
    except (OSError, TypeError, ValueError) as exc:  # keeping it only saves a re-serving; the run goes on
        s.status(f"plan {plan.id}: its serving was not kept for a resumed verify ({type(exc).__name__}: {exc})")
    return answer


def serve_plans(plans: Mapping[str, Plan], paths: Mapping[str, Path], s: Serving, workers: int = 1,
                early: Mapping[str, StartedServing] | None = None) -> dict[str, dict[str, Any]]:
    """Role -> what vLLM answered serving that role's plan (read back where a serving of the same job was kept;
    ``early``'s roles from the engines started during the exports, one after another in the plans' order, or afresh
    where one failed)."""
    jobs, keys, served = {}, {}, {}
    for role, plan in plans.items():
        jobs[role], keys[role] = role_job(role, plan, paths[role], s)
        if early and role in early:
            answer = early[role].result()
            if answer is not None:
                served[role] = answer
                continue
        kept = kept_serving(role, plan, keys[role], s)
        if kept is not None:
            served[role] = kept
    todo = [role for role in plans if role not in served]

    def serve_one(role: str, slot: Slot | None) -> dict[str, Any]:
        plan, gpus = plans[role], s.base.tensor_parallel_size
        job = jobs[role] if slot is None else replace(jobs[role], devices=slot.devices)
        job = replace(job, gpu_memory_utilization=engine_memory_share(gpus, first=slot.first if slot else 0))
        s.status(f"serving plan {plan.id} ({shown_role(role, plan.id)}) in vLLM"
                 + (f" on {', '.join(slot.devices)}" if slot else ""))
        return serve_role(role, plan, paths[role], job, keys[role], s)

    # all-BF16 and the recommendation on one unit, one after the other: the decision compares the two, and units of
    # one kind differ by a few percent; every other plan on a slot of its own
    pair = [r for r in todo if {"bf16", "recommendation"} & set(r.split("+"))]
    groups = ([pair] if pair else []) + [[r] for r in todo if r not in pair]
    if workers <= 1 or len(groups) <= 1:
        served.update({role: serve_one(role, None) for role in todo})
    else:
        slots = engine_slots(min(workers, len(groups)), s.base.tensor_parallel_size, serving_gpus.visible_gpus()[0])
        answers = run_on_slots(groups, slots, lambda group, slot: [serve_one(role, slot) for role in group])
        served.update(zip([r for g in groups for r in g], [a for ans in answers for a in ans], strict=True))
    return {role: served[role] for role in plans}


def engine_options(served: dict[str, Any]) -> dict[str, Any]:
    """The ``vllm.LLM`` options a plan was served with beyond its lengths: its ``max_num_seqs`` (vLLM served an FP8
    8B's batches 80-240 6-11% slower in an engine sized 300 than in one sized 240: reports/benchmarks/verify_time.md)
    and the export's options (CUDA-graph sizes, FP8 GEMM backend)."""
    sized = {"max_num_seqs": served["max_num_seqs"]} if served.get("max_num_seqs") else {}
    return {**sized, **(served.get("llm_options") or {})}


def searched_in_serving(s: Serving, plan: Plan) -> bool:
    """Whether ``plan``'s serving runs its operating searches too (in rounds, one engine)."""
    return s.energy and bool(operating_searches(s.summary, plan))
