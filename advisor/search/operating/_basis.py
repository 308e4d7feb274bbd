"""Which operating points the recommendation compares under a latency objective: measured or predicted.

Where every plan the rule compares (the feasible plans of one energy tier, :func:`advisor.search.frontier.one_tier`)
was measured at its operating point, with the objective judged as measured, the rule compares the measured points:
each plan at the largest batch that met the objective as measured (:mod:`advisor.search.measured._batch_search`). Where
only some were, a measured number is never set against a predicted one: the rule compares the predicted points,
and the basis says so and names what the measured ones found (a plan the prediction says meets at batch 100 may
meet only at 60 as measured, or not at all).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BasisPoint:
    """A plan's operating point as the rule reads it (:class:`advisor.search.frontier.PointLike`)."""

    meets: bool
    j_per_token: float
    batch: int


@dataclass(frozen=True)
class Basis:
    """What one objective's recommendation compared: ``measured`` points (labelled with their engine, GPU and
    date) or predicted ones, and, for a mixed set, what the measured points found."""

    measured: bool
    label: str
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"measured": self.measured, "label": self.label, "note": self.note}


def _usable(m: Any) -> bool:
    return m is not None and not m.not_measured and m.meets is not None and m.j_per_token is not None


def _found(p: Any) -> str:
    m = p.measured
    if m.meets:
        return f"{p.plan} meets at batch {m.batch} (predicted {p.batch})"
    return f"{p.plan} meets at no batch metered ({m.search or f'batch {m.batch} misses'})"


def operating_basis(points: Iterable[Any], compared: set[str]
                    ) -> tuple[dict[tuple[str, str], Any], dict[str, Basis]]:
    """((plan id, workload) -> the point the rule reads, workload -> its basis) for the stored operating points
    (``OperatingPointRecord``s, their ``measured`` twin where there is one); ``compared``: the plan ids the rule
    compares."""
    points = list(points)
    chosen: dict[tuple[str, str], Any] = {(p.plan_id, p.workload): p for p in points}
    bases: dict[str, Basis] = {}
    for w in dict.fromkeys(p.workload for p in points):
        here = [p for p in points if p.workload == w and p.plan_id in compared]
        usable = [p for p in here if _usable(p.measured)]
        if here and len(usable) == len(here):
            for p in here:
                chosen[(p.plan_id, w)] = BasisPoint(bool(p.measured.meets), p.measured.j_per_token, p.measured.batch)
            bases[w] = Basis(True, "; ".join(sorted({p.measured.source for p in here})))
            continue
        note = ""
        if usable:
            note = (f"only {len(usable)} of the {len(here)} plans compared were measured at their operating points, "
                    "so the choice is made on the predicted points (measured and predicted numbers are never "
                    "compared); as measured: " + "; ".join(_found(p) for p in usable))
        bases[w] = Basis(False, "predicted", note)
    return chosen, bases


def basis_words(bases: Mapping[str, Basis], workload: str) -> str:
    """How the recommendation's reason names the points it compared."""
    b = bases.get(workload)
    if b is None:
        return ""
    return f" ({b.label})" if b.measured else " (predicted)"
