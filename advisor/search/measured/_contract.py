"""What a measured energy tier is: one abstract class every engine's tier derives from (as Optuna's samplers derive
from ``BaseSampler``), declaring every member the search, its workers, `advisor measure`, `advisor verify` and
`advisor recheck` call. Nothing is looked up at run time: what an engine cannot do, it says through a declared
member (:attr:`MeasuredTier.searches_in_serving`, an empty :attr:`MeasuredTier.batch_grid`, the default
:meth:`MeasuredTier.measure_points` that times nothing), and the defaults here are what such an engine gets.

``advisor/testing_engines.py`` is the contract's test suite; ``tests/test_engine_contract.py`` runs it over every
engine of :data:`advisor.engines.ENGINE_TABLE`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext

from advisor.errors import UnsupportedError
from advisor.estimate import EnergyEstimate
from advisor.plan import Plan
from advisor.recipe.schema import Workload
from advisor.search.operating import MeasuredPoint, from_estimate

#: the measured batch search's next round from the points of the one before (empty: done)
NextRound = Callable[[list[MeasuredPoint]], list[Workload]]


class MeasuredTier(abc.ABC):
    """A plan's energy as metered on the GPU here (an :class:`~advisor.estimate.EnergyModel` whose numbers are
    measured).

    ``label`` names the method, engine and GPU (``measured (...)``); every estimate's source starts with it.
    ``gpu_uuid`` / ``gpu_name`` name the unit its measurements belong to (None: the label does); ``gpus``: the GPUs
    one serving spreads over; ``batch_grid``: the only batches it runs differently (empty: every batch).
    """

    measured: bool = True
    label: str
    gpu_uuid: str | None = None
    gpu_name: str | None = None
    gpus: int = 1
    #: True: :meth:`open_for` opens a plan's serving with its operating searches' first round beside the stated
    #: workloads, so the searches run in the engine that meters the plan (one engine start a plan)
    searches_in_serving: bool = False
    #: True: each stated workload's prefill is also metered as a load of its own (J per input token, kept apart);
    #: a caller that reads J/token only sets it False (a tier whose J/token is built from its prefill metering
    #: meters it anyway)
    prefill_apart: bool = True

    @property
    def batch_grid(self) -> tuple[int, ...]:
        """The batches the measured batch search meters (an engine that pads a batch to its next CUDA-graph size
        runs only those); empty: any batch."""
        return ()

    @abc.abstractmethod
    def estimate(self, plan: Plan, workload: Workload) -> EnergyEstimate:
        """``plan`` metered on ``workload`` (its batch, lengths): J/token with the prefill included, measured."""

    def measure_points(self, plan: Plan, workloads: Sequence[Workload]) -> list[MeasuredPoint]:
        """``plan`` metered at each of ``workloads`` (operating batches, :func:`~advisor.search.operating._measured.
        at_batch`), one point each, in order. This default times nothing: TPOT and TTFT unknown, and said so."""
        return [from_estimate(plan, w, self.estimate(plan, w)) for w in workloads]

    def measure_rounds(self, plan: Plan, first: Sequence[Workload], next_round: NextRound, max_batch: int
                       ) -> list[MeasuredPoint]:
        """``first`` metered, then each round ``next_round`` asks for (given the round before's points) until it
        asks for none; every round's points, in order. ``max_batch``: the largest batch any round asks for (what an
        engine that keeps one serving for all rounds is sized for). This default meters round by round."""
        out: list[MeasuredPoint] = []
        todo = list(first)
        while todo:
            got = self.measure_points(plan, todo)
            out += got
            todo = next_round(got)
        return out

    def open_for(self, plan: Plan, operating: Sequence[Workload]) -> None:
        """Open ``plan``'s serving of the stated workloads with ``operating`` (its searches' first round) beside
        them, for :meth:`measure_rounds` and :meth:`estimate` to read; only where :attr:`searches_in_serving`."""
        raise UnsupportedError(f"{self.label} meters a plan's operating points apart from its stated workloads "
                               "(searches_in_serving is False)")

    def started_ahead(self, architectures: Sequence[str], jobs: int | None = None) -> AbstractContextManager[None]:
        """Within it, the tier's engine processes (where it starts any) are started one job ahead, importing the
        engine while the caller works (``architectures``: the model's, for an engine that looks them up at start;
        ``jobs``: how many engines the caller starts at most, where it knows). This default starts nothing."""
        return nullcontext()

    def forget(self, plan: Plan) -> None:
        """The next estimate of ``plan`` measures it afresh (a unit's drift check). A tier that keeps nothing it
        measured has nothing to forget."""
        return None


__all__ = ["MeasuredTier", "NextRound"]
