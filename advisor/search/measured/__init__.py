"""The measured energy tier: what an engine's tier is (``_contract``: :class:`MeasuredTier`, the one class every
engine's tier derives from), the largest batch that meets a latency objective as measured (``_batch_search``), the
plans to meter as a queue every worker takes from (``_queue``), and measured numbers beside the predicted ones:
the two tiers, the drift checks, every unit's numbers on one scale (``_tiers``).

Import order inside: ``_contract`` < ``_batch_search`` < ``_queue``; ``_tiers`` < ``_queue``.
"""

from advisor.search.measured._batch_search import (
    EXTRA_METERINGS,
    RESOLUTION,
    BatchSearch,
    curve_batch,
    search_batches,
    searches_from_points,
    step_up_ceiling,
    went_past_prediction,
)
from advisor.search.measured._contract import MeasuredTier, NextRound
from advisor.search.measured._queue import (
    QUEUE_SUFFIX,
    Measurer,
    Merged,
    Unit,
    enqueue,
    failed_plans,
    joins,
    merge,
    open_queue,
    round_of,
    set_round,
    unit_of,
)
from advisor.search.measured._tiers import (
    largest_drift_pct,
    measured_on_one_scale,
    near_ties,
    on_one_unit,
    point_on_one_unit,
    prediction_errors,
    unit_factors,
)

__all__ = [
    "EXTRA_METERINGS", "QUEUE_SUFFIX", "RESOLUTION", "BatchSearch", "MeasuredTier", "Measurer", "Merged",
    "NextRound", "Unit", "curve_batch", "enqueue", "failed_plans", "joins", "largest_drift_pct",
    "measured_on_one_scale", "merge", "near_ties", "on_one_unit", "open_queue", "point_on_one_unit",
    "prediction_errors", "round_of", "search_batches", "searches_from_points", "set_round", "step_up_ceiling",
    "unit_factors", "unit_of", "went_past_prediction",
]
