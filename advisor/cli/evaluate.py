"""`advisor eval`: score one plan with lm-eval on the in-memory quantized model.

Thin: checks flags, then calls the library. Raises advisor errors (the CLI's one
error exit turns them into one line and an exit code); prints results to stdout.
Register in advisor/cli.py with ``app.command("eval")(eval_plan)``.

Precedence: flag > recipe file > default.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from advisor.errors import InputError
from advisor.formats import Format
from advisor.recipe.schema import SEED_MAX

PlanOpt = Annotated[str, typer.Option("--plan", help="plan JSON file, or a uniform format: bf16, fp8, nvfp4")]
TasksOpt = Annotated[str, typer.Option(
    "--tasks", help="comma-separated: local tasks (lambada_openai, piqa, arc_easy, gsm8k; need --data-dir), "
    "lm-eval task names, or task YAML paths")]
RecipeOpt = Annotated[Path | None, typer.Option(
    "--recipe", "-r", help="recipe YAML (model, calibration, device; its benchmark.data_dir unless --data-dir)")]
ModelOpt_ = Annotated[str | None, typer.Option("--model", help="hub id, local dir, .gguf file or demo:smollm2-135m")]
GgufOpt = Annotated[str | None, typer.Option("--gguf-file", help="GGUF file name inside --model")]
LimitOpt = Annotated[int | None, typer.Option("--limit", help="seeded random subset per task (default: full set)")]
SeedOpt = Annotated[int, typer.Option("--seed", help="seed of the --limit subset and of lm-eval")]
DataOpt = Annotated[Path | None, typer.Option("--data-dir", help="folder of the local tasks' JSONL files "
                                              "(default: the recipe's benchmark.data_dir)")]
OutOpt = Annotated[Path | None, typer.Option("--out", help="write the scores as JSON here")]
CacheOpt = Annotated[Path | None, typer.Option("--cache-dir", help="score cache folder (default: none)")]
DeviceOpt = Annotated[str | None, typer.Option("--device", help="auto, cpu or cuda")]
BatchOpt = Annotated[int | None, typer.Option("--batch-size",
                                               help="lm-eval batch size [default: 16 on a GPU, 8 on a CPU]")]


def _tasks(text: str) -> list[str]:
    tasks = [t.strip() for t in text.split(",") if t.strip()]
    if not tasks:
        raise InputError("--tasks: give at least one task, e.g. --tasks lambada_openai,piqa")
    return tasks


def _plan(text: str, groups):
    from advisor.plan import Plan

    if text.lower().removeprefix("all-") in {f.value for f in Format}:
        return Plan.uniform(groups, Format(text.lower().removeprefix("all-")))
    path = Path(text)
    if not path.is_file():
        allowed = ", ".join(f.value for f in Format)
        raise InputError(f"--plan: {text} is neither a plan file nor a uniform format ({allowed})")
    plan = Plan.load(path)
    plan.check_against(groups)
    return plan


def eval_plan(
    plan: PlanOpt,
    tasks: TasksOpt = "lambada_openai,piqa,arc_easy",
    recipe: RecipeOpt = None,
    model: ModelOpt_ = None,
    gguf_file: GgufOpt = None,
    limit: LimitOpt = None,
    seed: SeedOpt = 0,
    data_dir: DataOpt = None,
    out: OutOpt = None,
    cache_dir: CacheOpt = None,
    device: DeviceOpt = None,
    batch_size: BatchOpt = None,
) -> None:
    """Score one plan on lm-eval tasks (in memory: the quantized model is never written to disk)."""
    task_list = _tasks(tasks)
    if not 0 <= seed <= SEED_MAX:
        raise InputError(f"--seed: got {seed}; give a whole number from 0 to {SEED_MAX}")
    if limit is not None and limit < 1:
        raise InputError(f"--limit: must be at least 1, got {limit}")
    if batch_size is not None and batch_size < 1:
        raise InputError(f"--batch-size: must be at least 1, got {batch_size}")
    if device is not None and device not in ("auto", "cpu", "cuda"):
        raise InputError(f"--device: got {device!r}; allowed: auto, cpu, cuda")

    from advisor.recipe.schema import load_recipe

    rec = load_recipe(recipe, {"model.source": model, "model.gguf_file": gguf_file, "device": device})
    data_dir_name = "--data-dir"
    if data_dir is None and recipe is not None and rec.benchmark.data_dir is not None:
        data_dir, data_dir_name = Path(rec.benchmark.data_dir), f"benchmark.data_dir (recipe {recipe})"
    from advisor.accuracy import harness
    from advisor.accuracy.task_check import check_tasks
    from advisor.workflows.outputs import check_output_dir, check_output_file
    from advisor.workflows.preflight import check_model

    if data_dir is not None and not data_dir.is_dir():
        raise InputError(f"{data_dir_name}: {data_dir} is not a directory; give the folder holding the tasks' JSONL "
                         f"files ({', '.join(f'{t}.jsonl' for t in harness.LOCAL_TASKS)})")
    # Everything that can be judged before the model is loaded: output, tasks and their data, model config.
    if out is not None:
        check_output_file(out, "--out")
    if cache_dir is not None:
        check_output_dir(cache_dir, "--cache-dir")
    check_tasks(task_list, data_dir)
    check_model(rec, workloads=False)

    import torch

    from advisor.calibration.tokens import build_token_sets, forward_loop
    from advisor.errors import SetupError
    from advisor.models.arithmetic import BF16, scoring_place, to_scoring_arithmetic
    from advisor.models.loading import load_model
    from advisor.quantize.modelopt_config import quantize_plan

    dev = rec.device if rec.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if dev == "cuda" and not torch.cuda.is_available():
        raise SetupError("--device cuda: no CUDA GPU is visible to torch; use --device cpu")
    lm = load_model(rec.model, device=dev)
    chosen = _plan(plan, lm.shape.groups)
    arithmetic, why = to_scoring_arithmetic(lm.model, dev)
    if arithmetic != BF16:
        typer.echo(f"scoring in {arithmetic}: {why}", err=True)
    base_hash = harness.model_hash(lm.model)  # of the weights as scored: float32 scores are cached apart
    model_obj = lm.model
    if chosen.uniform_format() != Format.BF16:
        tokens = build_token_sets(lm.model, lm.tokenizer, rec.calibration)
        model_obj = quantize_plan(lm.model, chosen, lm.shape.groups, forward_loop(tokens.calibration))
    scores = harness.score_plan(
        model_obj, lm.tokenizer, chosen.id, base_hash, task_list, limit=limit, seed=seed,
        data_dir=data_dir, cache_dir=cache_dir, batch_size=batch_size,
    )
    label = chosen.label()
    typer.echo(harness.accuracy_table({label: scores}, list(scores)))
    if out is not None:
        result = {
            "model": lm.name, "model_hash": base_hash, "plan_id": chosen.id, "plan": label,
            "device": scoring_place(dev, arithmetic),
            "limit": limit, "seed": seed, "results": [s.to_dict() for s in scores.values()],
        }
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=2))
        except OSError as exc:
            raise InputError(f"--out: cannot write {out}: {exc.strerror}") from None
        typer.echo(f"wrote {out}")
