"""Operating points as measured: a plan metered at its own operating batch (the largest batch under a
workload's latency objective, :mod:`advisor.search.operating`), beside the predicted point.

A measured tier (:class:`~advisor.search.measured._contract.MeasuredTier`) meters ``workload`` at the point's batch
(:func:`at_batch`) with its ``measure_points``. What it gives back depends on the engine: an engine that times
requests (vLLM) gives TPOT and TTFT at the objective's percentile (:func:`from_timed`); the built-in runtime gives
its measured decode step and one request's prefill, which :func:`from_steps` composes into the steady state with
the same formulas as the prediction (so the two compare like for like); an engine that gives only J/token and
tokens/s leaves TPOT and TTFT unknown (:func:`from_estimate`), and "meets as measured" then says so (None) rather
than guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

from advisor.estimate import EnergyEstimate
from advisor.plan import Plan
from advisor.recipe.schema import Workload
from advisor.search.operating._points import steady_state

# A steady load that keeps a GPU fed reads near 100% busy in NVML; under this, the host side held it back part of the
# time. One GPU round so far: an 8B's loads on an H200 read 90.6-100%, and the two a host stall slowed 75% and 84%
# (reports/benchmarks/verify_time.md, round 5).
BUSY_BELOW = 90.0
# A larger batch that served this much fewer tokens/s than a smaller one of the same load, the GPU under BUSY_BELOW
# busy, was held back by its host: where the host bounds a small model's FP8 steps, tokens/s level off with the batch
# and may dip a few percent (a 4B's FP8 at batch 112-288: up to 3%), but do not fall this far
# (reports/benchmarks/verify_time.md).
HELD_BACK_DROP = 0.10


@dataclass(frozen=True)
class MeasuredPoint:
    """One plan metered on one workload at ``batch`` in flight. ``tpot_ms`` / ``ttft_ms`` at the workload's
    percentile (None: the engine does not time them); ``meets``: the objective as measured (None: unknown);
    ``gpu_busy_pct``: NVML's utilization over the load, where the engine read it."""

    plan_id: str
    workload: str
    batch: int
    j_per_token: float
    tokens_per_s: float
    tpot_ms: float | None
    ttft_ms: float | None
    meets: bool | None
    source: str
    measured_at: str  # ISO 8601, UTC
    decode_step_ms: float | None = None  # the built-in runtime's measured decode step at this batch
    gpu_busy_pct: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def held_back_beside(self, others: Sequence[MeasuredPoint]) -> bool:
        """The host held this metering back: the GPU under :data:`BUSY_BELOW` busy, and :data:`HELD_BACK_DROP` fewer
        tokens/s served than at a smaller batch of ``others`` (the same load in the same engine: a steady decode load
        serves no fewer tokens/s at a larger batch; the case: reports/benchmarks/verify_time.md, round 11)."""
        return self.gpu_busy_pct is not None and self.gpu_busy_pct < BUSY_BELOW and any(
            o.batch < self.batch and self.tokens_per_s < (1.0 - HELD_BACK_DROP) * o.tokens_per_s for o in others)


def at_batch(workload: Workload, batch: int, again: bool = False) -> Workload:
    """``workload`` served at ``batch`` in flight, named so that it never mixes with the stated batch (``again``: a
    second metering of that batch, named apart from the first)."""
    return workload.model_copy(update={"name": f"{workload.name} at batch {batch}{' again' if again else ''}",
                                       "batch_size": batch})


def objective_name(workload: Workload) -> str:
    """The objective's workload name back from :func:`at_batch`'s name."""
    return workload.name.rsplit(" at batch ", 1)[0]


def meets_as_measured(workload: Workload, tpot_ms: float | None, ttft_ms: float | None) -> bool | None:
    """False where a measured term misses its objective; True where every stated term was measured and met;
    None where a stated term was not measured (and none missed)."""
    terms = [(workload.tpot_ms, tpot_ms), (workload.ttft_ms, ttft_ms)]
    stated = [(limit, got) for limit, got in terms if limit is not None]
    if any(got is not None and got > limit for limit, got in stated):
        return False
    return True if all(got is not None for _, got in stated) else None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class _MeasuredSteps:
    """A step model of one batch's measured steps (the ``StepModel`` of :func:`steady_state`)."""

    def __init__(self, decode_ms: float, decode_j: float, prefill_ms: float, prefill_j: float) -> None:
        self.decode, self.pre = (decode_ms, decode_j), (prefill_ms, prefill_j)

    def decode_step(self, plan: Plan, batch: int, context: float) -> tuple[float, float]:
        return self.decode

    def prefill(self, plan: Plan, length: int) -> tuple[float, float]:
        return self.pre


def from_steps(plan: Plan, workload: Workload, decode_ms: float, decode_j: float, prefill_ms: float,
               prefill_j: float, source: str) -> MeasuredPoint:
    """The point of measured step times at ``workload.batch_size``, composed into the steady state."""
    steps = _MeasuredSteps(decode_ms, decode_j, prefill_ms, prefill_j)
    state = steady_state(steps, plan, workload, workload.batch_size)
    return MeasuredPoint(plan.id, objective_name(workload), workload.batch_size, state.j_per_token,
                         state.tokens_per_s, state.tpot_ms, state.ttft_ms,
                         meets_as_measured(workload, state.tpot_ms, state.ttft_ms),
                         source + "; TPOT/TTFT: measured step times composed into the steady state", _now(),
                         decode_step_ms=decode_ms)


def from_timed(plan: Plan, workload: Workload, row: Mapping[str, Any], source: str) -> MeasuredPoint:
    """The point of an engine's row that times requests (``tpot_ms_p50``, ``ttft_ms_p90``, ...; any may be
    absent or None) at the workload's percentile."""
    q = workload.quantile
    tpot, ttft = row.get(f"tpot_ms_{q}"), row.get(f"ttft_ms_{q}")
    return MeasuredPoint(plan.id, objective_name(workload), workload.batch_size, row["j_per_token"],
                         row["tokens_per_s"], tpot, ttft, meets_as_measured(workload, tpot, ttft), source, _now(),
                         gpu_busy_pct=row.get("gpu_busy_pct"))


def from_estimate(plan: Plan, workload: Workload, est: EnergyEstimate) -> MeasuredPoint:
    """The point of an engine that gives J/token and tokens/s only: TPOT and TTFT unknown."""
    return MeasuredPoint(plan.id, objective_name(workload), workload.batch_size, est.j_per_token,
                         est.decode_tokens_per_s, None, None, meets_as_measured(workload, None, None),
                         est.source + "; TPOT/TTFT not timed by this engine", _now())

