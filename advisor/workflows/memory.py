"""A recipe's memory plan (:mod:`advisor.models.memory_plan`) on the GPUs here or on a named node, from the
model's config alone: `advisor search --dry-run` prints it, pre-flight refuses a search that would not run (not
even with layers streamed from CPU memory), and the load places the model as it says. ``gpu_memory_gib`` (the
recipe's, `--gpu-memory`) caps each GPU: the plan sees no more, and torch's allocator is held to it."""

from __future__ import annotations

from typing import Any

from advisor.errors import InputError, SetupError
from advisor.models.memory_plan import (
    BF16_BYTES,
    GIB,
    MAX_GPUS,
    Device,
    MemoryPlan,
    RunSizes,
    compact,
    gpus,
    plan_memory,
)
from advisor.recipe.schema import ModelSpec, Recipe


def read_config(spec: ModelSpec) -> Any:
    """The model's transformers config (a GGUF file's header), never its weights."""
    from transformers import AutoConfig

    from advisor.models.hub_access import with_hub_note
    from advisor.models.loading import resolve_source

    where, gguf_file = resolve_source(spec)
    kwargs: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
    if spec.revision:
        kwargs["revision"] = spec.revision
    try:
        return AutoConfig.from_pretrained(where, **kwargs)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"model.source: cannot read the model config of {spec.source!r} "
                         f"({with_hub_note(first, where)}); give a folder with a valid config.json or a hub id"
                         ) from None


def devices_here(cap_gib: float | None = None) -> list[Device]:
    """The free memory of each GPU torch sees, at most ``cap_gib``; [] without one."""
    import torch

    if not torch.cuda.is_available():
        return []
    cap = int(cap_gib * GIB) if cap_gib else None
    return [Device(f"cuda:{i}", min(int(torch.cuda.mem_get_info(i)[0]), cap or 2**62))
            for i in range(torch.cuda.device_count())]


def cap_gpu_memory(cap_gib: float | None) -> None:
    """Hold torch's allocator on every GPU to ``cap_gib`` (a run past it fails with CUDA out of memory)."""
    import torch

    if not cap_gib or not torch.cuda.is_available():
        return
    for i in range(torch.cuda.device_count()):
        total = torch.cuda.get_device_properties(i).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * GIB / total), i)


def lift_gpu_memory_cap(cap_gib: float | None) -> None:
    """Undo :func:`cap_gpu_memory` (the measured energy tier builds its own model of the shape: not the search's
    placement, not its cap)."""
    import torch

    if cap_gib and torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            torch.cuda.set_per_process_memory_fraction(1.0, i)


def named_node(count: int, memory_gib: float | None) -> list[Device]:
    """``--gpus N --gpu-memory GB``: N devices of that memory."""
    if not 1 <= count <= MAX_GPUS:  # a real run's bound (the recipe's gpus), and a plan's search for the fewest
        raise InputError(f"--gpus {count}: a plan is for one node of 1 to {MAX_GPUS} GPUs; give at most {MAX_GPUS}")
    if memory_gib is None:
        raise InputError("--gpus needs --gpu-memory: give both (e.g. --gpus 4 --gpu-memory 80 for four H100 80GB), "
                         "or neither to plan for the GPUs here")
    return gpus(count, int(memory_gib * GIB))


def recipe_plan(recipe: Recipe, devices: list[Device]) -> MemoryPlan:
    """The plan on ``devices``: on the GPUs, else with the layers they cannot hold streamed from CPU memory."""
    return plan_memory(read_config(recipe.model), RunSizes.from_recipe(recipe), devices, recipe.model.source,
                       stream=not RunSizes.from_recipe(recipe).whole_cpu_copy)


def not_fitting_message(plan: MemoryPlan) -> str:
    """The one line that says what does not fit and the fewest GPUs that would hold it."""
    devices = plan.placements
    memory = min(p.device.memory_bytes for p in devices) / GIB
    where = f"{len(devices)} GPU{'s' if len(devices) > 1 else ''} of {memory:.0f} GiB"
    left = ", ".join(compact(plan.overflow))
    fix = (f"it needs at least {plan.smallest_gpus} such GPUs (give a node that has them, or fewer formats)"
           if plan.smallest_gpus else "no node of up to 64 such GPUs holds it; search fewer formats or a smaller model")
    why = (f"{left} ({plan.overflow_bytes / GIB:.1f} GiB) would have to stream from CPU memory, which a GGUF "
           "model (read whole) cannot" if plan.sizes.whole_cpu_copy else
           f"not even with layers streamed from CPU memory (the embeddings, lm_head, logits and one streamed layer "
           f"must fit; {left} do not)")
    return f"the search of {plan.model} does not fit {where}: {why}; {fix}; `advisor search --dry-run` prints the plan"


