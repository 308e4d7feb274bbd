"""`advisor search`, top to bottom: open the study, prepare the model side, sensitivity, trials,
lm-eval on the candidates the policy picks, the report."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import optuna
from rich.console import Console

from advisor import __version__
from advisor.deploy.verification import tokenizer_fingerprint
from advisor.energy.meter import EnergyWindow
from advisor.errors import AdvisorError, InputError, Interrupted
from advisor.files import write_text_atomically
from advisor.interrupts import check, deferred, pending, signals_handled, stop_taken
from advisor.recipe.schema import Recipe
from advisor.report.schema import Summary
from advisor.report.summary import write_report
from advisor.search.measured import set_round
from advisor.search.policy import benchmark_targets, best_feasible_line
from advisor.search.storage import default_url, portable_url, redact_url, share_tokens, url_without_password
from advisor.search.study import (
    Proposer,
    check_same_model,
    check_same_scoring,
    enqueue_opening,
    finished_trials,
    open_owned_study,
    run_search,
    save_run_meta,
    study_key,
)
from advisor.search.trial_record import label_of, record_benchmark
from advisor.versions import package_versions
from advisor.workflows.context import RunContext, tokens_key
from advisor.workflows.measured_tier import energy_stage
from advisor.workflows.node import finish_node, rank_failures, report_trials, start_workers, worker_recipe
from advisor.workflows.operating import (
    measured_operating_stage,
    operating_stage,
    record_run_energy,
)
from advisor.workflows.progress import ProgressReporter
from advisor.workflows.run_lock import run_folder_lock
from advisor.workflows.run_settings import energy_tier, priced_engine, resolved
from advisor.workflows.spawn import describe_exit, stop_workers, wait_workers

if TYPE_CHECKING:
    from advisor.models.replicas import Ranks
    from advisor.search.proposals import KnapsackProposer


def run(recipe: Recipe, resume: bool = False, console: Console | None = None,
        resume_command: str = "advisor search ... --resume", workers: int = 1) -> Summary:
    progress = ProgressReporter(console or Console(stderr=True))
    recipe = resolved(recipe)
    if workers > 1 and recipe.storage is None:  # processes of one host share Optuna's journal file
        recipe = recipe.model_copy(update={"storage": default_url(recipe.run_dir, workers)})
    key = study_key(recipe, package_versions(), energy_tier(recipe), priced_engine(recipe))

    def warn(message: str) -> None:
        progress.print(f"warning: {message}")

    with signals_handled():
        try:
            with run_folder_lock(recipe.run_dir, warn):
                with deferred():  # created and claimed as one step; a signal meanwhile is taken just after
                    owned = open_owned_study(recipe, resume, key, warn)
                failed = True
                try:
                    with interrupts_as_errors(owned.study, recipe, resume_command):
                        summary = _run_owned(owned.study, recipe, resume, progress, workers)
                    failed = False
                except Interrupted:
                    failed = False  # the study is kept for the resume the message names
                    raise
                finally:
                    with deferred():  # a second signal cannot leave the study claimed
                        owned.release(discard_if_empty=failed)
        except KeyboardInterrupt:
            stop_taken()
            raise Interrupted("interrupted before the study was opened: nothing was changed; run the same command "
                              "again") from None
    return summary


def _run_owned(study: optuna.Study, recipe: Recipe, resume: bool, progress: ProgressReporter,
               workers: int) -> Summary:
    t0 = time.perf_counter()
    children: list = []
    with stopped_on_exit(children):
        if not resume:
            write_run_file(recipe)
        window = EnergyWindow("search").begin()
        node = start_workers(recipe, workers, children, progress.print, resumed=resume)
        with rank_failures(node, resumed=resume):
            if node:
                node.ranks.broadcast(worker_recipe(recipe))
            ctx = prepare_model_side(recipe, progress, study.user_attrs.get("model", {}).get("fingerprint"),
                                     node.ranks if node else None)
            check_same_model(study.user_attrs.get("model", {}).get("fingerprint"), ctx.fingerprint, recipe.name)
            check_same_scoring(study.user_attrs.get("device"), ctx.scoring_place, recipe.name, "--resume")
            save_run_meta(study, run_meta(recipe, ctx))
            share_tokens(study, recipe.run_dir / "tokens.pt", tokens_key(recipe, ctx.fingerprint),
                         recipe.run_dir / "artifacts")
            measuring = ctx.measured_model is not None
            if measuring:
                set_round(study, "pending")  # workers that finish their trials wait for the measurement queue
            proposer = sensitivity_stage(study, ctx, recipe, progress) if recipe.search.sampler == "guided" else None
            if node:  # the workers start their trials once the node closes: the baselines and proposals first
                enqueue_opening(study, recipe, ctx.loaded.shape.groups, proposer)
                finish_node(node, ctx.timings_s, progress.print)
        with timed(ctx, "trials_s"):
            trials_stage(study, ctx, recipe, progress, proposer)
        if node:
            report_trials(study, node, ctx.timings_s, progress.print)
        codes = [p.poll() for p in children] if measuring else wait_workers(children)  # None: still running
        check_workers(study, recipe, children, codes, progress)
        check_some_trial_finished(study, recipe)
        from advisor.workflows.memory import lift_gpu_memory_cap

        lift_gpu_memory_cap(recipe.gpu_memory_gib)
        with timed(ctx, "operating_s"):  # predicted only; first, so the measured tier can search them as it meters
            operating_stage(study, ctx, recipe, progress)
        with timed(ctx, "measured_s"):
            energy_stage(study, ctx, recipe, progress)
            if measuring:
                check_workers_after_measuring(recipe, children, codes, wait_workers(children), progress)
        with timed(ctx, "benchmark_s"):
            bench_status = benchmark_stage(study, ctx, recipe, progress)
        with timed(ctx, "measured_operating_s"):
            measured_operating_stage(study, ctx, recipe, progress)
    record_run_energy(study, window)
    save_run_meta(study, {"timings": timings(ctx, recipe, t0), "benchmark_status": bench_status})
    with progress.stage("report"):
        write_report(study, recipe.run_dir)
    return build_summary_from(recipe.run_dir)


def check_workers(study: optuna.Study, recipe: Recipe, children: list, codes: list[int | None],
                  progress: ProgressReporter) -> None:
    """One warning line per worker that died (None: stopped once the budget was used, not a death); the
    others finished the budget, its trial was retried. Only when trials were lost for good (a retried
    trial that failed again) is the run an error naming them."""
    dead = [f"worker-{i + 1} (pid {p.pid}) {describe_exit(code)} (log: {recipe.run_dir / 'workers'}/worker-{i + 1}.log)"
            for i, (p, code) in enumerate(zip(children, codes, strict=True)) if code not in (0, None)]
    for line in dead:
        progress.print(f"warning: {line}; the others finished the trial budget")
    if dead and finished_trials(study) < recipe.search.trials and recipe.search.timeout_s is None:
        raise AdvisorError(f"{finished_trials(study)} of {recipe.search.trials} trials finished: "
                           + "; ".join(dead) + f"; continue with `advisor search ... --name {recipe.name} --resume`")


def check_workers_after_measuring(recipe: Recipe, children: list, before: list[int | None],
                                  after: list[int | None], progress: ProgressReporter) -> None:
    """One warning line per worker that died during the measured tier (a killed worker's plan was measured by
    another; one whose measurement raised is named by the measured tier)."""
    for i, (p, was, code) in enumerate(zip(children, before, after, strict=True)):
        if was is None and code not in (0, None):
            progress.print(f"warning: worker-{i + 1} (pid {p.pid}) {describe_exit(code)} during the measured tier "
                           f"(log: {recipe.run_dir / 'workers'}/worker-{i + 1}.log)")


def check_some_trial_finished(study: optuna.Study, recipe: Recipe) -> None:
    """A search that ends with no finished trial has nothing to report: an error, never an empty success."""
    if finished_trials(study):
        return
    if recipe.search.timeout_s is not None:
        raise InputError(f"--timeout {recipe.search.timeout_s:g} s ended the search before any trial finished; "
                         "give a longer --timeout (or none)")
    raise AdvisorError("no trial finished (each one failed: see the messages above); nothing to report")


@contextmanager
def stopped_on_exit(children: list[subprocess.Popen]) -> Iterator[None]:
    """Worker children never outlive a coordinator that fails or is interrupted."""
    try:
        yield
    except BaseException:
        with deferred():  # a second signal cannot leave them running
            stop_workers(children)
        raise


@contextmanager
def interrupts_as_errors(study: optuna.Study, recipe: Recipe, resume_command: str) -> Iterator[None]:
    """Ctrl-C or SIGTERM (alike: ``advisor.interrupts``) ends the trial in flight as failed, queued again for
    the resume, and becomes one line with the command that continues the study."""
    try:
        check()  # a signal noted while the study was being opened
        yield
        check()  # at the latest: a signal whose raise Python swallowed (in a finalizer) is not lost
    except Exception:
        if not pending():
            raise
        # the interrupt, surfaced by a library as an error of its own: an import cut off in its C initialisation
        # ("ImportError: initialization failed", the report stage's plotting), a callback's RuntimeError
        _stop(study, recipe, resume_command)
    except KeyboardInterrupt:
        _stop(study, recipe, resume_command)


def _stop(study: optuna.Study, recipe: Recipe, resume_command: str) -> NoReturn:
    with deferred():
        done = finished_trials(study)
    stop_taken()
    raise Interrupted(f"interrupted: {done} finished trials are kept in {redact_url(recipe.storage_url)}; "
                      f"continue with: {resume_command}") from None


def write_run_file(recipe: Recipe) -> None:
    """recipe.json: how `report`, `export` and `recheck` find the study again (no secrets)."""
    recipe_data = recipe.model_dump(mode="json")
    if recipe_data.get("storage"):
        recipe_data["storage"] = url_without_password(recipe_data["storage"])
    data = {"name": recipe.name, "storage_url": portable_url(recipe.storage_url, recipe.run_dir), "recipe": recipe_data}
    write_text_atomically(recipe.run_dir / "recipe.json", json.dumps(data, indent=2))


def prepare_model_side(recipe: Recipe, progress: ProgressReporter, stored_fingerprint: str | None = None,
                       ranks: Ranks | None = None) -> RunContext:
    from advisor.workflows.context import prepare

    with progress.stage("prepare") as stage:
        def status(msg: str) -> None:
            stage.advance(note=msg)
            progress.step(f"  {msg}")

        return prepare(recipe, status=status, stored_fingerprint=stored_fingerprint, ranks=ranks)


def run_meta(recipe: Recipe, ctx: RunContext) -> dict[str, Any]:
    recipe_data = recipe.model_dump(mode="json")
    if recipe_data.get("storage"):
        recipe_data["storage"] = url_without_password(recipe_data["storage"])
    return {
        "version": __version__,
        "storage": redact_url(recipe.storage_url),
        "recipe": recipe_data,
        "shape": ctx.loaded.shape.to_dict(),
        "device": ctx.scoring_place,
        "model": {"name": ctx.loaded.name, "fingerprint": ctx.fingerprint,
                  "tokenizer": tokenizer_fingerprint(ctx.loaded.tokenizer)},
        "versions": package_versions(),
        "accuracy_label": f"measured (proxy on {ctx.tokens.heldout.numel()} held-out tokens, "
                          f"{ctx.tokens.source}, on {ctx.scoring_place})",
    }


def sensitivity_stage(study: optuna.Study, ctx: RunContext, recipe: Recipe,
                      progress: ProgressReporter) -> KnapsackProposer:
    """Per-group damage and energy, then the knapsack proposer built from them."""
    from advisor.search.proposals import KnapsackProposer

    with progress.stage("sensitivity") as stage:
        sens = ctx.sensitivity(on_step=lambda done, total: stage.advance(done, total))
    ctx.timings_s["sensitivity_s"] = sens.time_s
    save_run_meta(study, {"sensitivity": {
        "time_s": sens.time_s, "tokens": sens.tokens,
        "most_sensitive": [{"group": g, "format": f.value, "kl": v} for g, f, v in sens.most_sensitive(10)],
    }})
    return KnapsackProposer(ctx.loaded.shape.groups, recipe.formats, sens, recipe.accuracy.max_kl, recipe.kv_cache)


def trials_stage(study: optuna.Study, ctx: RunContext, recipe: Recipe, progress: ProgressReporter,
                 proposer: Proposer | None) -> None:
    primary = recipe.workloads[0].name
    total = recipe.search.trials
    with progress.stage("trials", total=total) as stage:
        stage.advance(min(finished_trials(study), total))

        def on_trial(st: optuna.Study, t: optuna.trial.FrozenTrial) -> None:
            best = best_feasible_line(st, primary)
            stage.advance(finished_trials(st), note=best)
            if not progress.terminal and t.values:  # logs and CI: one line per trial
                progress.print(f"trial {t.number}: {label_of(t)} KL {t.values[0]:.4f}, "
                               f"{t.values[1]:.4g} J/token; {best}")

        run_search(study, ctx, recipe, ctx.loaded.shape.groups, callbacks=[on_trial], proposer=proposer,
                   worker=ctx.worker())


def benchmark_stage(study: optuna.Study, ctx: RunContext, recipe: Recipe, progress: ProgressReporter) -> str | None:
    """Multi-fidelity: lm-eval judges BF16's rivals against it item by item (search.policy):
    the other baselines, then the candidates by rising energy until one passes. Items come
    in nested, doubling batches, more only while a task is undecided; all cached per plan."""
    spec = recipe.benchmark
    if not spec.tasks:
        return None
    if spec.data_dir and not Path(spec.data_dir).is_dir():
        msg = f"not run: benchmark.data_dir {spec.data_dir} does not exist; the proxy decided"
        progress.print(f"warning: lm-eval {msg}")
        return msg
    from advisor.accuracy.harness import task_sizes, validate_tasks
    from advisor.search.acceptance import Verdict, describe
    from advisor.workflows.benchmark_items import PairedScorer

    queue = benchmark_targets(study, [w.name for w in recipe.workloads], spec.max_candidates)
    if queue is None:
        return "not run: no all-BF16 trial finished, so there is no reference to compare with"
    validate_tasks(spec.tasks, spec.data_dir)
    n_docs = task_sizes(spec.tasks, spec.data_dir)
    n_available = {t: min(n, spec.limit or n) for t, n in n_docs.items()}
    scorer = PairedScorer(ctx.assemble, ctx.loaded.tokenizer, ctx.fingerprint, queue.reference, spec.tasks, n_docs,
                          spec.seed, spec.data_dir, recipe.run_dir / "lm_eval_cache")
    candidate_ids = {p.id for p in queue.candidates}
    plans = [p for p in queue.baselines if p.id not in candidate_ids] + queue.candidates  # then by energy
    judged, passed = 0, None
    design = (f"first batch {spec.first_batch}, doubling to {spec.limit or 'the full sets'}; "
              f"{spec.confidence:.0%} intervals over all looks")
    with progress.stage(f"lm-eval ({', '.join(n_docs)}; {design})", total=len(plans)) as stage:
        for i, plan in enumerate(plans):
            if passed is not None and plan.id in candidate_ids:
                continue  # a cheaper candidate already passed
            stage.advance(i, note=plan.label())
            result = scorer.judge(plan, n_available, spec.first_batch, spec.max_drop, spec.confidence,
                                  on_look=lambda task, t, p=plan, done=i: stage.advance(
                                      done, note=f"{p.label()}: {task} {t.verdict.value} at {t.n_items} items"))
            record_benchmark(study, plan.id, scorer.scores_of(plan), result.to_dict())
            judged += 1
            progress.print(f"lm-eval: {plan.label()} {describe(result)} "
                           f"({', '.join(f'{t.task} {t.n_items}/{t.n_available}' for t in result.tasks)} items)")
            if result.verdict is Verdict.PASSES and plan.id in candidate_ids:
                passed = plan
        record_benchmark(study, queue.reference.id, scorer.scores_of(queue.reference))
        stage.advance(len(plans))
    outcome = f"the lowest-energy passing candidate is {passed.label()}" if passed else (
        "no candidate passed" if queue.candidates else "no candidate within the proxy budget")
    return (f"measured: {judged} plans judged against BF16 on {', '.join(n_docs)} ({design}; "
            f"{scorer.items_used} items used, BF16's included) on {ctx.scoring_place}; {outcome}")


@contextmanager
def timed(ctx: RunContext, key: str) -> Iterator[None]:
    """The seconds of one stage into the run's timings (summary.json's ``timings_s``)."""
    check()  # between stages: a signal whose raise was swallowed is taken here
    t = time.perf_counter()
    try:
        yield
    finally:
        ctx.timings_s[key] = time.perf_counter() - t


def timings(ctx: RunContext, recipe: Recipe, t0: float) -> dict[str, Any]:
    out = dict(ctx.timings_s)
    if not recipe.benchmark.tasks:
        out.pop("benchmark_s", None)
    if ctx.trial_times_s:
        out["trials_run"] = len(ctx.trial_times_s)
        out["mean_trial_s"] = sum(ctx.trial_times_s) / len(ctx.trial_times_s)
    out["total_s"] = time.perf_counter() - t0
    if ctx.device == "cuda":
        out.update(gpu_memory_peaks())
    return out


def gpu_memory_peaks() -> dict[str, list[float]]:
    """This process's peak GiB per GPU, as torch's allocator saw them: allocated by tensors, and reserved (cached
    too); NVML's figure adds the CUDA context. Beside the memory plan's bytes, they show which of its terms missed."""
    import torch

    count = torch.cuda.device_count()
    return {"peak_gpu_allocated_gib": [round(torch.cuda.max_memory_allocated(i) / 2**30, 2) for i in range(count)],
            "peak_gpu_reserved_gib": [round(torch.cuda.max_memory_reserved(i) / 2**30, 2) for i in range(count)]}


def build_summary_from(run_dir: Path) -> Summary:
    from advisor.report.schema import load_summary

    return load_summary(run_dir / "summary.json")
