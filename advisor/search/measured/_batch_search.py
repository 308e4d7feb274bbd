"""The largest batch that meets a latency objective AS MEASURED: where the measured tier meters a plan at its
predicted operating batch and that point misses the objective, smaller batches are metered until the largest
one that meets is found, or the metering budget is spent. Where it meets and the search may step up
(``step_up_to``: ``advisor verify``), a larger batch is metered too, aimed :data:`MARGIN` under the objective from
the predicted curve scaled by the measured headroom, so that the batch compared is the largest that met, not
only the predicted one; no step is taken where that aim does not reach the next batch the engine runs
differently.

Every metered batch splits the batches: those known to meet and those known to miss. The search keeps the
largest batch known to meet (``lo``, 0 when none: batch 1 is the floor) and the smallest known miss above it
(``hi``) and meters one batch between them per round:

* with no batch known to meet yet, it aims :data:`MARGIN` under the objective, so that the meter's own spread
  does not turn the step down into another miss: the secant through the two misses metered last where there
  are two, else the predicted step-time curve scaled by how far the miss overshot (its measured term over the
  objective's): the largest batch whose predicted TPOT is the predicted TPOT at ``hi`` over that excess (without
  a curve: ``hi`` over the excess);
* with both ends known, the line through their excesses (regula falsi: noise between two close batches cannot
  throw it), aimed at the objective itself (where the excess grows from ``lo`` to ``hi``; else the midpoint, as
  bisection does); a line pointing at or below ``lo`` meters the batch just above it.

Where the engine runs only some batches differently (``grid``: vLLM pads a decode batch to its next CUDA-graph
size, so batches 225-232 cost one step and 232 serves the most), every batch metered after the predicted one
is the largest of the grid at or below the guess. It stops when no grid batch lies between ``lo`` and ``hi``
(without a grid: when ``hi`` is within :data:`RESOLUTION` of ``lo``; closer than that, the meter's spread and
not the batch decides), when batch 1 misses (no batch meets), when an engine does not time the objective's
terms (nothing to judge), once :data:`BRACKET_AFTER` of its own meterings hold a batch that meets and one that misses
(the first two aim close enough that the meter's spread, not the batch, decides what lies between: a third is
metered only where the first two do not bracket the objective), or after :data:`EXTRA_METERINGS` meterings
beyond the predicted batch (the budget; the best batch found is kept and the report says the search stopped).
A step time that is not monotone in the batch can make a batch above ``lo`` meet too; the search answers with the
largest batch it metered that meets, never one it did not meter.

Points of the same load (input and output lengths, percentile) metered in the same engine for another objective or
for a stated workload (``shared``: an FP8 8B's stated batches 16 and 64 beside its operating batches 80, 136 and
240) bound the search too: once its own batch misses, the largest of them that meets is ``lo`` and a smaller miss is
``hi``, so the step down is a line between two measured points rather than the predicted curve scaled, and one of
them may be the answer; a step up never meters a batch that one of them shows missing.

A miss the host held back (:meth:`~advisor.search.operating.MeasuredPoint.held_back_beside`: the GPU under 90% busy,
10% fewer tokens/s than a smaller batch of the same load served in the same engine) is no evidence about the batch: the
search meters that batch once more, under a name of its own (:func:`~advisor.search.operating.at_batch`'s ``again``),
before it goes on, and judges it by the later metering. The repeat is not counted against the budget; a batch is
metered at most twice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from advisor.plan import Plan
from advisor.recipe.schema import Workload
from advisor.search.measured._contract import MeasuredTier
from advisor.search.operating import MeasuredPoint, at_batch

EXTRA_METERINGS = 2  # meterings per plan and objective beyond the predicted batch: each is a steady-state window
BRACKET_AFTER = 2  # meterings after which a batch that meets and one that misses end the search (0: never)
# vLLM's TPOT p50 at one batch repeats within about 1-2% between steady windows, and batches 225-228 of one plan
# measured 20.04-20.1 ms against a 20 ms objective (reports/benchmarks/operating_points_8b.md): aiming at the
# objective itself turns the step down into a coin toss, and bracketing closer than this buys nothing. The step
# down aims half that under it: the second metering usually ends the search (BRACKET_AFTER), so it aims as close
# as the spread allows.
MARGIN = 0.01
RESOLUTION = 0.02
# how far above its predicted batch a step up may go: the step model's TPOT was within 7% of vLLM's at the
# predicted batch on an H200 (reports/benchmarks/verify_time.md, round 2), a batch or two grid sizes further at most
STEP_UP_LIMIT = 1.25


def step_up_ceiling(predicted_batch: int) -> int:
    """The largest batch a step up from ``predicted_batch`` may meter (the engine is sized and its graphs captured
    up to it)."""
    return max(predicted_batch + 1, math.ceil(predicted_batch * STEP_UP_LIMIT))


def excess(workload: Workload, point: MeasuredPoint) -> float | None:
    """The worst measured term over its objective (<= 1: meets); None where a stated term was not timed."""
    terms = [(workload.tpot_ms, point.tpot_ms), (workload.ttft_ms, point.ttft_ms)]
    stated = [(limit, got) for limit, got in terms if limit is not None]
    if not stated or any(got is None for _, got in stated):
        return None
    return max(got / limit for limit, got in stated)  # type: ignore[operator]


def curve_batch(curve: Sequence[Sequence[float]], tpot_ms: float) -> float | None:
    """The batch at which the predicted curve ((batch, TPOT ms, J/token) over the grid) reaches ``tpot_ms``,
    linear between grid points; None where even its first point is above it."""
    pts = [(float(b), float(t)) for b, t, *_ in curve]
    if not pts or pts[0][1] > tpot_ms:
        return None
    for (b0, t0), (b1, t1) in zip(pts, pts[1:], strict=False):
        if t1 > tpot_ms:
            return b0 + (b1 - b0) * (tpot_ms - t0) / (t1 - t0) if t1 > t0 else b0
    return pts[-1][0]


def curve_tpot(curve: Sequence[Sequence[float]], batch: int) -> float | None:
    """The predicted TPOT at ``batch``, linear between grid points (None outside the curve)."""
    pts = [(float(b), float(t)) for b, t, *_ in curve]
    for (b0, t0), (b1, t1) in zip(pts, pts[1:], strict=False):
        if b0 <= batch <= b1:
            return t0 + (t1 - t0) * (batch - b0) / (b1 - b0) if b1 > b0 else t0
    return pts[0][1] if len(pts) == 1 and pts[0][0] == batch else None


@dataclass
class BatchSearch:
    """One plan's search on one objective (module docstring). ``trail``: every metered point, in order."""

    workload: Workload  # the objective, as the recipe states it
    predicted_batch: int
    curve: Sequence[Sequence[float]] = ()
    budget: int = EXTRA_METERINGS
    predicted: dict[str, Any] = field(default_factory=dict)  # the predicted point (its j_per_token, tpot_ms, ...)
    trail: list[MeasuredPoint] = field(default_factory=list)
    grid: Sequence[int] = ()  # the batches the engine runs differently (module docstring); () for every batch
    bracket_after: int = BRACKET_AFTER
    step_up_to: int = 0  # where the predicted batch meets, meter larger batches up to this one (0: never)
    shared: list[MeasuredPoint] = field(default_factory=list)  # the same load, metered for others (docstring)

    def first(self) -> Workload:
        return at_batch(self.workload, self.predicted_batch)

    def add(self, point: MeasuredPoint) -> None:
        self.trail.append(point)

    def same_load(self, other: Workload) -> bool:
        """``other`` runs the load this search's batches run (its points' TPOT and TTFT compare with them)."""
        mine = self.workload
        return (other.input_tokens, other.output_tokens, other.quantile) == (mine.input_tokens, mine.output_tokens,
                                                                            mine.quantile)

    def _judged(self, shared: bool = True) -> dict[int, float] | None:
        """Batch -> excess over the objective: the search's own points (None where one was not timed), then, with
        ``shared``, the same load's other points at batches it did not meter."""
        out = {}
        for p in self.trail:
            e = excess(self.workload, p)
            if e is None:
                return None
            out[p.batch] = e
        for p in self.shared if shared else ():
            e = excess(self.workload, p)
            if e is not None:
                out.setdefault(p.batch, e)
        return out

    def _ends(self, judged: dict[int, float]) -> tuple[int, int | None]:
        lo = max((b for b, e in judged.items() if e <= 1.0), default=0)
        hi = min((b for b, e in judged.items() if e > 1.0 and b > lo), default=None)
        return lo, hi

    def next_batch(self) -> int | None:
        """The next batch to meter, or None when the search is over."""
        own, judged = self._judged(shared=False), self._judged()
        if own and self._held_back_miss():
            return self.trail[-1].batch
        if not own or not judged or self._extra() >= self.budget:
            return None
        own_lo, hi = self._ends(own)
        if hi is None:  # every batch it metered met: a step up, below any batch the same load missed at
            missed = min((b for b, e in judged.items() if e > 1.0 and b > own_lo), default=None)
            return self._step_up(own_lo, own[own_lo], below=missed) if own_lo else None
        lo, hi = self._ends(judged)
        if hi is None or self._bracketed(lo, hi) or self._bracketed_enough(own_lo, hi):
            return None
        aim = 1.0 if lo else 1.0 - MARGIN
        last = [p.batch for p in self.trail[-2:]]
        guess = self._secant(judged, [lo, hi] if lo else last, aim)
        if guess is None or guess >= hi:  # one batch metered, or the excess not monotone there
            guess = self._scaled(hi, judged[hi] / aim) if lo == 0 else (lo + hi) / 2
        elif lo == 0:  # two misses: a line through two nearly equal excesses points far too low (an FP8 8B missed
            # 12 ms at 162 and 128 by a hair and the line pointed at 32): one step at most halves the batch
            guess = max(guess, hi / 2)
        batch = min(max(int(math.floor(guess)), lo + 1), hi - 1)
        between = [b for b in self.grid if lo < b < hi]
        return max((b for b in between if b <= batch), default=min(between)) if between else batch

    def times_metered(self, batch: int) -> int:
        """How often this search metered ``batch`` (twice: a held-back miss metered again, module docstring)."""
        return sum(p.batch == batch for p in self.trail)

    def _extra(self) -> int:
        """The batches metered beyond the predicted one (a batch metered again counts once)."""
        return len({p.batch for p in self.trail}) - 1

    def _held_back_miss(self) -> bool:
        """The last metering missed, the host held it back (module docstring), and its batch was metered once."""
        last = self.trail[-1]
        over = excess(self.workload, last)
        return (over is not None and over > 1.0 and self.times_metered(last.batch) == 1
                and last.held_back_beside([*self.trail, *self.shared]))

    def _step_up(self, lo: int, over: float, below: int | None = None) -> int | None:
        """The batch above ``lo`` (which met, ``over`` its excess) to meter next: the largest the engine runs
        differently at or under the aim (module docstring), at most ``step_up_to`` and under ``below``; None where
        none lies above ``lo``."""
        if not self.step_up_to or lo >= self.step_up_to:
            return None
        guess = min(self._scaled(lo, over / (1.0 - MARGIN)), float(self.step_up_to))
        above = [b for b in (self.grid or range(lo + 1, self.step_up_to + 1)) if lo < b <= guess
                 and (below is None or b < below)]
        return max(above) if above else None

    def _bracketed_enough(self, own_lo: int, hi: int | None) -> bool:
        """``bracket_after`` meterings of its own hold a batch that meets (``own_lo``) and one that misses: a batch
        that met for another objective (``shared``) far below its own misses is no bracket to stop at (a Qwen3-4B's
        12 ms search missed at 144 and 136 and stopped at 80, tpot8's batch: verify_time.md, 4B round 9)."""
        return bool(self.bracket_after) and self._extra() + 1 >= self.bracket_after and own_lo > 0 and hi is not None

    def _bracketed(self, lo: int, hi: int) -> bool:
        if self.grid:
            return not any(lo < b < hi for b in self.grid)
        return hi - lo <= max(1, math.floor(RESOLUTION * hi))

    @staticmethod
    def _secant(judged: dict[int, float], batches: Sequence[int], aim: float) -> float | None:
        """Where the line through the excesses of two metered ``batches`` reaches ``aim`` (None: fewer than two,
        or the excess does not grow with the batch between them)."""
        if len(batches) < 2:
            return None
        (b1, e1), (b2, e2) = ((b, judged[b]) for b in batches[-2:])
        if b1 == b2 or (e2 - e1) / (b2 - b1) <= 0:
            return None
        return b2 + (aim - e2) * (b2 - b1) / (e2 - e1)

    def _scaled(self, hi: int, over: float) -> float:
        predicted = curve_tpot(self.curve, hi) if self.curve else None
        if predicted is not None:
            found = curve_batch(self.curve, predicted / over)
            return 1.0 if found is None else found
        return hi / over

    def outcome(self) -> dict[str, Any]:
        """The measured operating point (the largest batch metered that meets; where none met, the smallest
        metered) with the predicted batch, the trail and what the search concluded, in words."""
        judged = self._judged()
        first = self.trail[0]
        trail = [{"batch": p.batch, "tpot_ms": p.tpot_ms, "ttft_ms": p.ttft_ms, "j_per_token": p.j_per_token,
                  "tokens_per_s": p.tokens_per_s, "meets": p.meets, "gpu_busy_pct": p.gpu_busy_pct}
                 for p in self.trail]
        extra = self._extra()
        if judged is None:
            return self._record(first, trail, "the engine does not time the objective's terms: not searched")
        lo, hi = self._ends(judged)
        record = self._outcome_at(lo, hi, extra, trail)
        if lo and not any(p.batch == lo for p in self.trail):  # the answer is the same load metered for another
            record["search"] += f" (batch {lo} metered for '{self._at(lo).workload}' in the same engine)"
        for p in self._metered_again():
            busy = f"GPU {p.gpu_busy_pct:.0f}% busy, " if p.gpu_busy_pct is not None else ""
            record["search"] += (f"; batch {p.batch} metered again: the host held its first metering back ({busy}"
                                 f"{p.tokens_per_s:.0f} tokens/s)")
        return record

    def _metered_again(self) -> list[MeasuredPoint]:
        """The first metering of each batch metered twice (a held-back miss, module docstring)."""
        batches = [p.batch for p in self.trail]
        return [p for i, p in enumerate(self.trail) if p.batch in batches[i + 1:]]

    def _outcome_at(self, lo: int, hi: int | None, extra: int, trail: list[dict[str, Any]]) -> dict[str, Any]:
        """The outcome's record (:meth:`outcome`) for the largest batch known to meet ``lo`` and the smallest miss
        above it ``hi``."""
        if lo == self.predicted_batch and extra == 0:
            words = f"meets at the predicted batch {lo}"
            if self.step_up_to and self.step_up_to <= lo:  # the engine is sized for no larger batch
                words += (f" ({self._terms(self._at(lo))}); no larger batch was tried: the engine is sized for this "
                          "one, the plan's largest operating batch, so the largest that meets may be larger")
            return self._record(self._at(lo), trail, words)
        if lo >= self.predicted_batch and hi is None:
            return self._record(self._at(lo), trail, f"batch {lo} meets as measured (predicted "
                                f"{self.predicted_batch}); no larger batch was metered ({extra} extra meterings)")
        if lo == 0:
            smallest = min(self.trail, key=lambda p: p.batch)
            got = f"batch {smallest.batch} gives {self._terms(smallest)}"
            if smallest.batch == 1:
                return self._record(smallest, trail, f"no batch meets {self._objective()} as measured: {got}")
            return self._record(smallest, trail, f"search stopped after {extra} extra meterings (the budget): no "
                                f"metered batch meets {self._objective()}; {got}")
        if hi is not None and not self._bracketed(lo, hi) and self._bracketed_enough(lo, hi) \
                and extra < self.budget:
            return self._record(self._at(lo), trail, f"batch {lo} meets as measured and {hi} misses (predicted "
                                f"{self.predicted_batch}; bracketed in {len(self.trail)} meterings)")
        if hi is not None and not self._bracketed(lo, hi):
            return self._record(self._at(lo), trail, f"search stopped after {extra} extra meterings (the budget): "
                                f"batch {lo} meets, {hi} misses; the largest batch that meets lies between")
        if hi is not None and hi - lo > 1:
            apart = ("no batch between them runs differently (the engine pads a batch to its next CUDA-graph "
                     "size)" if self.grid else f"within {RESOLUTION:.0%} of each other")
            return self._record(self._at(lo), trail, f"batch {lo} meets as measured and {hi} misses, {apart} "
                                f"(predicted {self.predicted_batch}; {extra} extra meterings)")
        return self._record(self._at(lo), trail, f"batch {lo} is the largest that meets as measured ({hi} misses; "
                            f"predicted {self.predicted_batch}; {extra} extra meterings)")

    def _at(self, batch: int) -> MeasuredPoint:
        return next(p for p in [*reversed(self.trail), *reversed(self.shared)] if p.batch == batch)

    def _objective(self) -> str:
        w = self.workload
        parts = [f"TPOT {w.tpot_ms:g} ms" if w.tpot_ms is not None else "",
                 f"TTFT {w.ttft_ms:g} ms" if w.ttft_ms is not None else ""]
        return " and ".join(p for p in parts if p) + f" ({w.quantile})"

    def _terms(self, p: MeasuredPoint) -> str:
        parts = [f"TPOT {p.tpot_ms:.4g} ms" if self.workload.tpot_ms is not None else "",
                 f"TTFT {p.ttft_ms:.4g} ms" if self.workload.ttft_ms is not None else ""]
        return ", ".join(x for x in parts if x)

    def _record(self, point: MeasuredPoint, trail: list[dict[str, Any]], words: str) -> dict[str, Any]:
        if point not in self.trail:  # the same load metered for another: judged against this objective
            over = excess(self.workload, point)
            point = replace(point, workload=self.workload.name, meets=None if over is None else over <= 1.0)
        return {**point.to_dict(), "predicted_batch": self.predicted_batch, "trail": trail, "search": words,
                "prediction_error_pct": self._errors()}

    def _errors(self) -> dict[str, float] | None:
        """(predicted - measured) / measured in % at the predicted batch, per number both give."""
        first = self.trail[0]
        pairs = {k: (self.predicted.get(k), getattr(first, k)) for k in ("j_per_token", "tpot_ms", "ttft_ms",
                                                                        "tokens_per_s")}
        out = {k: 100.0 * (p - m) / m for k, (p, m) in pairs.items() if p is not None and m}
        return out or None


