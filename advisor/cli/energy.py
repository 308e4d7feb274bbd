"""Energy commands (`advisor profile`, `advisor measure`) and the `--energy` choice.

Registered by advisor/cli.py; each command is thin: it checks flags, calls the
energy library, prints the result (JSON on stdout), and raises AdvisorError
subclasses that the CLI maps to exit codes. torch and pynvml are imported only
inside the functions, so `advisor --help` stays instant.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from advisor.energy.prediction import ENERGY_MODES, gpu_here, make_energy_model  # noqa: F401
from advisor.engines import DEFAULT_ENGINE, ENGINE_TABLE, engines_that, import_engine, listed
from advisor.errors import AdvisorError, InputError
from advisor.formats import GPU
from advisor.models.hub_access import with_hub_note
from advisor.models.shape import ModelShape, llama_shape
from advisor.plan import Plan
from advisor.recipe.schema import ModelSpec, Workload

#: `advisor measure --engine`: the engines it runs, as the table describes them, and those spreading over GPUs
MEASURE_ENGINES_HELP = "What runs the plan: " + listed(
    [f"{e.name} ({e.runs})" for e in ENGINE_TABLE.values() if e.measures_alone]) + "."
SPREADING = listed(engines_that(lambda e: e.tensor_parallel and e.measures_alone), "--engine ")


def llama31_8b_shape() -> ModelShape:
    return llama_shape("model.layers", 32, 4096, 14336, 32, 8, 128256, 128)


def model_config(model: str) -> Any:
    """The config of a hub id, a local directory, a .gguf file or the demo model (its GGUF's metadata)."""
    from transformers import AutoConfig

    if model.startswith((".", "/", "~")) and not Path(model).expanduser().exists():
        raise InputError(f"--model: {model} does not exist; give a model folder (with config.json), a .gguf file or a "
                         "hub id")
    if model.startswith("demo:") or model.endswith(".gguf"):
        from advisor.models.loading import resolve_source

        folder, gguf = resolve_source(ModelSpec(source=model))
        return AutoConfig.from_pretrained(folder, gguf_file=gguf)
    return AutoConfig.from_pretrained(model)


def shape_from_model(model: str | None) -> ModelShape:
    """Llama-3.1-8B by default; else the shape of a hub id's or local directory's config
    (any supported family: the model is built on the meta device, no weights are read)."""
    if model is None:
        return llama31_8b_shape()
    try:
        c = model_config(model)
    except AdvisorError:
        raise
    except Exception as exc:  # noqa: BLE001 (transformers raises many kinds)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"--model: cannot read a model config from {model!r} ({with_hub_note(first, model)}); "
                         "give a hub id or a folder with config.json") from None
    from advisor.models.config_check import check_causal_lm

    check_causal_lm(c, model)
    import torch
    from transformers import AutoModelForCausalLM

    from advisor.models.adapters import adapter_for
    from advisor.models.groups import model_shape

    adapter_for(c)  # an unsupported family: one line, exit 2
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(c)
    return model_shape(skeleton)


OutOpt = Annotated[
    Path | None,
    typer.Option("--out", "-o", help="Also write the profile JSON here (it is always kept in the profile store, "
                 "$ADVISOR_PROFILE_DIR or ~/.cache/precision-advisor/profiles)."),
]
PlanOpt = Annotated[Path, typer.Option("--plan", "-p", help="Plan JSON file ({'formats': {group: format}}).")]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model", help="Hub id or local dir of a supported model (its config only); default Llama-3.1-8B."
    ),
]
TargetOpt = Annotated[
    str | None, typer.Option("--target", help="Expected GPU kind (h100, h200, b200); default: the GPU here.")
]
BatchOpt = Annotated[int, typer.Option("--batch", help="Concurrent sequences in decode.")]
InOpt = Annotated[int, typer.Option("--input-tokens", help="Prompt tokens per request.")]
OutTokOpt = Annotated[int, typer.Option("--output-tokens", help="Generated tokens per request.")]


BatchesOpt = Annotated[str, typer.Option("--batches", help="Decode batches to profile, comma-separated.")]
ContextsOpt = Annotated[str, typer.Option(
    "--contexts", help="The shortest and longest decode context of the workloads (input, input + output).")]
