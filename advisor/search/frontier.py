"""Pareto front, hypervolume and the recommendation rule. Pure Python, no torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from advisor.formats import Format
from advisor.plan import Plan
from advisor.search.acceptance import PlanAcceptance, Verdict


@dataclass(frozen=True)
class Candidate:
    """One evaluated plan: proxy damage, energy per workload, and optional benchmark results.

    ``feasible``: within the proxy budget and, once lm-eval judged it, accepted on every task.
    """

    trial: int
    plan: Plan
    kl: float
    ppl: float
    energy_j_per_token: dict[str, float]  # workload name -> J/token
    feasible: bool
    benchmark: dict[str, float] = field(default_factory=dict)  # task -> primary metric
    acceptance: PlanAcceptance | None = None  # against BF16; None: not judged (or the reference)
    proxy_feasible: bool | None = None  # within the proxy budget (None: same as feasible)
    energy_measured: bool = False  # energy_j_per_token measured on the GPU (else predicted)
    predicted_j_per_token: dict[str, float] = field(default_factory=dict)  # the trial's prediction (kept once measured)

    def __post_init__(self) -> None:
        if self.proxy_feasible is None:
            object.__setattr__(self, "proxy_feasible", self.feasible)
        if not self.predicted_j_per_token and not self.energy_measured:
            object.__setattr__(self, "predicted_j_per_token", dict(self.energy_j_per_token))

    def energy(self, workload: str) -> float:
        return self.energy_j_per_token[workload]

    @property
    def verdict(self) -> Verdict | None:
        return self.acceptance.verdict if self.acceptance is not None else None


def predicted_tier(cands: Sequence[Candidate]) -> list[Candidate]:
    """Every candidate with its predicted J/token: what the measured tier chooses its plans by, so that a resumed
    search, where some plans are measured already, chooses the same plans as one straight through."""
    return [c if not c.energy_measured else replace(c, energy_j_per_token=dict(c.predicted_j_per_token),
                                                       energy_measured=False) for c in cands]


def one_tier(cands: Sequence[Candidate]) -> list[Candidate]:
    """The candidates whose J/token may be compared: the measured ones where any plan was measured, else all
    (predicted). Measured and predicted J/token are never compared."""
    if any(c.energy_measured for c in cands):
        return [c for c in cands if c.energy_measured]
    return list(cands)


def _dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[0] and a[1] <= b[1] and (a[0] < b[0] or a[1] < b[1])


def pareto_front(cands: Sequence[Candidate], workload: str, feasible_only: bool = True) -> list[Candidate]:
    """Non-dominated candidates on (KL, J/token), both minimized; one per distinct plan, by energy."""
    pool = [c for c in cands if c.feasible or not feasible_only]
    unique: dict[str, Candidate] = {}
    for c in pool:
        unique.setdefault(c.plan.id, c)
    pts = list(unique.values())
    front = [
        c for c in pts
        if not any(_dominates((o.kl, o.energy(workload)), (c.kl, c.energy(workload))) for o in pts if o is not c)
    ]
    return sorted(front, key=lambda c: c.energy(workload))


def hypervolume(points: Sequence[tuple[float, float]], reference: tuple[float, float]) -> float:
    """2-D hypervolume (both objectives minimized) dominated by ``points`` up to ``reference``."""
    pts = sorted({p for p in points if p[0] < reference[0] and p[1] < reference[1]})
    hv, best_y = 0.0, reference[1]
    for x, y in pts:
        if y < best_y:
            hv += (reference[0] - x) * (best_y - y)
            best_y = y
    return hv


def percent_less(cost: float, base: float) -> str:
    """How much less ``cost`` is than ``base``, as the recommendation's reason and the report's decision both say
    it (one rounding, so the two never quote different savings for one comparison)."""
    return f"{100 * (1 - cost / base):.1f}%"


@dataclass(frozen=True)
class Recommendation:
    candidate: Candidate
    reason: str
    accuracy_metric: str


class PointLike(Protocol):
    """An operating point as the rule reads it (:class:`advisor.search.operating.OperatingPoint`)."""

    meets: bool

    @property
    def j_per_token(self) -> float: ...


def recommend(
    cands: Sequence[Candidate], workloads: Sequence[str], bf16_plan_id: str | None = None,
    benchmark_rule: str = "upper confidence bound of the paired drop within max_drop on every task",
    operating: Mapping[tuple[str, str], PointLike] | None = None,
    basis: Mapping[str, str] | None = None,
) -> Recommendation | None:
    """Lowest J/token on the primary workload among feasible plans that cost no more than
    all-BF16 on any workload. Once lm-eval has judged plans, only plans that pass on every
    task are eligible (BF16, the reference, always is); measured energy, where present,
    replaces the predicted (only measured plans then compete).

    ``operating`` ((plan id, workload) -> operating point) holds the workloads that state a latency
    objective: there a plan is priced at its own largest batch under the objective, must meet it, and
    must cost no more than BF16 at BF16's own largest batch (where BF16 meets it at all). ``basis`` (workload ->
    words) says whether those points are measured or predicted (:mod:`advisor.search.operating._basis`)."""
    if not cands:
        return None
    primary = workloads[0]
    operating = operating or {}
    objective_ws = {w for _, w in operating}
    cands = one_tier(cands)
    bf16 = next((c for c in cands if c.plan.uniform_format() == Format.BF16), None)
    if bf16_plan_id is not None:
        bf16 = next((c for c in cands if c.plan.id == bf16_plan_id), bf16)
    judged = any(c.acceptance is not None for c in cands)
    metric = f"lm-eval vs BF16: {benchmark_rule}" if judged else "proxy KL vs BF16"

    def met(c: Candidate, w: str) -> bool:
        return w not in objective_ws or ((p := operating.get((c.plan.id, w))) is not None and p.meets)

    def cost(c: Candidate, w: str) -> float:
        return operating[(c.plan.id, w)].j_per_token if w in objective_ws else c.energy(w)

    def ok(c: Candidate) -> bool:
        if not c.feasible or not all(met(c, w) for w in workloads):
            return False
        is_reference = bf16 is not None and c.plan.id == bf16.plan.id
        if judged and not is_reference and c.verdict is not Verdict.PASSES:
            return False
        return bf16 is None or all(cost(c, w) <= cost(bf16, w) for w in workloads if met(bf16, w))

    pool = [c for c in cands if ok(c)]
    if not pool:
        if bf16 is None:
            return None
        unmet = [w for w in workloads if not any(met(c, w) for c in cands if c.feasible)]
        if unmet:
            return Recommendation(bf16, f"no plan meets the latency objective of {', '.join(map(repr, unmet))}; "
                                  "keep BF16 (relax the objective or raise max_concurrency)", metric)
        return Recommendation(bf16, "no plan met the accuracy budget without costing more energy; keep BF16", metric)
    best = min(pool, key=lambda c: (cost(c, primary), c.kl))
    undecided = {c.plan.id for c in cands if c.verdict is Verdict.UNDECIDED and c.proxy_feasible
                 and met(c, primary) and cost(c, primary) < cost(best, primary)}
    if bf16 is not None and best.plan.id == bf16.plan.id and undecided:
        return Recommendation(best, f"keep BF16: {len(undecided)} cheaper plan(s) judged by lm-eval stayed undecided "
                              "on the items allowed (raise benchmark.limit to decide them)", metric)
    saving = ""
    if bf16 is not None and met(bf16, primary) and cost(bf16, primary) > 0:
        saving = f", {percent_less(cost(best, primary), cost(bf16, primary))} less energy than all-BF16"
    where = (" at its largest batch under the objective" + (basis or {}).get(primary, "") + ","
             if primary in objective_ws else "")
    return Recommendation(
        best, f"lowest J/token on '{primary}'{where} within the accuracy budget ({metric}){saving}", metric
    )
