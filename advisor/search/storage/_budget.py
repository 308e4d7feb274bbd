"""One trial budget for a study, however many workers share it, and the loop every worker runs.

Optuna's ``MaxTrialsCallback`` checks after each trial, so N workers overrun a budget by up
to N-1 trials (measured here on PostgreSQL and the journal: 9-11 trials for a budget of 9
with 3 workers). The storage numbers trials atomically, so a trial's rank among fresh trials
is well defined: a fresh trial runs only if fewer than ``n`` fresh trials have a smaller
number; a loser is told PRUNED (``over_budget``) without being evaluated. Retries of
crashed or interrupted trials (Optuna's ``RetryHeartbeatStaleTrialCallback``) replace a budgeted trial
and run, the first retry of a trial only: a second (two processes queued one trial again at once) is
PRUNED (``duplicate_retry_of``) the same way.

The loop runs with signals deferred (``advisor.interrupts``): an interrupt stops it between trials,
or inside an evaluation, never inside Optuna's own bookkeeping.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from advisor.interrupts import check, deferred
from advisor.search.storage._recovery import retry_dead_local_trials, retry_interrupted_trials

Callback = Callable[[optuna.Study, FrozenTrial], None]
PLAN_ERRORS = (RuntimeError,)  # a plan's own failure (e.g. out of memory): the trial fails, the run goes on


def is_retry(trial: FrozenTrial) -> bool:
    return "failed_trial" in trial.system_attrs  # set by RetryHeartbeatStaleTrialCallback


def replaced(trial: FrozenTrial) -> int | None:
    """The failed trial a retry replaces (the last of Optuna's ``retry_history``)."""
    history = trial.system_attrs.get("retry_history") or []
    return history[-1] if history else None


def counts(trial: FrozenTrial) -> bool:
    """A fresh trial that was not turned away: it uses the budget. Trials pruned as over budget
    do not, so a resume with a larger budget runs the difference."""
    return not is_retry(trial) and not trial.user_attrs.get("over_budget")


class TrialBudget:
    """Exactly ``n`` fresh trials are evaluated in the study, whatever the number of workers."""

    def __init__(self, n: int) -> None:
        self.n = n

    def used(self, study: optuna.Study) -> int:
        return sum(1 for t in study.get_trials(deepcopy=False) if counts(t))

    def admits(self, study: optuna.Study, trial: optuna.Trial) -> bool:
        trials = study.get_trials(deepcopy=False)
        if any(t.number == trial.number and is_retry(t) for t in trials):
            return True
        return sum(1 for t in trials if t.number < trial.number and counts(t)) < self.n

    def wrap(self, study: optuna.Study, objective: Callable[[optuna.Trial], Any]) -> Callable[[optuna.Trial], Any]:
        def budgeted(trial: optuna.Trial) -> Any:
            twin = earlier_retry(study.get_trials(deepcopy=False), trial.number)
            if twin is not None:
                trial.set_user_attr("duplicate_retry_of", twin)
                raise optuna.TrialPruned(f"trial {twin} already retries the same failed trial")
            if not self.admits(study, trial):
                trial.set_user_attr("over_budget", True)
                raise optuna.TrialPruned("over the study's trial budget")
            return objective(trial)

        return budgeted


def earlier_retry(trials: Sequence[FrozenTrial], number: int) -> int | None:
    """The number of a retry of the same failed trial as trial ``number`` that came before it, if any."""
    me = next((t for t in trials if t.number == number), None)
    if me is None or (source := replaced(me)) is None:
        return None
    return next((t.number for t in trials if t.number < number and replaced(t) == source), None)


def reap(study: optuna.Study) -> None:
    """Fail and retry trials whose worker died (heartbeat for databases, pid on this host)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)  # no-op without a heartbeat (journal)
    retry_dead_local_trials(study)


def work(
    study: optuna.Study,
    objective: Callable[[optuna.Trial], Any],
    budget: TrialBudget,
    callbacks: Sequence[Callback] = (),
    deadline: float | None = None,
    waiting_only: bool = False,
    poll_s: float = 0.5,
) -> None:
    """Run trials, waiting (enqueued) ones first, until the budget is used (``waiting_only``: until
    none waits), then stay until no trial runs anywhere, so a crashed worker's trial is failed,
    retried and finished before the caller reads the results."""
    budgeted = budget.wrap(study, objective)
    with deferred():
        _loop(study, budgeted, budget, callbacks, deadline, waiting_only, poll_s)
    check()  # a signal noted during the last trial


def _loop(study: optuna.Study, budgeted: Callable[[optuna.Trial], Any], budget: TrialBudget,
          callbacks: Sequence[Callback], deadline: float | None, waiting_only: bool, poll_s: float) -> None:
    while deadline is None or time.monotonic() < deadline:
        check()
        reap(study)
        waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if waiting or (not waiting_only and budget.used(study) < budget.n):
            # UpdateFinishedTrialError: our trial was failed as stale while alive (a starved
            # heartbeat); its retry waits in the queue.
            try:
                with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                    study.optimize(budgeted, n_trials=1, callbacks=list(callbacks), catch=PLAN_ERRORS,
                                   gc_after_trial=False)
            except KeyboardInterrupt:  # raised inside the evaluation; Optuna has stored the trial as failed
                retry_interrupted_trials(study)
                raise
            continue
        if not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            return
        time.sleep(poll_s)