def went_past_prediction(outcome: Mapping[str, Any]) -> bool:
    """Whether a search's outcome record (:meth:`BatchSearch.outcome`) rests on more than its predicted batch's first
    metering: batches served around it, or a batch of the same load served for another workload."""
    trail = outcome.get("trail") or []
    return len(trail) > 1 or bool(trail) and outcome.get("batch") != trail[0].get("batch")


def searches_from_points(points: Sequence[Mapping[str, Any]], workloads: Mapping[str, Workload]
                         ) -> list[BatchSearch]:
    """One search per stored predicted operating point (``operating_points`` of the study) whose workload is
    stated, from its predicted batch over its predicted curve."""
    return [BatchSearch(workloads[p["workload"]], p["batch"], p.get("curve") or (), predicted=dict(p))
            for p in points if p["workload"] in workloads]


def search_batches(model: MeasuredTier, plan: Plan, searches: Sequence[BatchSearch],
                   alongside: Sequence[Workload] = ()) -> list[dict[str, Any]]:
    """Each search run to its end for ``plan``, all objectives' rounds together (``model.measure_rounds``: in one
    engine where the tier keeps one, vLLM, else round by round); their :meth:`BatchSearch.outcome`, in order.
    ``alongside``: the plan's stated workloads, served in the first round beside the searches' predicted batches
    (an engine that already served them reads them back); every point is shared with the searches of the same load
    (module docstring)."""
    grid = tuple(model.batch_grid)
    for s in searches:
        s.grid = s.grid or grid
    stated = [w for w in alongside if any(s.same_load(w) for s in searches)]
    asked: list[tuple[BatchSearch | None, Workload]] = [*((s, s.first()) for s in searches),
                                                        *((None, w) for w in stated)]

    def next_round(points: list[MeasuredPoint]) -> list[Workload]:
        for (owner, w), p in zip(asked, points, strict=True):
            if owner is not None:
                owner.add(p)
            for s in searches:
                if s is not owner and s.same_load(w):
                    s.shared.append(p)
        asked[:] = [(s, at_batch(s.workload, b, again=s.times_metered(b) > 0)) for s in searches
                    if (b := s.next_batch()) is not None]
        return [w for _, w in asked]

    model.measure_rounds(plan, [w for _, w in asked], next_round,
                         max(max(s.predicted_batch, s.step_up_to) for s in searches))
    return [s.outcome() for s in searches]
