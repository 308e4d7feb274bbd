"""What the study has scored and what it has queued, read from the study itself each time.

Nothing here is kept in a process: a resumed run, a worker and the coordinator all see the same record
(trial params; Optuna's ``fixed_params`` of an enqueued trial), so a plan scored once is never scored
again by a trial that starts after it finished, whichever process or resume runs it, and a queued plan is
not queued twice.
"""

from __future__ import annotations

from collections.abc import Sequence

import optuna
from optuna.trial import TrialState

from advisor.plan import Plan


def trial_plan(t: optuna.trial.FrozenTrial) -> Plan | None:
    """A trial's plan: its params, or for a queued trial (waiting, or failed before it drew them) its fixed
    params; None for a sampler's trial that stopped before drawing."""
    params = t.params or t.system_attrs.get("fixed_params")
    return Plan.from_params(params) if params else None


def scored_trial(study: optuna.Study, plan_id: str) -> optuna.trial.FrozenTrial | None:
    """The first finished trial of the plan, whichever process or run finished it."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if (t.user_attrs.get("plan_id") or Plan.from_params(t.params).id) == plan_id:  # older trials: no plan_id
            return t
    return None


def enqueue_baselines(study: optuna.Study, plans: Sequence[Plan], kv_dimension: bool = False) -> None:
    """Enqueue each baseline unless a finished or waiting trial already has it."""
    seen = {
        p.id
        for t in study.get_trials(deepcopy=False)
        if t.state in (TrialState.COMPLETE, TrialState.WAITING) and (p := trial_plan(t)) is not None
    }
    for plan in plans:
        if plan.id not in seen:
            study.enqueue_trial(plan.params(kv_dimension), skip_if_exists=True)


def enqueue_new(study: optuna.Study, plans: Sequence[Plan], kv_dimension: bool = False) -> int:
    """Enqueue the plans no trial holds yet (a failed one is queued again by ``search.storage._recovery``, not here);
    returns how many."""
    seen = {p.id for t in study.get_trials(deepcopy=False) if (p := trial_plan(t)) is not None}
    n = 0
    for plan in plans:
        if plan.id not in seen:
            study.enqueue_trial(plan.params(kv_dimension))
            seen.add(plan.id)
            n += 1
    return n
