"""Operating points: each plan's largest batch under a workload's latency objective and its J/token there, as
predicted from the served steady state (``_points``) and as measured (``_measured``: a plan metered at its own
operating batch, beside the predicted point); which of the two the recommendation compares (``_basis``); what the
search cost in energy and how long the recommendation takes to pay it back (``_payback``).

Import order inside: ``_points`` < ``_measured``; ``_basis`` and ``_payback`` stand alone.
"""

from advisor.search.operating._basis import BasisPoint, basis_words, operating_basis
from advisor.search.operating._measured import (
    BUSY_BELOW,
    HELD_BACK_DROP,
    MeasuredPoint,
    at_batch,
    from_estimate,
    from_steps,
    from_timed,
    meets_as_measured,
    objective_name,
)
from advisor.search.operating._payback import Payback, SearchEnergy, describe_days, payback
from advisor.search.operating._points import (
    KV_MEMORY_SHARE,
    QUANTILE,
    OperatingPoint,
    SteadyState,
    StepModel,
    kv_batch_limit,
    largest_meeting,
    operating_point,
    operating_points,
    steady_state,
    weight_bytes,
    within_cap,
)

__all__ = [
    "BUSY_BELOW", "HELD_BACK_DROP", "KV_MEMORY_SHARE", "QUANTILE", "BasisPoint", "MeasuredPoint", "OperatingPoint",
    "Payback", "SearchEnergy", "SteadyState", "StepModel", "at_batch", "basis_words", "describe_days",
    "from_estimate", "from_steps", "from_timed", "kv_batch_limit", "largest_meeting", "meets_as_measured",
    "objective_name", "operating_basis", "operating_point", "operating_points", "payback", "steady_state",
    "weight_bytes", "within_cap",
]
