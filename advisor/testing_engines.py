"""The measured-tier contract as tests (as Optuna ships ``optuna/testing/pytest_samplers.py``): what every engine's
:class:`~advisor.search.measured._contract.MeasuredTier` must do for the search, its workers, `advisor measure`,
`advisor verify` and `advisor recheck` to use it, checked through the members they call.

A test module subclasses :class:`MeasuredTierContract` and gives a ``tier`` fixture (a fresh tier, on a fake package
or GPU where the real one is not here); ``workload`` and ``plans`` fixtures may be overridden::

    class TestMyEngine(MeasuredTierContract):
        @pytest.fixture
        def tier(self):
            return MyEngineTier(...)

:func:`check_entry` checks an engine's entry of :data:`advisor.engines.ENGINE_TABLE`. ``tests/test_engine_contract.py``
runs both over every engine of the table. Nothing in the product imports this module.
"""

from __future__ import annotations

import io
import math
from datetime import datetime

import optuna
import pytest

from advisor.engines import DEFAULT_ENGINE, Engine
from advisor.errors import UnsupportedError
from advisor.estimate import EnergyEstimate
from advisor.formats import Format
from advisor.plan import LayerGroup, Plan
from advisor.recipe.schema import Workload
from advisor.search.measured import (
    BatchSearch,
    MeasuredTier,
    Measurer,
    Merged,
    enqueue,
    merge,
    open_queue,
    search_batches,
    unit_of,
)
from advisor.search.operating import MeasuredPoint, at_batch, meets_as_measured
from advisor.search.storage import this_worker
from advisor.search.trial_record import measured_drifts, measured_energy, measured_units

#: the groups of the default plans: one dense layer (a fake tier prices them as it likes)
GROUPS = tuple(LayerGroup(f"layers.0.{k}", (f"model.layers.0.{k}",), ((64, 64),))
               for k in ("qkv", "o", "gate_up", "down"))


def check_entry(entry: Engine) -> None:
    """An engine's entry says what the commands need: a name `--engine` takes, how reports name it and what it runs,
    its package and how to install it where it needs one, and a builder of its measured tier (only the built-in
    runtime has none: the energy tiers build it); an engine offered to `advisor measure --checkpoint` serves one."""
    assert entry.name.isidentifier() and entry.name == entry.name.lower(), entry.name
    assert entry.title and entry.runs, entry.name
    assert (entry.package is None) == (entry.install == ""), f"{entry.name}: a package comes with how to install it"
    assert (entry.tier is None) == (entry.name == DEFAULT_ENGINE), f"{entry.name}: a builder of its measured tier"
    assert entry.checkpoint_tier is None or entry.serves_checkpoint, entry.name
    assert not entry.verifies or entry.serves_checkpoint, f"{entry.name}: `advisor verify` serves the export"