PromptsOpt = Annotated[str, typer.Option("--prompt-lengths", help="Prompt lengths to profile, comma-separated.")]


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(v) for v in text.split(",") if v.strip()}))
    except ValueError:
        raise InputError(f"{flag} takes comma-separated positive integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise InputError(f"{flag} takes comma-separated positive integers, got {text!r}")
    return values


ProfileModelOpt = Annotated[
    str | None,
    typer.Option("--model", help="Hub id or local dir of a supported model (its config only); without it, the "
                 "GPU profile for unprofiled models."),
]


def _target(target: str) -> GPU:
    try:
        return GPU(target.lower())
    except ValueError:
        raise InputError(f"--target must be one of {', '.join(g.value for g in GPU)}, got {target!r}") from None


def _check_fits(shape: ModelShape, workload: Workload) -> None:
    from advisor.energy.measure import check_fits, torch_with_gpu

    check_fits(shape, [workload], *torch_with_gpu().cuda.mem_get_info())


def profile(
    model: ProfileModelOpt = None,
    target: TargetOpt = None,
    out: OutOpt = None,
    batches: BatchesOpt = "1,16,64",
    contexts: ContextsOpt = "512,768",
    prompt_lengths: PromptsOpt = "512",
) -> None:
    """Measure an energy profile on this GPU: one model's (--model), or the GPU profile for unprofiled models.

    With --model (two to three minutes; kept for searches): its GEMMs, non-GEMM part and lm_head per format.

    It also meters whole steps of all-BF16, all-FP8 and the MLP-only FP8 corner, and prefills of every other
    layer in FP8.

    It first runs the model for up to 30 s: a small model's energy moves with the GPU's temperature.

    Without it (18 minutes on an H100): GEMM tables, anchor models and each GEMM's energy.

    Either is kept in the profile store, and searches for this GPU kind use it (a model's own profile first)."""
    from advisor.energy.profiling import ProfileStore, measure_model_profile
    from advisor.energy.runtime import DecoderDims

    if out is not None:
        from advisor.workflows.outputs import check_output_file

        check_output_file(out, "--out")
    regime = {"batches": _ints(batches, "--batches"), "contexts": _ints(contexts, "--contexts"),
              "prefill_lengths": _ints(prompt_lengths, "--prompt-lengths")}
    if target is not None:
        _target(target)
    # the model judged before the GPU is looked for (one line, exit 2)
    shape = shape_from_model(model) if model is not None else None
    dims = DecoderDims.from_config(model_config(model)) if model is not None else None
    here, name = gpu_here()
    if name is None:
        from advisor.errors import SetupError

        raise SetupError("no NVIDIA GPU visible through NVML: `advisor profile` measures the GPU it runs on")
    if target is not None and (here is None or here.value != target.lower()):
        from advisor.errors import UnsupportedError

        raise UnsupportedError(f"--target {target}: the GPU here is {name}; profile on a GPU of the target kind")
    command = "advisor " + " ".join(sys.argv[1:])
    echo = lambda *a: typer.echo(" ".join(map(str, a)), err=True)  # noqa: E731
    kind = here.value if here else name.replace(" ", "-").lower()
    if model is None:
        from advisor.energy.profiling import measure_gpu_profile

        data = measure_gpu_profile(command, log=echo)
        path = ProfileStore().save_gpu_profile(data)
        echo(f"stored {path}: searches for a {kind} target price models without a per-model profile with it")
    else:
        _check_fits(shape, Workload(name="profile", batch_size=max(regime["batches"]), output_tokens=1,
                                    input_tokens=max(*regime["contexts"], *regime["prefill_lengths"])))
        data = measure_model_profile(dims, **regime, command=command, log=echo)
        path = ProfileStore().save(data)
        echo(f"stored {path}: searches of this model (or one of its layer geometry) for a {kind} target use it")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=1))
        path = out
    typer.echo(json.dumps({"profile": str(path), "gpu": data["gpu"], "driver": data["driver"], "date": data["date"],
                           "seconds": round(data.get("profile_seconds", data.get("seconds", 0.0)), 1)}))


