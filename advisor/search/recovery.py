"""Trials stranded by a dead process: failed and re-enqueued with Optuna's retry callback.

Database storages have Optuna's heartbeat: a trial silent for its grace period is failed and
retried by Optuna itself on the next trial start. Two gaps remain, both closed here with
Optuna's own primitives (``set_trial_state_values`` and ``RetryHeartbeatStaleTrialCallback``): the
journal file storage has no heartbeat in Optuna 5, and a resume within the grace period would
leave the killed trial RUNNING. Every trial records its worker (host, pid, process start) when it
starts, so a trial RUNNING under a process of this host that no longer runs is known to be dead
(a killed child its parent has not reaped yet, a zombie, counts as dead: ``processes.is_running``).
"""

from __future__ import annotations

import os
import socket
import warnings
from datetime import datetime

import optuna
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from advisor.search.processes import is_running, process_start_ticks

WORKER_ATTR = "worker"
UNNAMED_GRACE_S = 60.0  # a RUNNING trial that has not named its worker after this is dead


def retry_callback(max_retry: int = 2) -> RetryHeartbeatStaleTrialCallback:
    """Optuna's retry of a failed trial (same params, ``failed_trial`` system attr); experimental."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RetryHeartbeatStaleTrialCallback(max_retry=max_retry)


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


def retry_interrupted_trials(study: optuna.Study, max_retry: int = 2) -> list[int]:
    """Re-enqueue this process's trials that an interrupt failed (Optuna marks them FAIL), so a
    resume runs them again instead of counting them against the budget."""
    me = this_worker()
    trials = study.get_trials(deepcopy=False)
    retried = {t.system_attrs.get("failed_trial") for t in trials}
    retry = retry_callback(max_retry)
    out = []
    for t in trials:
        worker = t.user_attrs.get(WORKER_ATTR) or {}
        mine = worker.get("host") == me["host"] and worker.get("pid") == me["pid"]
        if t.state == TrialState.FAIL and mine and t.number not in retried:
            retry(study, t)
            out.append(t.number)
    return out
