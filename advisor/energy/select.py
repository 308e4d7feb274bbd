"""Choose the energy model for `--energy measured|predicted|auto`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from advisor.energy.gpu_costmodel import GpuProfileCostModel
from advisor.energy.model_costmodel import ModelProfileCostModel
from advisor.energy.model_profile import geometry_digest, is_model_profile, model_digest
from advisor.energy.profile_select import (
    GPU_SCHEMA,
    WithFallback,
    dims_or_none,
    ensure_model_profile,
    read_any_profile,
    shipped_gpu_profile,
)
from advisor.energy.profile_store import ProfileStore
from advisor.errors import InputError, UnsupportedError
from advisor.estimate import EnergyModel
from advisor.formats import GPU, gpu_from_device_name
from advisor.models.shape import ModelShape
from advisor.recipe.schema import Workload

log = logging.getLogger(__name__)

ENERGY_MODES = ("measured", "predicted", "auto")


def gpu_here() -> tuple[GPU | None, str | None]:
    """The known GPU kind on this machine (via NVML), or (None, None) when there is none."""
    from advisor.energy.nvml import NvmlDevice
    from advisor.errors import SetupError

    try:
        name = NvmlDevice(0).name
    except SetupError:
        return None, None
    return gpu_from_device_name(name), name


def make_energy_tiers(
    mode: str,
    shape: ModelShape,
    target: GPU,
    profile: Path | None = None,
    measured_engine: Callable[[], EnergyModel] | None = None,
    model_config: Any = None,
    workloads: Sequence[Workload] = (),
    store: ProfileStore | None = None,
) -> tuple[EnergyModel, EnergyModel | None]:
    """(predicted, measured) for ``--energy predicted|measured|auto``.

    The predicted tier prices every trial (:func:`make_predicted_model`): ``profile`` if given,
    else this model's per-model profile, else a GPU profile of ``target``'s kind (the user's, else the
    shipped one). Where the
    measured tier runs (a GPU of the target kind here, built-in runtime), this model's per-model
    profile is built first for ``workloads``' batches and contexts (two to three minutes), or reused
    from ``store`` when one of this GPU, driver, power limit, model and runtime is there. The
    measured tier (NVML on the GPU here, the serving runtime on random weights of ``shape``,
    about 40 s per plan and workload) re-prices the baselines and the front afterwards:
    ``measured`` requires a GPU of the target kind, ``auto`` uses one when it is here,
    ``predicted`` never measures. ``measured_engine`` builds another measured tier than the
    built-in runtime (``--engine tensorrt_llm``: ``deploy.engines``). ``model_config`` (the
    transformers config) lets the runtime build the model's own layers; without it, a Llama
    stand-in of ``shape`` runs, and says so.
    """
    if mode not in ENERGY_MODES:
        raise InputError(f"--energy must be one of {', '.join(ENERGY_MODES)}, got {mode!r}")
    asked = mode
    if mode == "auto":
        here, _ = gpu_here()
        mode = "measured" if here == target else "predicted"
    if mode == "predicted":
        return make_predicted_model(shape, target, profile, model_config, store), None
    if measured_engine is not None:
        return make_predicted_model(shape, target, profile, model_config, store), measured_engine()
    from advisor.energy.measure import MeasuredEnergyModel

    measured = MeasuredEnergyModel(shape, target, model_config=model_config)
    try:
        measured.check_fits(list(workloads) or [Workload()])
    except UnsupportedError as exc:
        if asked != "auto":
            raise
        log.warning("energy: auto: predicted only (%s)", exc)
        return make_predicted_model(shape, target, profile, model_config, store), None
    if profile is None:
        built = ensure_model_profile(measured, workloads, store or ProfileStore())
        if built is not None:
            fallback = make_predicted_model(shape, target, None, model_config, store, per_model=False)
            return WithFallback(ModelProfileCostModel(built, shape), fallback), measured
    return make_predicted_model(shape, target, profile, model_config, store), measured


def make_energy_model(mode: str, shape: ModelShape, target: GPU, profile: Path | None = None,
                      model_config: Any = None) -> EnergyModel:
    """One energy model: the measured tier for ``measured`` (or ``auto`` with a GPU of the target
    kind here), else the predicted one (used by `advisor measure` and `recheck`)."""
    predicted, measured = make_energy_tiers(mode, shape, target, profile, model_config=model_config)
    return measured or predicted


def make_predicted_model(shape: ModelShape, target: GPU, profile: Path | None = None, model_config: Any = None,
                         store: ProfileStore | None = None, per_model: bool = True) -> EnergyModel:
    """The predicted tier: ``profile`` (a per-model, GPU or layer profile JSON) if given; else this model's
    per-model profile for a GPU of ``target``'s kind in ``store``; else the newest GPU profile (GEMM tables) the
    user measured for that kind (``store``), else the shipped one; plans those cannot price (FP8 KV cache,
    formats not native there) fall back to the shipped layer profile, else the datasheet roofline."""
    legacy = _legacy_predicted_model(shape, target)
    if profile is not None:
        data = read_any_profile(profile)
        if data.get("gpu_kind") not in (None, target.value):
            raise InputError(f"profile {profile} is for {data['gpu_kind']}, but the target is {target.value}")
        if is_model_profile(data):
            return WithFallback(ModelProfileCostModel(data, shape), legacy)
        if data.get("schema") == GPU_SCHEMA:
            return WithFallback(GpuProfileCostModel(data, shape), legacy)
        from advisor.energy.costmodel import ProfileCostModel

        return ProfileCostModel(data, shape)
    dims = dims_or_none(shape, model_config)
    store = store or ProfileStore()
    if per_model and dims is not None:
        described = dims.to_dict()
        found = store.find_for_kind(target.value, model_digest(described), geometry=geometry_digest(described))
        if found is not None:
            return WithFallback(ModelProfileCostModel(found, shape), legacy)
    gpu_profile = store.gpu_profile(target.value) or shipped_gpu_profile(target)
    if gpu_profile is not None and not shape.is_moe:
        try:
            return WithFallback(GpuProfileCostModel(gpu_profile, shape), legacy)
        except InputError as exc:
            whose = f"your GPU profile {gpu_profile['stored']}" if gpu_profile.get("stored") else \
                f"the shipped {target.value} GPU profile"
            log.warning("%s does not fit this model (%s)", whose, exc)
    return legacy


def _legacy_predicted_model(shape: ModelShape, target: GPU) -> EnergyModel:
    """The shipped layer profile scaled by weight count (or the roofline): prices what the others cannot."""
    from advisor.energy.costmodel import ProfileCostModel
    from advisor.energy.profile import shipped_profile
    from advisor.energy.roofline import RooflineEnergyModel

    data = shipped_profile(target)
    if data is not None:
        try:
            return ProfileCostModel(data, shape)
        except InputError as exc:  # layer kinds the profile does not cover: the roofline still applies
            log.warning("shipped %s profile does not fit this model (%s); using the datasheet roofline",
                        target.value, exc)
            return RooflineEnergyModel(shape, target, note=f"the {target.value} profile does not cover this model")
    return RooflineEnergyModel(shape, target)
