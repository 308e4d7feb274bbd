"""Everything `advisor search` can judge before it creates a study, in seconds and without loading
weights: a run that cannot finish must fail on its first line, not after its trials.

Order: the cheap and local first (output folder, storage URL and its driver, files the recipe
names), then the model's config (transformers' import dominates: a few seconds), then the
GPU the energy mode needs and the memory plan on the GPUs the search will use, then the lm-eval
tasks (a text scan of lm-eval's task YAMLs, and a
real build of local tasks). Nothing is created; each problem is one InputError (exit 2) or
SetupError / UnsupportedError (exit 3) naming the fix.
"""

from __future__ import annotations

from pathlib import Path

from advisor.errors import InputError, SetupError, UnsupportedError
from advisor.recipe.calibration_sets import is_set_source, read_set
from advisor.recipe.schema import BenchmarkSpec, Recipe
from advisor.workflows.outputs import check_output_dir


def preflight(recipe: Recipe) -> None:
    """Raise the first problem that would stop ``recipe``'s search; return when it can start."""
    check_output_dir(recipe.run_dir, "out (--out)")
    from advisor.search.storage import check_storage_reachable, check_storage_url

    check_storage_url(recipe.storage_url, folder_must_exist=recipe.storage is not None)
    check_storage_reachable(recipe.storage_url)
    check_input_files(recipe)
    check_model(recipe)
    check_devices(recipe)
    from advisor.workflows.memory import check_memory

    check_memory(recipe)  # the model, its bank and the batches on the GPUs the search will use
    check_benchmark(recipe.benchmark)


def check_input_files(recipe: Recipe) -> None:
    source = recipe.calibration.source
    if is_set_source(source):
        read_set(source)  # the spec's fields; the dataset itself is read when the tokens are built
    elif source != "self":
        from advisor.calibration.tokens import read_calibration_text

        read_calibration_text(Path(source).expanduser())
    if recipe.energy_profile:
        from advisor.energy.profiling import read_any_profile

        data = read_any_profile(Path(recipe.energy_profile))
        if data.get("gpu_kind") not in (None, recipe.target.value):
            raise InputError(f"energy_profile: {recipe.energy_profile} is for {data['gpu_kind']}, but the target "
                             f"is {recipe.target.value}; give a {recipe.target.value} profile or change --target")


def check_model(recipe: Recipe, *, workloads: bool = True, need_weights: bool = True) -> None:
    """The model's files and config: present (the weights only with ``need_weights``), a causal LM whose config
    describes its weights, a context long enough for the recipe's calibration windows and (``workloads``) its
    workloads."""
    from advisor.models.config_check import check_context, model_facts

    facts = model_facts(recipe.model, need_weights=need_weights)
    if facts is not None:
        check_context(facts, recipe, workloads=workloads)


def check_devices(recipe: Recipe) -> None:
    """The GPU that ``device: cuda`` and ``energy: measured`` need is here, of the target kind, and the
    package the recipe's engine needs is importable."""
    if recipe.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SetupError("device: cuda was asked for but torch sees no CUDA GPU; use --device cpu or auto")
    from advisor.engines import import_engine

    import_engine(recipe.engine)  # nothing to import for the built-in runtime
    if recipe.energy == "measured":
        from advisor.energy.prediction import gpu_here

        kind, name = gpu_here()
        if name is None:
            raise SetupError("energy: measured needs an NVIDIA GPU here and NVML sees none; "
                             "use --energy predicted (or auto)")
        if kind != recipe.target:
            raise UnsupportedError(f"energy: measured for target {recipe.target.value}, but the GPU here is {name}; "
                                   "use --energy predicted, or run on the target GPU")


def check_benchmark(spec: BenchmarkSpec) -> None:
    """lm-eval tasks. A data folder that is absent is the search's own warning (the proxy decides,
    as in the quickstart without ../shared), so local tasks are judged only when it exists."""
    if not spec.tasks:
        return
    from advisor.accuracy.harness import LOCAL_TASKS
    from advisor.accuracy.task_check import check_registry_name, check_tasks

    data_dir = spec.data_dir
    if data_dir is not None and not Path(data_dir).is_dir():
        for name in spec.tasks:
            if name not in LOCAL_TASKS and not name.endswith((".yaml", ".yml")):
                check_registry_name(name)
        return
    check_tasks(spec.tasks, data_dir)