def measure(
    plan: PlanOpt,
    model: ModelOpt = None,
    target: TargetOpt = None,
    batch: BatchOpt = 16,
    input_tokens: InOpt = 512,
    output_tokens: OutTokOpt = 256,
    engine: Annotated[str, typer.Option(help=MEASURE_ENGINES_HELP)] = DEFAULT_ENGINE,
    checkpoint: Annotated[Path | None, typer.Option(help="The plan's exported checkpoint (`advisor export`), "
                                                    "for an engine that serves one.")] = None,
    tpot_ms: Annotated[float | None, typer.Option(help="Latency objective: time per output token (ms); also "
                                                  "meter the plan at its largest batch that meets it.")] = None,
    ttft_ms: Annotated[float | None, typer.Option(help="Latency objective: time to first token (ms).")] = None,
    percentile: Annotated[str | None, typer.Option(help="p50 or p90: where the objective holds.")] = None,
    max_concurrency: Annotated[int | None, typer.Option(help="The most requests the service keeps in flight.")]
        = None,
    gpus: Annotated[int | None, typer.Option(min=1, help=f"With {SPREADING}: GPUs of this node the checkpoint is "
                                             "served over (tensor parallelism, all metered; default: the fewest "
                                             "that hold it).")] = None,
) -> None:
    """Measure one plan's J/token on the GPU here (serving runtime or engine, NVML meter); with an objective,
    also at the plan's operating point (its largest batch under it, predicted), predicted and measured."""
    from advisor.energy.measure import MeasuredEnergyModel
    from advisor.workflows.measure_point import workload_of

    if batch < 1 or input_tokens < 1 or output_tokens < 1:
        raise InputError("--batch, --input-tokens and --output-tokens must be >= 1")
    workload = workload_of(batch_size=batch, input_tokens=input_tokens, output_tokens=output_tokens,
                           tpot_ms=tpot_ms, ttft_ms=ttft_ms, percentile=percentile, max_concurrency=max_concurrency)
    alone = engines_that(lambda e: e.measures_alone)
    if engine not in alone:
        elsewhere = f" ({engine} measures inside `advisor search --engine {engine}`)" if engine in ENGINE_TABLE else ""
        raise InputError(f"--engine: got {engine!r}; `advisor measure` runs {listed(alone)}{elsewhere}")
    chosen = ENGINE_TABLE[engine]
    if chosen.serves_checkpoint and checkpoint is not None and not checkpoint.is_dir():
        raise InputError(f"--checkpoint: {checkpoint} is not a folder; give the folder `advisor export` wrote")
    if chosen.serves_checkpoint and (checkpoint is None or not (checkpoint / "config.json").is_file()):
        raise InputError(f"--engine {engine} serves an exported checkpoint: give --checkpoint DIR (a folder with "
                         "config.json, written by `advisor export`)")
    if gpus is not None and not chosen.tensor_parallel:
        spread = engines_that(lambda e: e.tensor_parallel and e.measures_alone)
        raise InputError(f"--gpus {gpus} serves over several GPUs, which only {listed(spread, '--engine ')} does; add "
                         f"--engine {spread[0]} --checkpoint DIR, or drop --gpus")
    tgt = _target(target) if target is not None else None
    shape = shape_from_model(model)
    p = Plan.load(plan)
    p.check_against(shape.groups)
    if gpu_here()[1] is None:
        from advisor.errors import SetupError

        raise SetupError("no NVIDIA GPU visible through NVML: `advisor measure` measures on the GPU it runs on "
                         "(without one, `advisor search --energy predicted` predicts)")
    config = None
    if model is not None:
        config = model_config(model)  # readable: shape_from_model read it above
    point = None
    if workload.has_objective:
        from advisor.workflows.measure_point import predicted_point

        kind = tgt or gpu_here()[0]
        if kind is None:
            raise InputError(f"an objective needs the GPU kind its step times are predicted for: the GPU here "
                             f"({gpu_here()[1]}) is not one the advisor knows; give --target "
                             f"{'|'.join(g.value for g in GPU)}")
        point = predicted_point(p, shape, kind, workload, config, engine)
    if chosen.checkpoint_tier is not None and checkpoint is not None:
        from advisor.deploy.serving_gpus import checkpoint_bytes, gpus_label, serving_gpus_for
        from advisor.search.operating import at_batch

        import_engine(engine)
        vocab = json.loads((checkpoint / "config.json").read_text()).get("vocab_size", 32000)
        both = [workload] if point is None else [workload, at_batch(workload, point.state.batch)]  # one engine
        n = serving_gpus_for(gpus, shape, both, checkpoint_bytes(checkpoint))
        label = gpus_label(n) if n > 1 else gpu_here()[1] or ""
        meter: Any = chosen.checkpoint_tier(checkpoint, both, vocab, label, n)
    else:  # the built-in runtime: the one engine measuring alone without a checkpoint (Engine.measures_alone)
        meter = MeasuredEnergyModel(shape, tgt, model_config=config)
        meter.check_fits([workload])
    est = meter.estimate(p, workload)
    served = {"engine": engine, "gpus": meter.gpus} if chosen.serves_checkpoint else {}
    result = {"plan": p.id, "label": p.label(), **served, **est.to_dict()}
    if point is not None:
        from advisor.workflows.measure_point import measured_operating_point

        result["operating_point"] = measured_operating_point(meter, p, point, workload)
    typer.echo(json.dumps(result, indent=2))
