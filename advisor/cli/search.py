"""`advisor search`: flags over the recipe, then the search workflow; the front table on stdout."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from advisor.cli.common import err, handle_errors, out
from advisor.engines import ENGINE_TABLE, listed
from advisor.errors import InputError
from advisor.recipe.choices import choices_text
from advisor.recipe.schema import Recipe, SearchSpec

#: `--engine`: which engines serve each measured plan's export, and what a user must know of each (the table's)
SERVED_ENGINES = listed([e.name for e in ENGINE_TABLE.values() if e.serves_checkpoint], last="and")
ENGINE_NOTES = "; ".join(f"{e.title}: {e.note}" for e in ENGINE_TABLE.values() if e.serves_checkpoint and e.note)

RecipeOpt = Annotated[Path | None, typer.Option("--recipe", "-r", help="YAML recipe (see recipes/quickstart.yaml).")]
ModelOpt = Annotated[str | None, typer.Option(help="Hub id, local dir, .gguf file, or demo:smollm2-135m.")]
TargetOpt = Annotated[str | None, typer.Option(help=f"Target GPU: {choices_text(Recipe, 'target')}.")]
FormatsOpt = Annotated[str | None, typer.Option(help="Comma-separated formats, e.g. bf16,fp8,nvfp4.")]
OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="Parent folder of run directories.")]
NameOpt = Annotated[str | None, typer.Option(help="Run (and study) name; the run dir is OUT/NAME.")]


def _split(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def _workload_overrides(batch: int | None, inp: int | None, outp: int | None, flags: list[str] | None,
                        recipe_path: Path | None) -> Any:
    if batch is None and inp is None and outp is None and not flags:
        return None
    from advisor.recipe.schema import load_recipe
    from advisor.recipe.workload_flags import edit_workloads

    current = [w.model_dump() for w in load_recipe(recipe_path).workloads]
    primary = {"batch_size": batch, "input_tokens": inp, "output_tokens": outp}
    return edit_workloads(current, primary, flags or [])


@handle_errors
def search(
    recipe: RecipeOpt = None,
    model: ModelOpt = None,
    gguf_file: Annotated[str | None, typer.Option(help="GGUF file inside --model (a dir or hub repo).")] = None,
    target: TargetOpt = None,
    formats: FormatsOpt = None,
    kv_cache: Annotated[str | None, typer.Option(
        help="Comma-separated KV-cache formats to search: bf16 (default) or bf16,fp8.")] = None,
    trials: Annotated[int | None, typer.Option(help="Total trials in the study, baselines included.")] = None,
    timeout: Annotated[float | None, typer.Option(help="Stop starting trials after this many seconds.")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampler seed.")] = None,
    sampler: Annotated[str | None, typer.Option(
        help=f"{choices_text(SearchSpec, 'sampler')}; guided: sensitivity-guided knapsack proposals, then TPE.")]
        = None,
    max_kl: Annotated[float | None, typer.Option(help="Accuracy budget: mean per-token KL vs BF16 (nats).")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Concurrent sequences of the first workload.")] = None,
    input_tokens: Annotated[int | None, typer.Option(help="Prompt tokens of the first workload.")] = None,
    output_tokens: Annotated[int | None, typer.Option(help="Generated tokens of the first workload.")] = None,
    workload: Annotated[list[str] | None, typer.Option(
        help="Edit or add a workload: NAME:batch=B,input=L,output=L (repeatable); the others are kept. A latency "
             "objective: NAME:tpot=MS,ttft=MS,p=p50|p90,max_concurrency=N.")] = None,
    calibration: Annotated[str | None, typer.Option(help="'self', a .txt/.jsonl file or set:NAME.")] = None,
    tasks: Annotated[str | None, typer.Option(help="Comma-separated lm-eval tasks scored on the front.")] = None,
    limit: Annotated[int | None, typer.Option(help="lm-eval items per task (seeded sample).")] = None,
    storage: Annotated[str | None, typer.Option(
        envvar="ADVISOR_STORAGE", show_envvar=True,
        help="Optuna storage: sqlite:///PATH, journal:PATH (processes of one host) or postgresql://USER@HOST/DB "
             "(hosts; password from PGPASSWORD/~/.pgpass or in this variable). Default: RUN_DIR/study.db, "
             "or RUN_DIR/study.journal with --workers.")] = None,
    workers: Annotated[int, typer.Option(
        min=1, help="Worker processes on this host sharing the study's trials and measured plans (one GPU each "
                    "when there are enough); more can join from other hosts with `advisor worker`.")] = 1,
    out_dir: OutOpt = None,
    name: NameOpt = None,
    device: Annotated[str | None, typer.Option(
        help=f"Where accuracy is computed: {choices_text(Recipe, 'device')}.")] = None,
    energy: Annotated[str | None, typer.Option(
        help=f"{choices_text(Recipe, 'energy')}. measured: NVML on a GPU of the target kind (~40 s per plan); "
        "predicted: the target's profile, else the datasheet roofline; auto: measured when such a GPU is here.")]
        = None,
    energy_profile: Annotated[str | None, typer.Option(help="Profile JSON from `advisor profile`.")] = None,
    engine: Annotated[str | None, typer.Option(
        help=f"What the measured tier runs: {choices_text(Recipe, 'engine')}. {SERVED_ENGINES} serve each measured "
        f"plan's exported checkpoint through that engine ({ENGINE_NOTES}).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the study of the same name.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the memory plan (from the model's config, no "
                                          "weights read) and stop; exit 3 when it does not fit.")] = False,
    gpus: Annotated[int | None, typer.Option(min=1, help="GPUs of one node the model spreads over. With --dry-run: "
                                             "plan for a node of this many GPUs...; with --engine vllm: serve each "
                                             "measured plan over this many GPUs here (tensor parallelism; default: "
                                             "the fewest that hold it).")] = None,
    gpu_memory: Annotated[float | None, typer.Option(min=1, help="...of this much memory each, GiB (H100: 80). "
                                                     "Without --gpus: cap each GPU here at this much; layers beyond "
                                                     "it stream from CPU memory.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="With --dry-run: the plan as JSON.")] = False,
) -> None:
    """Search per-layer formats; write the report, summary.json and the study to OUT/NAME."""
    from advisor.recipe.schema import load_recipe

    overrides = {
        "model.source": model, "model.gguf_file": gguf_file, "target": target, "formats": _split(formats),
        "kv_cache": _split(kv_cache), "search.trials": trials, "search.timeout_s": timeout, "search.seed": seed,
        "search.sampler": sampler,
        "accuracy.max_kl": max_kl, "calibration.source": calibration, "benchmark.tasks": _split(tasks),
        "benchmark.limit": limit, "storage": storage, "out": str(out_dir) if out_dir else None,
        "name": name, "device": device, "energy": energy, "energy_profile": energy_profile,
        "engine": engine, "gpu_memory_gib": None if dry_run else gpu_memory, "gpus": None if dry_run else gpus,
        "workloads": _workload_overrides(batch_size, input_tokens, output_tokens, workload, recipe),
    }
    rec = load_recipe(recipe, overrides)
    from advisor.recipe.workload_flags import describe

    if dry_run or json_out:  # the plan is for the GPUs named, whatever the recipe's device (judged all the same)
        _dry_run(rec.model_copy(update={"device": "auto"}), dry_run, gpus, gpu_memory, json_out)
        return
    err.print(f"workloads: {describe(rec.workloads)}", highlight=False, markup=False)
    err.print(f"target: {rec.target.value} (--target h100|h200|b200); energy: {rec.energy} "
              "(--energy auto measures on a GPU of the target kind, else predicts; the source is named below)",
              highlight=False, markup=False)
    if workers > 1 and (rec.gpus or 1) > 1:
        raise InputError(f"--workers {workers} with gpus {rec.gpus}: each worker gets one GPU of this node, and an "
                         f"engine spread over {rec.gpus} GPUs needs all of them; run one worker (the engine's GPUs "
                         "are the parallelism), or --gpus 1 with --workers")
    from advisor.workflows.preflight import preflight

    preflight(rec)  # judge what can be judged before the study is created
    from advisor.workflows.search import run

    summary = run(rec, resume=resume, console=err, resume_command=_resume_command(), workers=workers)
    _print_summary(summary.model_dump(mode="json"))
    out.print(f"\nreport: {rec.run_dir / 'report.md'}")


def _dry_run(rec: Recipe, dry_run: bool, gpus: int | None, gpu_memory: float | None, json_out: bool) -> None:
    from advisor.cli.plan_view import print_plan
    from advisor.errors import SetupError
    from advisor.search.storage import check_storage_url
    from advisor.workflows.memory import devices_here, named_node, not_fitting_message, recipe_plan
    from advisor.workflows.preflight import check_benchmark, check_input_files, check_model

    if not dry_run:
        raise InputError("--json belongs to --dry-run; add --dry-run or drop it")
    node = named_node(gpus, gpu_memory) if gpus is not None else None
    check_storage_url(rec.storage_url, folder_must_exist=False)  # as a run judges them, where nothing is created
    check_input_files(rec)
    check_model(rec, need_weights=False)  # a plan needs no weights downloaded yet
    check_benchmark(rec.benchmark)
    devices = node or devices_here(gpu_memory)
    if not devices:
        raise SetupError("torch sees no GPU here to plan for; name the node: --gpus N --gpu-memory GB")
    plan = recipe_plan(rec, devices)
    print_plan(plan, json_out)
    if not plan.runs:
        raise SetupError(not_fitting_message(plan))


def _resume_command() -> str:
    """This command line with --resume: what continues an interrupted study."""
    import shlex
    import sys

    args = [a for a in sys.argv[1:] if a != "--resume"]
    return shlex.join(["advisor", *args, "--resume"])


def _print_summary(summary: dict) -> None:
    from advisor.report.decision import decision_lines
    from advisor.report.markdown import energy_tier, near_ties_line
    from advisor.report.operating_md import operating_lines

    workloads = [w["name"] for w in summary["workloads"]]
    energy_label = "; ".join(summary["labels"]["energy"])
    table = Table(title=f"Pareto front within budget ({len(summary['trials'])} trials); energy: {energy_label}")
    for col in ["trial", "plan id", "plan", "KL", "ppl", *[f"J/token {w}" for w in workloads], "energy"]:
        table.add_column(col)
    by_trial = {r["trial"]: r for r in summary["trials"]}
    for t in summary["front_trials"]:
        r = by_trial[t]
        e = {x["workload"]: x["j_per_token"] for x in r["energy"]}
        table.add_row(str(t), r["plan_id"], r["label"], f"{r['kl']:.4f}", f"{r['ppl']:.2f}",
                      *[f"{e[w]:.4g}" for w in workloads], energy_tier(r))
    out.print(table)
    rec = summary["recommendation"]
    if rec:
        out.print(f"recommended: plan {rec['plan_id']} ({rec['label']}): {rec['reason']}", highlight=False)
        out.print(decision_lines(summary)[0].replace("**", ""), highlight=False, markup=False)
        ties = near_ties_line(summary)
        if ties:
            out.print(f"note: {ties}", highlight=False, markup=False)
    for line in operating_lines(summary):
        out.print(line, highlight=False, markup=False)


