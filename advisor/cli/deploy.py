"""The `advisor export` and `advisor recheck` commands (registered in cli.py).

Thin commands: check flags, call :mod:`advisor.deploy.checkpoint` / :mod:`advisor.deploy.verification`, print
results to stdout. ``export`` maps errors like every other command (exit 2 bad input,
3 setup, 1 other). ``recheck`` is a CI gate with its own contract: 0 pass,
1 regression, 3 the machine lacks a GPU or a package, 2 any other error (an error must never
read as a regression or a pass).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from advisor.cli.common import err, handle_errors, out
from advisor.engines import engine as engine_entry
from advisor.engines import engine_names, engines_that, listed

SPREADING = listed(engines_that(lambda e: e.tensor_parallel), "--engine ")  # the engines `--gpus` serves over

RECHECK_ERROR_EXIT = 2


@handle_errors
def export(
    run_dir: Annotated[Path, typer.Argument(help="Run directory written by `advisor search`.")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="New folder for the checkpoint.")],
    plan: Annotated[str | None, typer.Option(help="Plan id to export (default: the recommendation).")] = None,
    model: Annotated[str | None, typer.Option(help="Model source, if not the run's (e.g. moved files).")] = None,
    smoke_test: Annotated[bool, typer.Option(help="Load with tensorrt_llm.LLM when installed.")] = True,
) -> None:
    """Write a plan as a ModelOpt unified HF checkpoint + tokenizer + TensorRT-LLM options; check the round trip."""
    from advisor.workflows.export import export_run

    with err.status("exporting") as status:
        result = export_run(run_dir, out_dir, plan_id=plan, model=model, smoke=smoke_test,
                            status=lambda msg: status.update(msg))
    rt = result.roundtrip
    out.print(f"exported plan {result.plan_id} ({result.plan_label}) to {result.out_dir}", highlight=False)
    out.print(f"quant_algo: {result.quant_algo or 'none (BF16)'}; files: {', '.join(result.files)}", highlight=False)
    out.print(f"round trip: KL in memory {rt['kl_in_memory']:.6f}, reloaded {rt['kl_reloaded']:.6f}, "
              f"|diff| {rt['kl_abs_diff']:.2e} <= {rt['tolerance_kl']:.2e}: passed", highlight=False)
    out.print(f"TensorRT-LLM smoke test: {result.smoke_test}", highlight=False)
    out.print("engines: " + "; ".join(f"{e} {v['verdict']}" for e, v in result.engines.items())
              + " (README.md: why, with sources)", highlight=False)
    out.print(f"serve: trtllm-serve {result.out_dir} --extra_llm_api_options "
              f"{Path(result.out_dir) / 'llm_api_options.yaml'}", highlight=False)
    for w in result.warnings:
        err.print(f"[yellow]warning:[/] {w}", markup=True, highlight=False)


@handle_errors(error_exit=RECHECK_ERROR_EXIT, catch_all=True, keep_setup_exit=True)
def recheck(
    recommendation: Annotated[Path, typer.Option("--recommendation", help="summary.json of the run (or its folder).")],
    model: Annotated[str, typer.Option(help="The new model version: hub id, local dir or .gguf file.")],
    recipe: Annotated[Path | None, typer.Option("--recipe", "-r", help="Recipe instead of the stored one.")] = None,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Folder for recheck.md and recheck.json.")] = Path(
        "recheck"),
    research: Annotated[bool, typer.Option("--research", help="Also run a short search around the old plan.")] = False,
    research_trials: Annotated[int, typer.Option(min=1, help="Trials of --research.")] = 12,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda (default: the recipe's).")] = None,
    engine: Annotated[str | None, typer.Option(help="Meter the plan and BF16 on the GPU here through this engine "
                                               f"({listed(engine_names())}) instead of pricing them from the "
                                               "predicted tier.")] = None,
    gpus: Annotated[int | None, typer.Option(min=1, help=f"With {SPREADING}: GPUs of this node the plans are served "
                                             "over (tensor parallelism; default: the fewest that hold them).")] = None,
) -> None:
    """Re-score the stored recommendation and BF16 on a new model; exit 0 pass, 1 regression, 2 error, 3 no GPU
    or package."""
    from advisor.workflows.recheck import run_recheck

    if device is not None and device not in ("auto", "cpu", "cuda"):
        from advisor.errors import InputError

        raise InputError(f"--device: got {device!r}; allowed: auto, cpu, cuda")
    chosen = engine_entry(engine) if engine is not None else None
    if gpus is not None and (chosen is None or not chosen.tensor_parallel):
        from advisor.errors import InputError

        first = engines_that(lambda e: e.tensor_parallel)[0]
        raise InputError(f"--gpus {gpus} serves over several GPUs, which only {SPREADING} does; add --engine {first} "
                         "or drop --gpus")
    if chosen is not None and chosen.package is not None:
        err.print(f"engine: {chosen.title}: {chosen.note}", highlight=False, markup=False)
    with err.status("re-checking") as status:
        def step(message: str) -> None:  # a line each too: a CI job's log keeps them
            status.update(message)
            err.print(message, highlight=False, markup=False, soft_wrap=True)

        result = run_recheck(recommendation, model, out_dir, recipe_path=recipe, research=research,
                             research_trials=research_trials, device=device, engine=engine, status=step, gpus=gpus)
    for c in result.checks:
        out.print(f"{'ok  ' if c.ok else 'FAIL'} {c.name}: {c.value:.4g} (threshold {c.threshold:.4g})",
                  highlight=False)
    if result.research and "plan_id" in result.research:
        rs = result.research
        out.print(f"re-search: best {rs['plan_id']} ({rs['label']}), KL {rs['kl']:.4g}", highlight=False)
    out.print(f"{result.verdict.upper()}: {out_dir / 'recheck.md'}", highlight=False)
    if not result.passed:
        raise typer.Exit(1)
