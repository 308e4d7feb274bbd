"""`advisor measure` with a latency objective: the plan's operating point (its largest batch under the
objective, from the predicted tier's step times as the metering engine serves the plan, as the search computes
it) metered on the GPU here and, where it misses the objective as measured, smaller batches until the largest
that meets; the predicted and the measured point side by side, each labelled."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from advisor.engines import DEFAULT_ENGINE
from advisor.errors import InputError
from advisor.formats import GPU, GPU_SPECS
from advisor.models.shape import ModelShape
from advisor.plan import Plan
from advisor.recipe.schema import Workload
from advisor.search.measured import BatchSearch, MeasuredTier, search_batches
from advisor.search.operating import OperatingPoint, operating_point


def workload_of(**fields: Any) -> Workload:
    """A workload from command-line values; an impossible objective is one InputError naming it."""
    try:
        return Workload(name="cli", **{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InputError(f"{'--' + where.replace('_', '-') + ': ' if where else ''}{first['msg']}") from None


def predicted_point(plan: Plan, shape: ModelShape, target: GPU, workload: Workload, model_config: Any = None,
                    engine: str = DEFAULT_ENGINE) -> OperatingPoint:
    """``plan``'s largest batch under ``workload``'s objective, from the predicted tier for ``target``, as
    ``engine`` (the one that meters it here) serves the plan: priced by its step model where it has one (vLLM's)."""
    from advisor.energy.prediction import as_served, make_predicted_model, priced_engine

    model = as_served(make_predicted_model(shape, target, model_config=model_config), shape, target,
                      priced_engine(engine, measured_here=True))
    return operating_point(model, shape, GPU_SPECS[target], plan, workload,
                           model.step_source(plan) + "; steady state, step times")


def measured_operating_point(meter: MeasuredTier, plan: Plan, point: OperatingPoint, workload: Workload
                             ) -> dict[str, Any]:
    """The predicted point (its curve left out) and ``meter``'s: metered at the same batch and, where that misses
    the objective as measured, searched down to the largest batch that meets it
    (:mod:`advisor.search.measured._batch_search`: the trail of batches metered, what the search concluded)."""
    predicted = {k: v for k, v in point.to_dict().items() if k != "curve"}
    (measured,) = search_batches(meter, plan, [BatchSearch(workload, point.state.batch, point.curve,
                                                           predicted=predicted)])
    return {"workload": workload.model_dump(exclude_none=True), "predicted": predicted, "measured": measured}
