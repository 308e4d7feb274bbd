"""One `advisor search`: open the study, prepare the model side, run trials, write the report."""

from __future__ import annotations

import json
import math
import time
from importlib import metadata
from pathlib import Path

import optuna
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from advisor import __version__
from advisor.plan import Plan
from advisor.recipe.schema import Recipe
from advisor.report.summary import write_report
from advisor.search.frontier import pareto_front
from advisor.search.study import candidates, finished_trials, open_study, record_benchmark, run_search, save_run_meta


def package_versions() -> dict[str, str]:
    out = {}
    for pkg in ("torch", "transformers", "nvidia-modelopt", "optuna", "lm_eval", "nvidia-ml-py"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _best_feasible(study: optuna.Study) -> str:
    best = None
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        feasible = all(v <= 0 for v in t.user_attrs.get("constraint", [math.inf]))
        if feasible and (best is None or t.values[1] < best.values[1]):
            best = t
    if best is None:
        return "no plan within budget yet"
    return f"best within budget: {best.user_attrs['label']} KL {best.values[0]:.4f}, {best.values[1]:.4g} J/token"


def benchmark_targets(study: optuna.Study, recipe: Recipe) -> list[Plan]:
    """Baselines first, then the feasible front by rising energy, at most max_candidates of them."""
    cands = candidates(study)
    baselines = [c.plan for c in cands if c.plan.uniform_format() is not None]
    front = [c.plan for c in pareto_front(cands, recipe.workloads[0].name)]
    chosen: dict[str, Plan] = {p.id: p for p in baselines}
    for plan in front:
        if len(chosen) >= len(baselines) + recipe.benchmark.max_candidates:
            break
        chosen.setdefault(plan.id, plan)
    return list(chosen.values())


def run_benchmarks(study: optuna.Study, ctx, recipe: Recipe, console: Console) -> str | None:
    """Multi-fidelity: lm-eval scores for the baselines and the front candidates (cached)."""
    spec = recipe.benchmark
    if not spec.tasks:
        return None
    if spec.data_dir and not Path(spec.data_dir).is_dir():
        msg = f"not run: benchmark.data_dir {spec.data_dir} does not exist; the proxy decided"
        console.print(f"[yellow]warning:[/] lm-eval {msg}")
        return msg
    from advisor.accuracy.harness import score_plan

    plans = benchmark_targets(study, recipe)
    limit = "full sets" if spec.limit is None else f"limit {spec.limit}, seed {spec.seed}"
    for i, plan in enumerate(plans, 1):
        console.print(f"lm-eval {i}/{len(plans)}: {plan.label()} ({', '.join(spec.tasks)}; {limit})", highlight=False)
        scores = score_plan(
            ctx.assemble(plan), ctx.loaded.tokenizer, plan.id, ctx.fingerprint, spec.tasks,
            limit=spec.limit, seed=spec.seed, data_dir=spec.data_dir, cache_dir=recipe.run_dir / "lm_eval_cache",
        )
        record_benchmark(study, plan.id, {t: s.to_dict() for t, s in scores.items()})
    return f"measured: {len(plans)} plans on {', '.join(spec.tasks)} ({limit}) on {ctx.device}"


def write_run_file(recipe: Recipe) -> None:
    data = {"name": recipe.name, "storage_url": recipe.storage_url, "recipe": recipe.model_dump(mode="json")}
    (recipe.run_dir / "recipe.json").write_text(json.dumps(data, indent=2))


def run(recipe: Recipe, resume: bool = False, console: Console | None = None) -> dict:
    from advisor.workflows.context import prepare

    console = console or Console(stderr=True)
    recipe.run_dir.mkdir(parents=True, exist_ok=True)
    study = open_study(recipe, resume)
    write_run_file(recipe)
    t0 = time.perf_counter()
    def say(msg: str) -> None:
        status.update(msg)
        if not console.is_terminal:
            console.print(msg, highlight=False)

    with console.status("preparing") as status:
        ctx = prepare(recipe, status=say)
    save_run_meta(study, {
        "version": __version__,
        "recipe": recipe.model_dump(mode="json"),
        "shape": ctx.loaded.shape.to_dict(),
        "model": {"name": ctx.loaded.name, "fingerprint": ctx.fingerprint},
        "versions": package_versions(),
        "accuracy_label": f"measured (proxy on {ctx.tokens.heldout.numel()} held-out tokens, "
                          f"{ctx.tokens.source}, on {ctx.device})",
    })
    proposer = None
    if recipe.search.sampler == "guided":
        from advisor.workflows.context import KnapsackProposer

        with Progress(TextColumn("[bold]sensitivity"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as progress:
            task = progress.add_task("", total=None)
            sens = ctx.sensitivity(on_step=lambda done, total: progress.update(task, completed=done, total=total))
        ctx.timings_s["sensitivity_s"] = sens.time_s
        save_run_meta(study, {"sensitivity": {
            "time_s": sens.time_s, "tokens": sens.tokens,
            "most_sensitive": [{"group": g, "format": f.value, "kl": v} for g, f, v in sens.most_sensitive(10)],
        }})
        proposer = KnapsackProposer(ctx.loaded.shape.groups, recipe.formats, sens, recipe.accuracy.max_kl)
    total = recipe.search.trials
    with Progress(
        TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.description}"), console=console,
    ) as progress:
        task = progress.add_task("", total=total, completed=min(finished_trials(study), total))

        def on_trial(st: optuna.Study, t: optuna.trial.FrozenTrial) -> None:
            progress.update(task, completed=finished_trials(st), description=_best_feasible(st))
            if not console.is_terminal and t.values:  # logs and CI: one line per trial
                console.print(f"trial {t.number}: {t.user_attrs.get('label')} KL {t.values[0]:.4f}, "
                              f"{t.values[1]:.4g} J/token; {_best_feasible(st)}", highlight=False)

        run_search(study, ctx, recipe, ctx.loaded.shape.groups, callbacks=[on_trial], proposer=proposer)
    t_bench = time.perf_counter()
    bench_status = run_benchmarks(study, ctx, recipe, console)
    timings = dict(ctx.timings_s)
    if recipe.benchmark.tasks:
        timings["benchmark_s"] = time.perf_counter() - t_bench
    if ctx.trial_times_s:
        timings["trials_run"] = len(ctx.trial_times_s)
        timings["mean_trial_s"] = sum(ctx.trial_times_s) / len(ctx.trial_times_s)
    timings["total_s"] = time.perf_counter() - t0
    save_run_meta(study, {"timings": timings, "benchmark_status": bench_status})
    write_report(study, recipe.run_dir)
    return json.loads((recipe.run_dir / "summary.json").read_text())