def check_cpu_memory(plan: MemoryPlan) -> None:
    """A streaming plan's CPU side must fit the memory available here (exit 3 otherwise)."""
    import psutil

    need = sum(plan.cpu_bytes.values())
    have = psutil.virtual_memory().available
    if plan.streaming and need > have:
        raise SetupError(f"the search of {plan.model} streams {', '.join(compact(plan.overflow))} from CPU memory "
                         f"and needs {need / GIB:.1f} GiB of it; {have / GIB:.1f} GiB are available here: run on a "
                         "machine with more memory or more GPUs (`advisor search --dry-run` prints the plan)")


def load_device_map(recipe: Recipe, device: str) -> dict[str, Any] | None:
    """Where a CUDA search loads its model: onto the current GPU when it holds the search, else as the memory
    plan places it (over the GPUs here, the layers they cannot hold on "cpu": streamed from CPU memory); either
    way read shard by shard, with no whole CPU copy. None (load on the CPU, then move) for the CPU and for GGUF
    files, which transformers reads whole."""
    sizes = RunSizes.from_recipe(recipe)
    if device != "cuda" or sizes.whole_cpu_copy:
        return None
    import torch

    devices = devices_here(recipe.gpu_memory_gib)
    whole = {"": torch.cuda.current_device()}
    from advisor.models.device_map import plan_device_map

    config = read_config(recipe.model)
    if plan_memory(config, sizes, devices[:1]).fits:
        return whole
    plan = plan_memory(config, sizes, devices, recipe.model.source, stream=True)
    return plan_device_map(config, plan) if plan.runs else whole


def check_memory(recipe: Recipe) -> None:
    """Pre-flight: refuse (exit 3) a search whose model, bank and batches do not run on the GPUs here (spread over
    them when one is short, layers streamed from CPU memory when they all are: :func:`load_device_map`), or, on a
    CPU, in this machine's memory."""
    devices = [] if recipe.device == "cpu" else devices_here(recipe.gpu_memory_gib)
    if not devices:  # device cuda without a GPU is check_devices' error
        if recipe.device != "cuda":
            check_cpu_search(recipe)
        return
    plan = recipe_plan(recipe, devices)
    if not plan.runs:
        raise SetupError(not_fitting_message(plan))
    check_cpu_memory(plan)


def _cpu_weights(recipe: Recipe) -> tuple[MemoryPlan, int]:
    """The search's plan on this CPU, and how many times its BF16 weights' bytes the scored weights take (2 where
    the CPU scores in float32: :mod:`advisor.models.arithmetic`)."""
    from advisor.models.arithmetic import FLOAT32, choose_arithmetic, cpu_has_bf16_matmul, physical_memory_bytes

    plan = plan_memory(read_config(recipe.model), RunSizes.from_recipe(recipe), [Device("cpu", 2**62)],
                       recipe.model.source)
    n_params = plan.totals["weights (BF16)"] // BF16_BYTES
    arithmetic, _ = choose_arithmetic("cpu", n_params, cpu_has_bf16_matmul(), physical_memory_bytes())
    return plan, 2 if arithmetic == FLOAT32 else 1


def _refuse_over(need: int, what: str) -> None:
    import psutil

    have = psutil.virtual_memory().available
    if need > have:
        raise SetupError(f"{what} needs about {need / GIB:.1f} GiB of memory; {have / GIB:.1f} GiB are available "
                         "here: run it on a machine with more memory, or search on a GPU machine "
                         "(`advisor search --dry-run --gpus N --gpu-memory GB` plans one)")


def check_cpu_search(recipe: Recipe) -> None:
    """A search on the CPU holds the model (float32 where scored so), its bank entries, the sensitivity records,
    the largest batch and the proxy's reference in this machine's memory (exit 3 when they cannot fit)."""
    plan, scale = _cpu_weights(recipe)
    p = plan.placements[0]
    need = (p.weights_bytes + p.workspace_bytes + p.logits_bytes) * scale + p.bank_bytes + p.records_bytes
    need += sum(plan.cpu_bytes.values()) - (plan.totals["weights (BF16)"] if plan.sizes.whole_cpu_copy else 0)
    _refuse_over(need, f"the search of {recipe.model.source} on this CPU (weights, bank entries and batches)")


def check_cpu_export(recipe: Recipe) -> None:
    """An export holds the model and its quantized copy on the CPU at once (exit 3 when even that cannot fit)."""
    plan, scale = _cpu_weights(recipe)
    _refuse_over(2 * plan.totals["weights (BF16)"] * scale,
                 f"exporting {recipe.model.source} (the model and its quantized copy, on the CPU)")
