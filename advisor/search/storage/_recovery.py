"""Trials stranded by a dead process or an interrupt: failed and re-enqueued with Optuna's retry callback.

Database storages have Optuna's heartbeat: a trial silent for its grace period is failed and
retried by Optuna itself on the next trial start. Two gaps remain, both closed here with
Optuna's own primitives (``set_trial_state_values`` and ``RetryHeartbeatStaleTrialCallback``): the
journal file storage has no heartbeat in Optuna 5, and a resume within the grace period would
leave the killed trial RUNNING. Every trial records its worker (host, pid, process start) when it
starts, so a trial RUNNING under a process of this host that no longer runs is known to be dead
(a killed child its parent has not reaped yet, a zombie, counts as dead: ``processes.is_running``).

A failed trial is queued again unless its plan's own evaluation failed: by the process an interrupt
stopped, and, for whatever that process could not do (it was killed, or an older advisor failed a queued
trial before its parameters were set), by the resume. A retry replaces its trial in the budget
(``search.storage._budget``); a second retry of one trial is turned away there, so a retry never runs twice.
"""

from __future__ import annotations

import copy
import os
import socket
import warnings
from datetime import datetime

import optuna
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from advisor.search.storage._processes import is_running, process_start_ticks

WORKER_ATTR = "worker"
PLAN_ERROR_ATTR = "error"  # why a trial's own evaluation failed (the objective writes it)
UNNAMED_GRACE_S = 60.0  # a RUNNING trial that has not named its worker after this is dead


class _Retry(RetryHeartbeatStaleTrialCallback):
    """Optuna's retry, except that the retry does not inherit the failed trial's worker (Optuna copies every user
    attribute): a retry another process has just taken would name the dead process until its objective names its
    own, and a reaper in that moment failed it as dead while it ran ("Cannot tell a FAIL trial")."""

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        own = copy.copy(trial)
        own.user_attrs = {k: v for k, v in trial.user_attrs.items() if k != WORKER_ATTR}
        super().__call__(study, own)


def retry_callback(max_retry: int | None = 2) -> RetryHeartbeatStaleTrialCallback:
    """Optuna's retry of a failed trial (same params, ``failed_trial`` system attr; None: no limit; the worker not
    inherited: :class:`_Retry`); experimental."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _Retry(max_retry=max_retry)


def this_worker(gpu_uuid: str | None = None) -> dict[str, object]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "gpu_uuid": gpu_uuid,
            "start_ticks": process_start_ticks(os.getpid())}


def retry_dead_local_trials(study: optuna.Study, max_retry: int = 2) -> list[int]:
    """Fail and re-enqueue RUNNING trials whose worker process on this host is gone."""
    host = socket.gethostname()
    retry = retry_callback(max_retry)
    storage = study._storage  # Optuna's public API offers no other way to fail a foreign trial
    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = t.user_attrs.get(WORKER_ATTR) or {}
        if not worker:  # the objective names its process first thing: silent this long, it died at its start
            if t.datetime_start is None or (datetime.now() - t.datetime_start).total_seconds() < UNNAMED_GRACE_S:
                continue
        elif worker.get("host") != host or not isinstance(worker.get("pid"), int) \
                or is_running(worker["pid"], worker.get("start_ticks")):
            continue
        try:
            if storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                failed.append(t.number)
                retry(study, storage.get_trial(t._trial_id))
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another process got there first
    return failed


def retried(trials: list[optuna.trial.FrozenTrial]) -> set[int]:
    """The numbers of the trials a retry exists for: each retry lists in Optuna's ``retry_history`` the
    trials it replaces (``failed_trial`` names only the first of a chain)."""
    return {n for t in trials for n in t.system_attrs.get("retry_history", ())}


def failed_by_its_plan(trial: optuna.trial.FrozenTrial) -> bool:
    """The trial's own evaluation failed (the objective records why): retrying it would fail again."""
    return PLAN_ERROR_ATTR in trial.user_attrs


def retry_interrupted_trials(study: optuna.Study) -> list[int]:
    """Re-enqueue this process's trials that an interrupt failed (Optuna marks them FAIL), so a
    resume runs them again instead of counting them against the budget. No limit: an interrupt says
    nothing of the plan."""
    me = this_worker()
    trials = study.get_trials(deepcopy=False)
    done = retried(trials)
    retry = retry_callback(max_retry=None)
    out = []
    for t in trials:
        worker = t.user_attrs.get(WORKER_ATTR) or {}
        mine = worker.get("host") == me["host"] and worker.get("pid") == me["pid"]
        if t.state == TrialState.FAIL and mine and t.number not in done and not failed_by_its_plan(t):
            retry(study, t)
            out.append(t.number)
    return out


def requeue_failed_trials(study: optuna.Study) -> list[int]:
    """What a resume (the coordinator, as it starts) queues again: every failed trial that no retry replaces,
    unless its plan's own evaluation failed. That covers a trial failed before its parameters were set
    (queued: Optuna's ``fixed_params`` go with the retry) and one whose process died before re-enqueuing
    it; a trial of a process still running on this host is left to that process."""
    trials = study.get_trials(deepcopy=False)
    done = retried(trials)
    retry = retry_callback(max_retry=None)
    out = []
    for t in trials:
        if t.state != TrialState.FAIL or t.number in done or failed_by_its_plan(t) or _owner_runs(t):
            continue
        retry(study, t)
        out.append(t.number)
    return out


def _owner_runs(trial: optuna.trial.FrozenTrial) -> bool:
    worker = trial.user_attrs.get(WORKER_ATTR) or {}
    pid = worker.get("pid")
    if worker.get("host") != socket.gethostname() or not isinstance(pid, int) or pid == os.getpid():
        return False
    return is_running(pid, worker.get("start_ticks"))
