"""Worker processes on this host for `advisor search --workers N`: N-1 `advisor worker` children
beside the coordinator, one GPU each when there are enough (CUDA_VISIBLE_DEVICES), logs in
RUN_DIR/workers/, each a rank of the coordinator's node (:mod:`advisor.workflows.node`). The storage URL
travels in the environment, never on a command line.

Each child is reaped the moment it ends (a thread waits on it): a killed child never lingers
as a zombie, which a signal probe of its pid would take for a live worker and whose trial would
then stay RUNNING. Its trial is failed and retried by the others (``search.storage._recovery``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from advisor.deploy import engine_slots

STORAGE_ENV = "ADVISOR_STORAGE"


def visible_gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def spawn_workers(n: int, url: str, study: str, run_dir: Path,
                  env_of: Callable[[int], dict[str, str]] | None = None) -> list[subprocess.Popen]:
    """Start ``n`` workers; with at least n+1 GPUs, worker i gets GPU i+1 (the coordinator keeps 0). ``env_of(i)``:
    more environment for worker i (1-based), e.g. its place in the node (:mod:`advisor.workflows.node`)."""
    gpus = visible_gpus()
    logs = run_dir / "workers"
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for i in range(n):
        env = {**os.environ, STORAGE_ENV: url, **(env_of(i + 1) if env_of else {})}
        if gpus > n:  # by UUID: an index would name another GPU where this process was started with a mapping
            env["CUDA_VISIBLE_DEVICES"] = engine_slots.device_id(i + 1)
        cmd = [sys.executable, "-c", "from advisor.console import main; main()", "worker", "--study", study,
               "--work-dir", str(logs / f"worker-{i + 1}")]
        with open(logs / f"worker-{i + 1}.log", "w") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        threading.Thread(target=proc.wait, name=f"reap-worker-{i + 1}", daemon=True).start()
        procs.append(proc)
    return procs


def stop_workers(procs: list[subprocess.Popen], timeout_s: float = 30.0) -> None:
    """SIGTERM each (its trial in flight fails and is re-enqueued), then wait."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()


def wait_workers(procs: list[subprocess.Popen], grace_s: float = 10.0) -> list[int | None]:
    """Exit codes once every child has left; None for a child stopped here. Called when no trial runs
    and the budget is used, so a child still there after ``grace_s`` has nothing left to do (e.g. it
    is still loading its model): it is stopped rather than waited for."""
    codes: list[int | None] = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=grace_s))
        except subprocess.TimeoutExpired:
            stop_workers([p])
            codes.append(None)
    return codes


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
