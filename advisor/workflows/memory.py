"""A recipe's memory plan (:mod:`advisor.models.memory_plan`) on the GPUs here or on a named node, from the
model's config alone: `advisor search --dry-run` prints it, pre-flight refuses a search that would not fit."""

from __future__ import annotations

from typing import Any

from advisor.errors import InputError, SetupError
from advisor.models.memory_plan import GIB, Device, MemoryPlan, RunSizes, compact, gpus, plan_memory
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


def devices_here() -> list[Device]:
    """The free memory of each GPU torch sees; [] without one."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [Device(f"cuda:{i}", int(torch.cuda.mem_get_info(i)[0])) for i in range(torch.cuda.device_count())]


def named_node(count: int | None, memory_gib: float | None) -> list[Device] | None:
    """``--gpus N --gpu-memory GB``: N devices of that memory; None when neither is given."""
    if count is None and memory_gib is None:
        return None
    if count is None or memory_gib is None:
        raise InputError("--gpus and --gpu-memory go together: give both (e.g. --gpus 4 --gpu-memory 80 for four "
                         "H100 80GB), or neither to plan for the GPUs here")
    return gpus(count, int(memory_gib * GIB))


def recipe_plan(recipe: Recipe, devices: list[Device]) -> MemoryPlan:
    return plan_memory(read_config(recipe.model), RunSizes.from_recipe(recipe), devices, recipe.model.source)


def not_fitting_message(plan: MemoryPlan) -> str:
    """The one line that says what does not fit and the fewest GPUs that would hold it."""
    devices = plan.placements
    memory = min(p.device.memory_bytes for p in devices) / GIB
    where = f"{len(devices)} GPU{'s' if len(devices) > 1 else ''} of {memory:.0f} GiB"
    left = ", ".join(compact(plan.overflow))
    fix = (f"it needs at least {plan.smallest_gpus} such GPUs (give a node that has them, or fewer formats)"
           if plan.smallest_gpus else "no node of up to 64 such GPUs holds it; search fewer formats or a smaller model")
    return (f"the search of {plan.model} does not fit {where}: {left} ({plan.overflow_bytes / GIB:.1f} GiB) would have "
            f"to stream from CPU memory; {fix}; `advisor search --dry-run` prints the plan")


def load_device_map(recipe: Recipe, device: str) -> dict[str, Any] | None:
    """Where a CUDA search loads its model: over the GPUs here when one cannot hold its search (the memory
    plan's placement), else onto the current GPU; either way read shard by shard, with no whole CPU copy.
    None (load on the CPU, then move) for the CPU and for GGUF files, which transformers reads whole."""
    sizes = RunSizes.from_recipe(recipe)
    if device != "cuda" or sizes.whole_cpu_copy:
        return None
    import torch

    devices = devices_here()
    whole = {"": torch.cuda.current_device()}
    if len(devices) < 2:
        return whole
    from advisor.models.device_map import plan_device_map

    config = read_config(recipe.model)
    if plan_memory(config, sizes, devices[:1]).fits:
        return whole
    plan = plan_memory(config, sizes, devices, recipe.model.source)
    return plan_device_map(config, plan) if plan.fits else whole


def check_memory(recipe: Recipe) -> None:
    """Pre-flight: refuse (exit 3) a search whose model, bank and batches do not fit the GPUs here (spread over
    them when one is short: :func:`spread_device_map`)."""
    if recipe.device == "cpu":
        return
    devices = devices_here()
    if not devices:
        return  # device auto on a CPU machine; device cuda without a GPU is check_devices' error
    plan = recipe_plan(recipe, devices)
    if not plan.fits:
        raise SetupError(not_fitting_message(plan))
