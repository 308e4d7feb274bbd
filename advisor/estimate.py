"""The energy interface every estimator (roofline, profile cost model, NVML measurement) meets."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

from advisor.plan import Plan
from advisor.recipe.schema import Workload


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

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of_request(cls, workload: Workload, prefill_j: float, step_j: float, decode_tokens_per_s: float,
                   source: str, measured: bool) -> EnergyEstimate:
        """A request of ``workload``: one prefill of its input, then ``output_tokens`` decode steps
        of its batch (``step_j`` each, shared by the batch's requests)."""
        b, lin, lout = workload.batch_size, workload.input_tokens, workload.output_tokens
        return cls(workload=workload.name, j_per_token=(prefill_j + lout * step_j / b) / lout,
                   decode_j_per_token=step_j / b, prefill_j_per_input_token=prefill_j / lin,
                   decode_tokens_per_s=decode_tokens_per_s, source=source, measured=measured)


@runtime_checkable
class EnergyModel(Protocol):
    """Anything that gives a plan's energy on a workload. ``label`` names the method."""

    label: str
    measured: bool

    def estimate(self, plan: Plan, workload: Workload) -> EnergyEstimate: ...
