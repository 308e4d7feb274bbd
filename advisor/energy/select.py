"""Choose the energy model for `--energy measured|predicted|auto`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from advisor.errors import InputError
from advisor.estimate import EnergyModel
from advisor.formats import GPU, gpu_from_device_name
from advisor.models.shape import ModelShape

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
) -> tuple[EnergyModel, EnergyModel | None]:
    """(predicted, measured) for ``--energy predicted|measured|auto``.

    The predicted tier prices every trial: the cost model on ``profile`` if given, else on the
    shipped profile of ``target`` (advisor/energy/profiles/), else the datasheet roofline. The
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
    predicted = make_predicted_model(shape, target, profile)
    if mode == "auto":
        here, _ = gpu_here()
        mode = "measured" if here == target else "predicted"
    if mode == "predicted":
        return predicted, None
    if measured_engine is not None:
        return predicted, measured_engine()
    from advisor.energy.measure import MeasuredEnergyModel

    return predicted, MeasuredEnergyModel(shape, target, model_config=model_config)


def make_energy_model(mode: str, shape: ModelShape, target: GPU, profile: Path | None = None,
                      model_config: Any = None) -> EnergyModel:
    """One energy model: the measured tier for ``measured`` (or ``auto`` with a GPU of the target
    kind here), else the predicted one (used by `advisor measure` and `recheck`)."""
    predicted, measured = make_energy_tiers(mode, shape, target, profile, model_config=model_config)
    return measured or predicted


def make_predicted_model(shape: ModelShape, target: GPU, profile: Path | None = None) -> EnergyModel:
    from advisor.energy.costmodel import ProfileCostModel
    from advisor.energy.profile import load_profile, shipped_profile

    if profile is not None:
        data = load_profile(profile)
        if data.get("gpu_kind") not in (None, target.value):
            raise InputError(f"profile {profile} is for {data['gpu_kind']}, but the target is {target.value}")
        return ProfileCostModel(data, shape)
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
