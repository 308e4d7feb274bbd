"""The energy records and the interface every estimator (roofline, profile cost model, NVML measurement)
meets. :class:`EnergyEstimate` is the one form an energy number takes from the estimator through the study's
stored attributes (:mod:`advisor.search.trial_record`) to summary.json."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import TypeAdapter

from advisor.plan import Plan
from advisor.recipe.schema import Workload

Tier = Literal["measured", "predicted"]


@dataclass(frozen=True)
class EnergyEstimate:
    """Energy of one plan on one workload.

    ``j_per_token`` is the figure of merit: joules per generated (output) token of
    a request, with the request's prefill energy included. ``source`` says how the
    numbers were obtained and is printed beside them, e.g.
    ``"predicted (roofline, datasheet NVIDIA H100 SXM)"`` or
    ``"measured (NVIDIA H100 80GB HBM3, driver 580.159.04, 2026-11-22)"``.
    """

    workload: str
    j_per_token: float
    decode_j_per_token: float
    prefill_j_per_input_token: float
    decode_tokens_per_s: float
    source: str
    measured: bool

    @property
    def tier(self) -> Tier:
        return "measured" if self.measured else "predicted"

    def to_dict(self) -> dict[str, Any]:
        """The stored and printed form (study attributes, summary.json, recheck.json)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EnergyEstimate:
        """Back from :meth:`to_dict`'s form, types checked (a stored record is input like any other)."""
        return _ESTIMATE.validate_python(data)

    @classmethod
    def of_request(cls, workload: Workload, prefill_j: float, step_j: float, decode_tokens_per_s: float,
                   source: str, measured: bool) -> EnergyEstimate:
        """A request of ``workload``: one prefill of its input, then ``output_tokens`` decode steps
        of its batch (``step_j`` each, shared by the batch's requests)."""
        b, lin, lout = workload.batch_size, workload.input_tokens, workload.output_tokens
        return cls(workload=workload.name, j_per_token=(prefill_j + lout * step_j / b) / lout,
                   decode_j_per_token=step_j / b, prefill_j_per_input_token=prefill_j / lin,
                   decode_tokens_per_s=decode_tokens_per_s, source=source, measured=measured)


def j_per_token_by_workload(estimates: Sequence[EnergyEstimate]) -> dict[str, float]:
    """workload name -> J/token."""
    return {e.workload: e.j_per_token for e in estimates}


@dataclass(frozen=True)
class DriftCheck:
    """The reference plan measured again at the end of a measured-energy stage (:mod:`advisor.search.measured._tiers`):
    its J/token then and now per workload, and the change in percent."""

    plan_id: str
    plan: str
    source: str
    measured_at: str  # ISO 8601, UTC
    first_j_per_token: dict[str, float]
    again_j_per_token: dict[str, float]
    drift_pct: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DriftCheck:
        return _DRIFT.validate_python(data)


@dataclass(frozen=True)
class MeasuredUnit:
    """One GPU of the measured tier (:mod:`advisor.search.measured._queue`): its UUID (None: a meter that names
    none) and name, its first all-BF16 measurement (what its drift checks and the other units compare with), and
    the plans measured on it."""

    gpu_uuid: str | None
    gpu: str
    reference: list[EnergyEstimate]
    plans: list[str]

    @property
    def key(self) -> str:
        return self.gpu_uuid or self.gpu

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MeasuredUnit:
        return _UNIT.validate_python(data)


_ESTIMATE = TypeAdapter(EnergyEstimate)
_DRIFT = TypeAdapter(DriftCheck)
_UNIT = TypeAdapter(MeasuredUnit)


@runtime_checkable
class EnergyModel(Protocol):
    """Anything that gives a plan's energy on a workload. ``label`` names the method."""

    label: str
    measured: bool

    def estimate(self, plan: Plan, workload: Workload) -> EnergyEstimate: ...


class PredictedModel(EnergyModel, Protocol):
    """A predicted tier (``energy/prediction``): an energy model that also gives (ms, J) of one decode step and of
    one request's prefill, which operating points are computed from, and names the model whose step times price
    a plan (a tier's fallback where the tier cannot). Measured tiers are :class:`~advisor.search.measured._contract.
    MeasuredTier`."""

    def decode_step(self, plan: Plan, batch: int, context: float) -> tuple[float, float]: ...

    def prefill(self, plan: Plan, length: int) -> tuple[float, float]: ...

    def step_source(self, plan: Plan) -> str: ...

    #: the GPUs a step's costs are of (its energy summed over them): tensor parallelism's N, else 1
    gpus: int

    def without_step_cap(self) -> PredictedModel:
        """This model with no step held to the GPU's power limit on its own (itself where it holds none): for a
        caller that holds a mix of steps to the limit once, over their mean, as the GPU's limiter does."""
        ...

    def pass_is_decode_step(self, plan: Plan) -> bool:
        """Whether one pass over n tokens (no KV cache read) costs what this model's decode step of n rows does: true
        where that step's GEMMs are read at n rows from a table measured into the compute-bound regime; false where
        decode steps were profiled at decode batches only, so a prompt of n tokens bounds the pass from above."""
        ...
