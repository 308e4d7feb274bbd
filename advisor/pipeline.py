"""One `advisor search`: open the study, prepare the model side, run trials, write the report."""

from __future__ import annotations

import json
import math
import time
from importlib import metadata

import optuna
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from . import __version__
from .recipe import Recipe
from .report import write_report
from .study import finished_trials, open_study, run_search, save_run_meta


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


def write_run_file(recipe: Recipe) -> None:
    data = {"name": recipe.name, "storage_url": recipe.storage_url, "recipe": recipe.model_dump(mode="json")}
    (recipe.run_dir / "recipe.json").write_text(json.dumps(data, indent=2))


def run(recipe: Recipe, resume: bool = False, console: Console | None = None) -> dict:
    from .runner import prepare

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

        run_search(study, ctx, recipe, ctx.loaded.shape.groups, callbacks=[on_trial])
    timings = dict(ctx.timings_s)
    if ctx.trial_times_s:
        timings["trials_run"] = len(ctx.trial_times_s)
        timings["mean_trial_s"] = sum(ctx.trial_times_s) / len(ctx.trial_times_s)
    timings["total_s"] = time.perf_counter() - t0
    save_run_meta(study, {"timings": timings})
    write_report(study, recipe.run_dir)
    return json.loads((recipe.run_dir / "summary.json").read_text())
