"""Operating points: each plan's largest batch under a workload's latency objective, and its J/token there.

A served workload is a steady state, not a burst: B requests in flight, each decode step carrying its share
of new prefills. A request stays for ``L_out`` steps, so a step admits ``B / L_out`` new requests on average;
the number a given step admits is Poisson with that mean (arrivals independent of each other). Then

- a step takes ``decode(B) + k * prefill(L_in)`` (k prefills in it; prefills of one step cost k times one);
- a request's TPOT is the mean of its ``L_out`` steps, whose prefills add up to Poisson(B): TPOT at quantile
  q is ``decode + Poisson_q(B) / L_out * prefill``;
- a request's TTFT is the wait for the step in flight (uniform over one mean step: q of it at quantile q)
  plus the step that carries its own prefill and the others admitted with it: ``decode + (1 + Poisson_q(B /
  L_out)) * prefill``;
- J/token is ``decode_J / B + prefill_J / L_out`` and tokens/s is ``B / mean step``.

The batch is bounded by the objective, the service's ``max_concurrency`` and the KV cache: B requests at
their longest context must fit in :data:`KV_MEMORY_SHARE` of the GPU's memory beside the plan's weights.
The largest batch meeting the objective is found by a scan over a grid (powers of two and their midpoints up
to the bound, exact on the grid: a step time that is not monotone in the batch is seen there), then bisection
between the largest grid batch that meets it and the next grid batch (monotone between two grid points).

A serving engine with a step model of its own (:class:`EngineServed`: vLLM's, in the predicted tier when the plan is
served by vLLM) gives its own steady state and the batches it can be held at (vLLM: its CUDA-graph sizes): the
largest batch is then the largest of those that meets the objective, and the curve is over them. Where the engine's
step model states a ``tpot_margin`` (the share of the TPOT objective its prediction is known to err by), the batch
is the largest whose predicted TPOT meets the objective less that share, so that the batch it predicts meets the
objective as the engine serves it; where no batch meets it so, the objective itself decides.

Under a site power cap the GPU cannot draw more than the cap: a step whose predicted power (J / s) exceeds it
is stretched to ``J / cap`` seconds with its energy held (a lower clock saves some energy in practice, so
J/token under the cap is an upper bound and tokens/s a lower one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from scipy.stats import poisson

from advisor.formats import FORMAT_SPECS, KV_CACHE_BYTES, GPUSpec
from advisor.models.shape import ModelShape
from advisor.plan import Plan
from advisor.recipe.schema import Workload

KV_MEMORY_SHARE = 0.9  # of the GPU's memory for weights and KV cache (vLLM's gpu_memory_utilization default)
QUANTILE = {"p50": 0.5, "p90": 0.9}


class StepModel(Protocol):
    """What the predicted tiers give: (ms, J) of one decode step and of one request's prefill."""

    def decode_step(self, plan: Plan, batch: int, context: float) -> tuple[float, float]: ...

    def prefill(self, plan: Plan, length: int) -> tuple[float, float]: ...


@runtime_checkable
class EngineServed(Protocol):
    """A step model that knows how its engine serves: its own steady state, and the batches it can be held at."""

    def served_state(self, plan: Plan, workload: Workload, batch: int,
                     power_cap_w: float | None = None) -> SteadyState: ...

    def batch_grid(self, limit: int) -> list[int]: ...


@dataclass(frozen=True)
class SteadyState:
    """One plan serving one workload at ``batch`` requests in flight."""

    batch: int
    tpot_ms: float
    ttft_ms: float
    j_per_token: float
    tokens_per_s: float
    power_w: float
    busy_share: float | None = None  # of the time, the GPU busy (an engine's model that knows its host time)


@dataclass(frozen=True)
class OperatingPoint:
    """A plan's largest batch under a workload's objective (``meets`` False: not even batch 1 meets it; the
    numbers are then batch 1's). ``bound``: what stopped the batch (objective, memory, max_concurrency);
    ``curve``: (batch, TPOT ms, J/token) over the grid, for the time-energy frontier."""

    plan_id: str
    plan: str
    workload: str
    meets: bool
    bound: str
    state: SteadyState
    source: str
    power_cap_w: float | None = None
    curve: list[tuple[int, float, float]] = field(default_factory=list)
    tpot_margin: float = 0.0  # the share of the TPOT objective the batch was kept under (module docstring)

    @property
    def j_per_token(self) -> float:
        return self.state.j_per_token

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {**{k: v for k, v in data.items() if k != "state"}, **data["state"],
                "curve": [list(p) for p in self.curve]}


def within_cap(ms: float, joules: float, cap_w: float | None) -> tuple[float, float]:
    """(ms, J) of a step under a power cap: stretched to J / cap where it would draw more (energy held)."""
    if cap_w is None or ms <= 0 or joules / (ms / 1e3) <= cap_w:
        return ms, joules
    return joules / cap_w * 1e3, joules