def _positive(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x > 0


class MeasuredTierContract:
    """The contract's tests; a subclass gives the ``tier`` fixture."""

    @pytest.fixture
    def tier(self) -> MeasuredTier:
        raise NotImplementedError("a subclass gives the tier under test")

    @pytest.fixture
    def workload(self) -> Workload:
        return Workload(name="contract", batch_size=2, input_tokens=8, output_tokens=8)

    @pytest.fixture
    def plans(self) -> tuple[Plan, Plan]:
        """(all-BF16, the reference every unit meters first; another plan)."""
        return Plan.uniform(GROUPS, Format.BF16), Plan.uniform(GROUPS, Format.FP8)

    def test_it_declares_the_contracts_members(self, tier: MeasuredTier) -> None:
        assert isinstance(tier, MeasuredTier) and tier.measured is True
        assert isinstance(tier.label, str) and tier.label.startswith("measured (")
        assert tier.gpu_uuid is None or (isinstance(tier.gpu_uuid, str) and tier.gpu_uuid)
        assert tier.gpu_name is None or isinstance(tier.gpu_name, str)
        assert isinstance(tier.gpus, int) and tier.gpus >= 1
        grid = tier.batch_grid
        assert isinstance(grid, tuple) and all(isinstance(b, int) and b >= 1 for b in grid)
        assert list(grid) == sorted(set(grid))
        assert isinstance(tier.searches_in_serving, bool)
        unit = unit_of(tier)
        assert unit.key == (tier.gpu_uuid or tier.gpu_name or tier.label)

    def test_an_estimate_is_measured_and_labelled(self, tier: MeasuredTier, plans: tuple[Plan, Plan],
                                                  workload: Workload) -> None:
        est = tier.estimate(plans[1], workload)
        assert isinstance(est, EnergyEstimate) and est.measured and est.workload == workload.name
        assert est.source.startswith(tier.label)
        assert _positive(est.j_per_token) and _positive(est.decode_tokens_per_s)
        assert 0.0 <= est.decode_j_per_token <= est.j_per_token * (1 + 1e-9)

    def test_operating_points_come_one_per_workload_in_order(self, tier: MeasuredTier, plans: tuple[Plan, Plan],
                                                             workload: Workload) -> None:
        asked = [at_batch(workload, 1), at_batch(workload, 2)]
        points = tier.measure_points(plans[1], asked)
        assert [p.batch for p in points] == [1, 2]
        for p, w in zip(points, asked, strict=True):
            assert isinstance(p, MeasuredPoint) and p.plan_id == plans[1].id and p.workload == workload.name
            assert _positive(p.j_per_token) and _positive(p.tokens_per_s) and p.source.startswith(tier.label)
            assert p.tpot_ms is None or _positive(p.tpot_ms)
            assert p.ttft_ms is None or _positive(p.ttft_ms)
            assert p.meets == meets_as_measured(w, p.tpot_ms, p.ttft_ms)

    def test_rounds_are_metered_until_none_is_asked_for(self, tier: MeasuredTier, plans: tuple[Plan, Plan],
                                                        workload: Workload) -> None:
        seen: list[list[int]] = []

        def next_round(points: list[MeasuredPoint]) -> list[Workload]:
            seen.append([p.batch for p in points])
            return [at_batch(workload, 1)] if len(seen) == 1 else []

        points = tier.measure_rounds(plans[1], [at_batch(workload, 2)], next_round, max_batch=2)
        assert seen == [[2], [1]] and [p.batch for p in points] == [2, 1]

    def test_the_measured_batch_search_runs_on_it(self, tier: MeasuredTier, plans: tuple[Plan, Plan],
                                                  workload: Workload) -> None:
        objective = workload.model_copy(update={"tpot_ms": 60_000.0})  # met by any engine that times it
        (found,) = search_batches(tier, plans[1], [BatchSearch(objective, 2, ())])
        assert found["plan_id"] == plans[1].id and found["workload"] == workload.name
        assert found["predicted_batch"] == 2 and found["meets"] in (True, None)

    def test_a_plan_forgotten_can_be_measured_again(self, tier: MeasuredTier, plans: tuple[Plan, Plan],
                                                workload: Workload) -> None:
        first = tier.estimate(plans[0], workload)
        tier.forget(plans[0])
        again = tier.estimate(plans[0], workload)
        assert again.workload == first.workload and _positive(again.j_per_token)

    def test_it_opens_a_serving_for_the_operating_searches_or_says_it_cannot(
            self, tier: MeasuredTier, plans: tuple[Plan, Plan], workload: Workload) -> None:
        first = [at_batch(workload, 2)]
        if not tier.searches_in_serving:
            with pytest.raises(UnsupportedError):
                tier.open_for(plans[1], first)
            return
        tier.open_for(plans[1], first)
        (point,) = tier.measure_rounds(plans[1], first, lambda _points: [], max_batch=2)
        assert point.batch == 2 and point.workload == workload.name
        assert tier.estimate(plans[1], workload).workload == workload.name

    def test_a_measurement_queue_meters_plans_and_the_drift_check_on_it(
            self, tier: MeasuredTier, plans: tuple[Plan, Plan], workload: Workload) -> None:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = optuna.storages.InMemoryStorage()
        main = optuna.create_study(study_name="contract", storage=storage, directions=["minimize", "minimize"])
        queue = open_queue(main, storage)
        since = datetime.now()
        bf16, other = plans
        enqueue(queue, [bf16, other], set())
        unit = unit_of(tier)
        measured = Measurer(main, queue, tier, [workload], bf16, this_worker(unit.gpu_uuid)).serve()
        said = io.StringIO()
        merge(main, queue, Merged(since=since), lambda line: said.write(line + "\n"))
        assert measured == 2 and set(measured_energy(main)) == {bf16.id, other.id}, said.getvalue()
        assert measured_units(main)[unit.key].plans == [bf16.id, other.id]
        (drift,) = measured_drifts(main)
        assert drift.plan_id == bf16.id and workload.name in drift.drift_pct


__all__ = ["GROUPS", "MeasuredTierContract", "check_entry"]
