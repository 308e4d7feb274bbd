"""The `advisor` command. Thin commands: check flags, call the library, print results.

Precedence: command-line flag > recipe file > default. Results go to stdout; logs and
progress to stderr. Known errors print one line (`Error: ...`) and exit 2 (bad input),
3 (missing GPU/package) or 1; `--debug` shows tracebacks.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from advisor.cli.common import DEBUG, err, handle_errors, out
from advisor.errors import InputError

app = typer.Typer(
    help="Find the per-layer BF16/FP8/NVFP4 plan with the fewest joules per token within an accuracy budget.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and debug logs.")] = False,
) -> None:
    DEBUG["on"] = debug
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, stream=sys.stderr)
    if not debug:
        _quiet_libraries()


def _quiet_libraries() -> None:
    """Library chatter (version warnings, per-file progress bars) hides our own progress."""
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*experimental.*")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TQDM_DISABLE", "1")


RecipeOpt = Annotated[Path | None, typer.Option("--recipe", "-r", help="YAML recipe (see recipes/quickstart.yaml).")]
ModelOpt = Annotated[str | None, typer.Option(help="Hub id, local dir, .gguf file, or demo:smollm2-135m.")]
TargetOpt = Annotated[str | None, typer.Option(help="Target GPU: h100, h200 or b200.")]
FormatsOpt = Annotated[str | None, typer.Option(help="Comma-separated formats, e.g. bf16,fp8,nvfp4.")]
OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="Parent folder of run directories.")]
NameOpt = Annotated[str | None, typer.Option(help="Run (and study) name; the run dir is OUT/NAME.")]


def _split(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def _workload_overrides(batch: int | None, inp: int | None, outp: int | None, recipe_path: Path | None) -> Any:
    if batch is None and inp is None and outp is None:
        return None
    from advisor.recipe.schema import load_recipe

    base = load_recipe(recipe_path).workloads[0].model_dump()
    for key, value in (("batch_size", batch), ("input_tokens", inp), ("output_tokens", outp)):
        if value is not None:
            base[key] = value
    return [base]


@app.command()
@handle_errors
def search(
    recipe: RecipeOpt = None,
    model: ModelOpt = None,
    gguf_file: Annotated[str | None, typer.Option(help="GGUF file inside --model (a dir or hub repo).")] = None,
    target: TargetOpt = None,
    formats: FormatsOpt = None,
    trials: Annotated[int | None, typer.Option(help="Total trials in the study, baselines included.")] = None,
    timeout: Annotated[float | None, typer.Option(help="Stop starting trials after this many seconds.")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampler seed.")] = None,
    sampler: Annotated[str | None, typer.Option(help="tpe, nsga2 or random.")] = None,
    max_kl: Annotated[float | None, typer.Option(help="Accuracy budget: mean per-token KL vs BF16 (nats).")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Workload: concurrent sequences (first workload).")] = None,
    input_tokens: Annotated[int | None, typer.Option(help="Workload: prompt tokens (first workload).")] = None,
    output_tokens: Annotated[int | None, typer.Option(help="Workload: generated tokens (first workload).")] = None,
    calibration: Annotated[str | None, typer.Option(help="'self' or a .txt/.jsonl file for calibration.")] = None,
    tasks: Annotated[str | None, typer.Option(help="Comma-separated lm-eval tasks scored on the front.")] = None,
    limit: Annotated[int | None, typer.Option(help="lm-eval items per task (seeded sample).")] = None,
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL (default: sqlite in the run dir).")] = None,
    out_dir: OutOpt = None,
    name: NameOpt = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda (where accuracy is computed).")] = None,
    energy: Annotated[str | None, typer.Option(
        help="measured (NVML on a GPU of the target kind, ~40 s per plan), predicted (profile or roofline), "
        "or auto (measured when such a GPU is here).")] = None,
    energy_profile: Annotated[str | None, typer.Option(help="Profile JSON from `advisor profile`.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the study of the same name.")] = False,
) -> None:
    """Search per-layer formats; write the report, summary.json and the study to OUT/NAME."""
    from advisor.recipe.schema import load_recipe

    overrides = {
        "model.source": model, "model.gguf_file": gguf_file, "target": target, "formats": _split(formats),
        "search.trials": trials, "search.timeout_s": timeout, "search.seed": seed, "search.sampler": sampler,
        "accuracy.max_kl": max_kl, "calibration.source": calibration, "benchmark.tasks": _split(tasks),
        "benchmark.limit": limit, "storage": storage, "out": str(out_dir) if out_dir else None,
        "name": name, "device": device, "energy": energy, "energy_profile": energy_profile,
        "workloads": _workload_overrides(batch_size, input_tokens, output_tokens, recipe),
    }
    rec = load_recipe(recipe, overrides)
    from advisor.workflows.search import run

    summary = run(rec, resume=resume, console=err)
    _print_summary(summary)
    out.print(f"\nreport: {rec.run_dir / 'report.md'}")


def _print_summary(summary: dict) -> None:
    workloads = [w["name"] for w in summary["workloads"]]
    energy_label = "; ".join(summary["labels"]["energy"])
    table = Table(title=f"Pareto front within budget ({len(summary['trials'])} trials); energy: {energy_label}")
    for col in ["trial", "plan id", "plan", "KL", "ppl", *[f"J/token {w}" for w in workloads]]:
        table.add_column(col)
    by_trial = {r["trial"]: r for r in summary["trials"]}
    for t in summary["front_trials"]:
        r = by_trial[t]
        e = {x["workload"]: x["j_per_token"] for x in r["energy"]}
        table.add_row(str(t), r["plan_id"], r["label"], f"{r['kl']:.4f}", f"{r['ppl']:.2f}",
                      *[f"{e[w]:.4g}" for w in workloads])
    out.print(table)
    rec = summary["recommendation"]
    if rec:
        out.print(f"recommended: plan {rec['plan_id']} ({rec['label']}): {rec['reason']}", highlight=False)


def _open_run(run_dir: Path, storage: str | None):
    import optuna

    meta_path = run_dir / "recipe.json"
    if not meta_path.is_file():
        raise InputError(f"{run_dir} is not a run directory (no recipe.json); give the folder `advisor search` wrote")
    data = json.loads(meta_path.read_text())
    url = storage or data.get("storage_url")
    try:
        return optuna.load_study(study_name=data["name"], storage=url)
    except KeyError:
        raise InputError(f"no study named {data['name']!r} in {url}") from None


@app.command()
@handle_errors
def report(
    run_dir: Annotated[Path, typer.Argument(help="Run directory written by `advisor search`.")],
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL, if not the run's own.")] = None,
) -> None:
    """Rebuild report.md, the plots and summary.json from the study storage."""
    from advisor.report.summary import write_report

    study = _open_run(run_dir, storage)
    path = write_report(study, run_dir)
    out.print(str(path))


@app.command()
@handle_errors
def show(
    run_dir: Annotated[Path, typer.Argument(help="Run directory written by `advisor search`.")],
    plan: Annotated[str | None, typer.Option(help="Plan id to print (default: the recommendation).")] = None,
) -> None:
    """Print the recommendation (or one plan) as JSON: per-group formats and its numbers."""
    path = run_dir / "summary.json"
    if not path.is_file():
        raise InputError(f"{path} does not exist; run `advisor report {run_dir}` first")
    try:
        summary = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON ({exc.msg})") from None
    target = plan or (summary.get("recommendation") or {}).get("plan_id")
    record = next((r for r in summary["trials"] if r["plan_id"] == target), None)
    if record is None:
        known = ", ".join(sorted({r["plan_id"] for r in summary["trials"]})[:10])
        raise InputError(f"--plan: no plan {target!r} in {path}; known: {known}")
    out.print_json(json.dumps(record))


from advisor.cli.deploy import export, recheck  # noqa: E402
from advisor.cli.energy import measure as measure_command  # noqa: E402
from advisor.cli.energy import profile as profile_command  # noqa: E402
from advisor.cli.evaluate import eval_plan  # noqa: E402

app.command()(export)
app.command()(recheck)
app.command(name="profile")(handle_errors(profile_command))
app.command(name="measure")(handle_errors(measure_command))
app.command(name="eval")(handle_errors(eval_plan))


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted: finished trials are kept in the study; continue with --resume")
        sys.exit(130)


if __name__ == "__main__":
    main()