def steady_state(model: StepModel, plan: Plan, workload: Workload, batch: int,
                 power_cap_w: float | None = None) -> SteadyState:
    """The steady state of ``workload`` at ``batch`` in flight (see the module's docstring); an engine's own where
    the model knows how its engine serves (:class:`EngineServed`)."""
    if isinstance(model, EngineServed):
        return model.served_state(plan, workload, batch, power_cap_w)
    lin, lout = workload.input_tokens, workload.output_tokens
    q = QUANTILE[workload.quantile]
    dec_ms, dec_j = within_cap(*model.decode_step(plan, batch, lin + lout / 2), power_cap_w)
    pre_ms, pre_j = within_cap(*model.prefill(plan, lin), power_cap_w)
    admitted = batch / lout
    mean_step_ms = dec_ms + admitted * pre_ms
    tpot = dec_ms + float(poisson.ppf(q, batch)) / lout * pre_ms
    ttft = q * mean_step_ms + dec_ms + (1 + float(poisson.ppf(q, admitted))) * pre_ms
    step_j = dec_j + admitted * pre_j
    return SteadyState(batch=batch, tpot_ms=tpot, ttft_ms=ttft, j_per_token=dec_j / batch + pre_j / lout,
                       tokens_per_s=batch / (mean_step_ms / 1e3), power_w=step_j / (mean_step_ms / 1e3))


def meets(state: SteadyState, workload: Workload, tpot_margin: float = 0.0) -> bool:
    """``state`` meets ``workload``'s objective (its TPOT, with ``tpot_margin``, that share of it to spare)."""
    return ((workload.tpot_ms is None or state.tpot_ms <= workload.tpot_ms * (1.0 - tpot_margin))
            and (workload.ttft_ms is None or state.ttft_ms <= workload.ttft_ms))


def weight_bytes(shape: ModelShape, plan: Plan) -> float:
    """Bytes of the plan's weights on the GPU (quantized groups in their format; the rest BF16)."""
    embeddings = 0 if shape.tied_embeddings else shape.vocab_size * shape.hidden_size
    rest = (shape.lm_head_weights + shape.router_weights + embeddings) * 2.0
    return rest + sum(g.num_weights * FORMAT_SPECS[plan.format_of(g.name)].weight_bytes_per_element
                      for g in shape.groups)


def kv_batch_limit(shape: ModelShape, plan: Plan, gpu: GPUSpec, workload: Workload) -> int:
    """The most requests whose KV cache (at their last token) fits beside the weights."""
    free = gpu.memory_gb * 1e9 * KV_MEMORY_SHARE - weight_bytes(shape, plan)
    per_request = shape.kv_bytes(workload.input_tokens + workload.output_tokens, KV_CACHE_BYTES[plan.kv_cache])
    return max(0, int(free // per_request)) if per_request > 0 else workload.concurrency_limit


def batch_grid(limit: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, ... (powers of two and their midpoints) up to ``limit``, and ``limit``."""
    grid: list[int] = []
    p = 1
    while p <= limit:
        for b in (p, p + p // 2):
            if b <= limit and (not grid or b > grid[-1]):
                grid.append(b)
        p *= 2
    return grid if grid and grid[-1] == limit else [*grid, limit]


def largest_meeting(ok: Callable[[int], bool], limit: int, engine_grid: Sequence[int] | None = None) -> int | None:
    """The largest batch <= ``limit`` that meets ``ok``: the largest on :func:`batch_grid` (however the
    others fare), then bisection up to the next grid batch. None where no grid batch meets it. With an
    ``engine_grid`` (the only batches the engine runs at their own cost), the largest of those that meets."""
    if limit < 1:
        return None
    grid = list(engine_grid) if engine_grid is not None else batch_grid(limit)
    passing = [b for b in grid if ok(b)]
    if not passing:
        return None
    lo = passing[-1]
    if engine_grid is not None:
        return lo
    hi = next((b for b in grid if b > lo), None)
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def operating_point(model: StepModel, shape: ModelShape, gpu: GPUSpec, plan: Plan, workload: Workload,
                    source: str, power_cap_w: float | None = None) -> OperatingPoint:
    """``plan``'s largest batch under ``workload``'s objective (see the module's docstring)."""
    memory = kv_batch_limit(shape, plan, gpu, workload)
    limit = min(memory, workload.concurrency_limit)
    states: dict[int, SteadyState] = {}

    def at(b: int) -> SteadyState:
        if b not in states:
            states[b] = steady_state(model, plan, workload, b, power_cap_w)
        return states[b]

    engine_grid = model.batch_grid(max(limit, 1)) if isinstance(model, EngineServed) else None
    margin = float(getattr(model, "tpot_margin", 0.0)) if engine_grid is not None and workload.tpot_ms else 0.0
    best = largest_meeting(lambda b: meets(at(b), workload, margin), limit, engine_grid) if margin else None
    if best is None:
        margin = 0.0
        best = largest_meeting(lambda b: meets(at(b), workload), limit, engine_grid)
    curve = [(b, at(b).tpot_ms, at(b).j_per_token) for b in engine_grid or batch_grid(max(limit, 1))]
    if best is None:
        bound = "memory" if memory < 1 else "objective"
        return OperatingPoint(plan.id, plan.label(), workload.name, False, bound, at(1), source, power_cap_w, curve)
    bound = "objective" if best < limit else ("memory" if memory < workload.concurrency_limit else "max_concurrency")
    return OperatingPoint(plan.id, plan.label(), workload.name, True, bound, at(best), source, power_cap_w, curve,
                          margin)


def operating_points(model: StepModel, shape: ModelShape, gpu: GPUSpec, plans: Sequence[Plan],
                     workloads: Sequence[Workload], source_of: Callable[[Plan], str],
                     power_cap_w: float | None = None) -> list[OperatingPoint]:
    """Every plan's operating point on every workload that states an objective."""
    return [operating_point(model, shape, gpu, p, w, source_of(p), power_cap_w)
            for w in workloads if w.has_objective for p in plans]
