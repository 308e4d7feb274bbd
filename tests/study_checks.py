"""What a study says of its plans after interrupts and resumes, read from Optuna's own record only (shared by
the fault tests and benchmarks/reliability_faults.py): which plans were scored, how often, and which trial
the budget admitted was never finished, by itself or by a retry."""

from __future__ import annotations

from collections import Counter
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from advisor.plan import Plan


def _plan_id(t: FrozenTrial) -> str | None:
    params = t.params or t.system_attrs.get("fixed_params")
    return Plan.from_params(params).id if params else None


def scoring_record(study: optuna.Study) -> dict[str, Any]:
    """complete / evaluated (complete and not a repeat) / distinct plans among the complete; scored_twice: plans
    evaluated by more than one trial; lost: trials the budget admitted (fresh, not turned away) that neither
    finished nor had a retry finish; queued_lost: those of them that were queued (baselines, proposals);
    unfinished: trials still RUNNING or WAITING."""
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    evaluated = [t for t in complete if not t.user_attrs.get("repeat")]
    finished_by_retry = {n for t in complete for n in t.system_attrs.get("retry_history", ())}
    fresh = [t for t in trials if "failed_trial" not in t.system_attrs and t.state != TrialState.PRUNED]
    lost = [t for t in fresh if t.state != TrialState.COMPLETE and t.number not in finished_by_retry]
    twice = sorted(p for p, n in Counter(_plan_id(t) for t in evaluated).items() if n > 1)
    return {"complete": len(complete), "evaluated": len(evaluated), "distinct": len({_plan_id(t) for t in complete}),
            "scored_twice": twice, "lost": [t.number for t in lost],
            "queued_lost": [t.number for t in lost if "fixed_params" in t.system_attrs],
            "unfinished": sum(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in trials),
            "failed": sum(t.state == TrialState.FAIL for t in trials),
            "retried": sum("failed_trial" in t.system_attrs for t in trials)}


def assert_each_plan_scored_once(study: optuna.Study, trials: int) -> dict[str, Any]:
    """The budget of ``trials`` met with as many distinct plans, each evaluated once, nothing queued lost."""
    record = scoring_record(study)
    assert record["complete"] == record["evaluated"] == record["distinct"] == trials, record
    assert not record["scored_twice"] and not record["lost"] and not record["unfinished"], record
    return record
