"""The registry of predicted tiers (name -> where its profile comes from, what prices a plan from it), and
the choice of the energy models for ``--energy measured|predicted|auto``.

The predicted tier of a model is the first tier in :data:`PREDICTED_TIERS` that has a profile for it and
fits it: this model's per-model profile (the user's or a shipped one of the same layer geometry), the GPU
profile of the target's kind (GEMM tables; dense models), the shipped layer profile, the datasheet roofline.
A tier names the tier that prices the plans it cannot (an FP8 KV cache, a format its GPU does not run), so a
trial is priced, never aborted. Adding a tier is one entry here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from advisor.energy.prediction._gpu_costmodel import GpuProfileCostModel
from advisor.energy.prediction._layer_costmodel import ProfileCostModel
from advisor.energy.prediction._model_costmodel import ModelProfileCostModel
from advisor.energy.prediction._roofline import RooflineEnergyModel
from advisor.energy.profiling import (
    GPU_SCHEMA,
    ProfileStore,
    ensure_model_profile,
    geometry_digest,
    is_model_profile,
    model_digest,
    read_any_profile,
    shipped_gpu_profile,
    shipped_profile,
)
from advisor.errors import InputError, UnsupportedError
from advisor.estimate import EnergyEstimate, EnergyModel, PredictedModel
from advisor.formats import GPU, gpu_from_device_name
from advisor.models.shape import ModelShape
from advisor.plan import Plan
from advisor.recipe.schema import Workload
from advisor.search.measured import MeasuredTier

log = logging.getLogger(__name__)

ENERGY_MODES = ("measured", "predicted", "auto")


@dataclass(frozen=True)
class TierRequest:
    """What a tier needs to find its profile and price a model: the model, the target GPU kind, the
    transformers config (None: a Llama stand-in of the shape) and the profile store."""

    shape: ModelShape
    target: GPU
    model_config: Any
    store: ProfileStore
    skipped: tuple[str, ...] = ()  # tiers tried before this one that had a profile but did not fit


@dataclass(frozen=True)
class PredictedTier:
    """One predicted tier. ``find``: the profile it prices from for a request (None: it has none); ``price``:
    the energy model of that profile (InputError where it does not fit the model); ``reads``: whether a profile
    file is of its schema; ``fallback``: the tier whose chain prices the plans this one cannot (None: none)."""

    name: str
    find: Callable[[TierRequest], dict[str, Any] | None]
    price: Callable[[dict[str, Any], TierRequest], PredictedModel]
    reads: Callable[[dict[str, Any]], bool]
    fallback: str | None = None


class WithFallback:
    """``primary`` where it can price a plan; ``fallback`` (labelled so) where it cannot, e.g. an FP8 KV
    cache or a format the profile's GPU does not run: a trial is priced, never aborted."""

    measured = False

    def __init__(self, primary: PredictedModel, fallback: PredictedModel) -> None:
        self.primary, self.fallback = primary, fallback
        self.label = primary.label

    def estimate(self, plan: Plan, workload: Workload) -> EnergyEstimate:
        try:
            return self.primary.estimate(plan, workload)
        except UnsupportedError as exc:
            est = self.fallback.estimate(plan, workload)
            return replace(est, source=f"{est.source} [not in {self.primary.label}: {exc}]")

    @property
    def gpus(self) -> int:
        return self.primary.gpus

    def without_step_cap(self) -> WithFallback:
        """Both models without a per-step power limit where they hold one."""
        return WithFallback(self.primary.without_step_cap(), self.fallback.without_step_cap())

    def pass_is_decode_step(self, plan: Plan) -> bool:
        """The answer of the model that prices ``plan``."""
        model = self.fallback if self._not_priced(plan) else self.primary
        return model.pass_is_decode_step(plan)

    def decode_step(self, plan: Plan, batch: int, context: float) -> tuple[float, float]:
        """(ms, J) of one decode step, from the model that prices ``plan`` (see :meth:`estimate`)."""
        try:
            return self.primary.decode_step(plan, batch, context)
        except UnsupportedError:
            return self.fallback.decode_step(plan, batch, context)

    def prefill(self, plan: Plan, length: int) -> tuple[float, float]:
        """(ms, J) of one request's prefill, from the model that prices ``plan``."""
        try:
            return self.primary.prefill(plan, length)
        except UnsupportedError:
            return self.fallback.prefill(plan, length)

    def step_source(self, plan: Plan) -> str:
        """The label of the model whose step times price ``plan``."""
        exc = self._not_priced(plan)
        return f"{self.fallback.label} [not in {self.primary.label}: {exc}]" if exc else self.primary.label

    def _not_priced(self, plan: Plan) -> UnsupportedError | None:
        """Why ``primary`` cannot price ``plan`` (None where it can)."""
        try:
            self.primary.prefill(plan, 1)
        except UnsupportedError as exc:
            return exc
        return None


def dims_or_none(shape: ModelShape, model_config: Any):
    """The runtime's decoder of this model (its own layers from the config, else a Llama stand-in), or
    None where the runtime cannot build it (MoE, partial rotary, ...): then no per-model profile."""
    from advisor.energy.runtime import DecoderDims

    try:
        return DecoderDims.from_config(model_config) if model_config is not None else DecoderDims.from_shape(shape)
    except UnsupportedError:
        return None


def _own_model_profile(req: TierRequest) -> dict[str, Any] | None:
    dims = dims_or_none(req.shape, req.model_config)
    if dims is None:
        return None
    described = dims.to_dict()
    return req.store.find_for_kind(req.target.value, model_digest(described), geometry=geometry_digest(described))


def _gpu_profile(req: TierRequest) -> dict[str, Any] | None:
    if req.shape.is_moe:  # the GEMM tables price dense layers
        return None
    return req.store.gpu_profile(req.target.value) or shipped_gpu_profile(req.target)


def _roofline(_profile: dict[str, Any], req: TierRequest) -> PredictedModel:
    if "layer" in req.skipped:
        return RooflineEnergyModel(req.shape, req.target, note=f"the {req.target.value} profile does not cover "
                                                               "this model")
    return RooflineEnergyModel(req.shape, req.target)


#: every predicted tier, in the order they are tried
PREDICTED_TIERS: dict[str, PredictedTier] = {t.name: t for t in (
    PredictedTier("per-model", _own_model_profile, lambda p, req: ModelProfileCostModel(p, req.shape),
                  is_model_profile, fallback="layer"),
    PredictedTier("gpu", _gpu_profile, lambda p, req: GpuProfileCostModel(p, req.shape),
                  lambda d: d.get("schema") == GPU_SCHEMA, fallback="layer"),
    PredictedTier("layer", lambda req: shipped_profile(req.target), lambda p, req: ProfileCostModel(p, req.shape),
                  lambda d: True),
    PredictedTier("roofline", lambda req: {}, _roofline, lambda d: False),
)}


def _whose(tier: PredictedTier, profile: dict[str, Any], target: GPU) -> str:
    if profile.get("stored"):
        return f"your {tier.name} profile {profile['stored']}"
    return f"the shipped {target.value} {tier.name} profile"


def _chain(tier: PredictedTier, model: PredictedModel, req: TierRequest) -> PredictedModel:
    return model if tier.fallback is None else WithFallback(model, _first_from(tier.fallback, req))


def _first_from(start: str, req: TierRequest) -> PredictedModel:
    """The first tier from ``start`` on (registry order) with a profile that fits, chained to its fallback."""
    names = list(PREDICTED_TIERS)
    for name in names[names.index(start):]:
        tier = PREDICTED_TIERS[name]
        profile = tier.find(req)
        if profile is None:
            continue
        try:
            model = tier.price(profile, req)
        except InputError as exc:
            log.warning("%s does not fit this model (%s); trying the next tier", _whose(tier, profile, req.target),
                        exc)
            req = replace(req, skipped=(*req.skipped, name))
            continue
        return _chain(tier, model, req)
    raise AssertionError("the roofline tier prices every model")  # pragma: no cover


def gpu_here() -> tuple[GPU | None, str | None]:
    """The known GPU kind on this machine (via NVML), or (None, None) when there is none."""
    from advisor.energy.meter import NvmlDevice
    from advisor.errors import SetupError

    try:
        name = NvmlDevice(0).name
    except SetupError:
        return None, None
    return gpu_from_device_name(name), name


def make_predicted_model(shape: ModelShape, target: GPU, profile: Path | None = None, model_config: Any = None,
                         store: ProfileStore | None = None, per_model: bool = True) -> PredictedModel:
    """The predicted tier: ``profile`` (a per-model, GPU or layer profile JSON) if given, priced by the tier of
    its schema; else the first tier of :data:`PREDICTED_TIERS` with a profile for this model on a GPU of
    ``target``'s kind (``per_model=False``: from the GPU profile on)."""
    req = TierRequest(shape, target, model_config, store or ProfileStore())
    if profile is not None:
        data = read_any_profile(profile)
        if data.get("gpu_kind") not in (None, target.value):
            raise InputError(f"profile {profile} is for {data['gpu_kind']}, but the target is {target.value}")
        tier = next(t for t in PREDICTED_TIERS.values() if t.reads(data))
        return _chain(tier, tier.price(data, req), req)
    return _first_from("per-model" if per_model else "gpu", req)


def make_energy_tiers(
    mode: str,
    shape: ModelShape,
    target: GPU,
    profile: Path | None = None,
    measured_engine: Callable[[], MeasuredTier] | None = None,
    model_config: Any = None,
    workloads: Sequence[Workload] = (),
    store: ProfileStore | None = None,
) -> tuple[PredictedModel, MeasuredTier | None]:
    """(predicted, measured) for ``--energy predicted|measured|auto``.

    The predicted tier prices every trial (:func:`make_predicted_model`). Where the measured tier runs (a GPU
    of the target kind here, built-in runtime), this model's per-model profile is built first for
    ``workloads``' batches and contexts (minutes), or reused from ``store`` when one of this GPU, driver,
    power limit, model and runtime is there. The measured tier (NVML on the GPU here, the serving runtime on
    random weights of ``shape``, under a minute per plan and workload) re-prices the baselines and the front
    afterwards: ``measured`` requires a GPU of the target kind, ``auto`` uses one when it is here,
    ``predicted`` never measures. ``measured_engine`` builds another measured tier than the built-in runtime
    (``--engine vllm``: its entry's builder in :data:`advisor.engines.ENGINE_TABLE`). ``model_config`` (the
    transformers config) lets the runtime build the model's own layers; without it, a Llama stand-in of ``shape``
    runs, and says so.
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
    store = store or ProfileStore()
    if profile is None:
        built = ensure_model_profile(measured, workloads, store)
        if built is not None:
            tier = PREDICTED_TIERS["per-model"]
            req = TierRequest(shape, target, model_config, store)
            return _chain(tier, tier.price(built, req), req), measured
    return make_predicted_model(shape, target, profile, model_config, store), measured


def make_energy_model(mode: str, shape: ModelShape, target: GPU, profile: Path | None = None,
                      model_config: Any = None) -> EnergyModel:
    """One energy model: the measured tier for ``measured`` (or ``auto`` with a GPU of the target
    kind here), else the predicted one (used by `advisor measure` and `recheck`)."""
    predicted, measured = make_energy_tiers(mode, shape, target, profile, model_config=model_config)
    return measured or predicted
