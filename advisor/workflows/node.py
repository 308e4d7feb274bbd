"""The node: the processes of `advisor search --workers N` on one host, joined in one torch.distributed group for
the stages before the trials, so that every GPU works in each of them (:mod:`advisor.models.replicas`).

`--workers N` starts N-1 `advisor worker` children (:mod:`advisor.workflows.spawn`). They are started as the
search starts, each told its rank in ``ADVISOR_NODE``; each joins the coordinator's group (rank 0) through
torch.distributed's own TCPStore on 127.0.0.1 (a free port), receives the recipe, loads its replica and takes its
share of every stage: calibration batches, bank modules, reference batches, sensitivity probes. The group is
gloo on CPUs and NCCL where every rank has a GPU of its own (``NCCL_NVLS_ENABLE=0`` in every process); it is
destroyed once the sensitivity stage ends, and the trials run as before, through Optuna's storage.

Failures never hang the run: gloo fails a collective as soon as a peer's connection closes; with NCCL a thread
of the coordinator watches its children and aborts the group when one exits, and a worker's thread aborts it
when its coordinator is gone (collectives wait, ``TORCH_NCCL_BLOCKING_WAIT``, so an abort raises). A rank that
answers nothing at all fails the collective after ``ADVISOR_NODE_TIMEOUT_S`` (default 30 min: one rank alone may
sample the tokens for minutes while the others wait). The coordinator then names the worker that failed, its
exit, its own `Error:` line and its log.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.errors import AdvisorError, InputError, SetupError
from advisor.interrupts import pending
from advisor.models.replicas import RankLost, Ranks
from advisor.recipe.schema import Recipe
from advisor.search.storage import url_without_password
from advisor.workflows.spawn import describe_exit, spawn_workers, visible_gpus

NODE_ENV = "ADVISOR_NODE"  # "PORT RANK WORLD BACKEND", set by the coordinator for each worker it starts
TIMEOUT_ENV = "ADVISOR_NODE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 1800.0
#: the stages a node shares, in order (each rank's busy seconds are kept per stage)
STAGES = ("load", "tokens", "calibration", "bank", "reference", "sensitivity")
#: while a node's group is made: NCCL collectives that wait, and raise when aborted (not kept for later processes:
#: a serving engine started afterwards runs with its own settings); NVLink multicast stays off in every process
GROUP_ENV = {"TORCH_NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}
_READY = "advisor/ready/{}"
CONNECT_S = 60.0
_HOST = "127.0.0.1"


def timeout_s() -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise InputError(f"{TIMEOUT_ENV}={raw!r}: give a positive number of seconds (default {DEFAULT_TIMEOUT_S:g})")
    return value


def backend_for(device: str, workers: int) -> str:
    """NCCL where every rank has a GPU of its own (the coordinator's and one per worker), else gloo."""
    return "nccl" if device == "cuda" and visible_gpus() >= workers else "gloo"


@dataclass
class Node:
    """This process in the node; the coordinator also holds its children and where they log."""

    ranks: Ranks
    backend: str
    store: Any
    children: list[subprocess.Popen] = field(default_factory=list)
    logs: Path | None = None
    closed: threading.Event = field(default_factory=threading.Event)

    def close(self) -> None:
        """Destroy the group (after the last collective): its connections close."""
        if self.closed.is_set():
            return
        self.closed.set()
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    def abort(self) -> None:
        """Leave the group at once, so that no other rank waits for this one (its collectives fail)."""
        if self.closed.is_set():
            return
        self.closed.set()
        _abort_group(self.backend)

    def watch(self, gone: Callable[[], bool]) -> None:
        """With NCCL, a thread that aborts the group when ``gone()`` (a peer has left): NCCL alone would wait for
        it until the timeout. gloo notices a closed connection itself."""
        if self.backend != "nccl":
            return

        def run() -> None:
            while not self.closed.wait(0.5):
                if gone():
                    self.abort()
                    return

        threading.Thread(target=run, name="node-watch", daemon=True).start()


def _abort_group(backend: str) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if backend == "nccl":
        from torch.distributed.distributed_c10d import _abort_process_group

        _abort_process_group()
    else:
        dist.destroy_process_group()


def _init(backend: str, store: Any, rank: int, world: int) -> Ranks:
    import torch
    import torch.distributed as dist

    device_id = None
    if backend == "nccl":
        torch.cuda.set_device(0)  # a worker sees its one GPU; the coordinator keeps cuda:0
        device_id = torch.device("cuda", 0)
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    saved = {k: os.environ.get(k) for k in GROUP_ENV}
    os.environ.update(GROUP_ENV)
    try:
        dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s()), device_id=device_id)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return Ranks(rank, world, "cuda" if backend == "nccl" else "cpu")


def start_node(workers: int, url: str, study: str, run_dir: Path, device: str, children: list,
               resumed: bool = False) -> Node:
    """Start the workers as ranks 1..N-1 (added to ``children`` at once, so a failure stops them) and form the
    group with them (rank 0); a worker that ends before it joins is named in the error."""
    import torch.distributed as dist

    backend = backend_for(device, workers)
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # in every process: the workers inherit it
    wait = timeout_s()
    store = dist.TCPStore(_HOST, 0, workers, True, timeout=datetime.timedelta(seconds=wait), wait_for_workers=False)
    started = spawn_workers(workers - 1, url, study, run_dir,
                            env_of=lambda rank: {NODE_ENV: f"{store.port} {rank} {workers} {backend}"})
    children += started
    node = Node(Ranks(0, workers), backend, store, started, run_dir / "workers")
    deadline = time.monotonic() + wait
    keys = [_READY.format(r) for r in range(1, workers)]
    while not store.check(keys):
        if any(p.poll() is not None for p in started):
            raise failed_rank(node, RankLost("start", "a worker ended before it joined"), resumed)
        if time.monotonic() > deadline:
            raise SetupError(f"the node's workers did not join within {wait:g} s (logs in {node.logs}); "
                             f"raise {TIMEOUT_ENV} on a slow host")
        time.sleep(0.2)
    node.ranks = _init(backend, store, 0, workers)
    node.watch(lambda: any(p.poll() is not None for p in started))
    return node


def start_workers(recipe: Recipe, workers: int, children: list, report: Callable[[str], None],
                  resumed: bool = False) -> Node | None:
    """`--workers N`: N-1 `advisor worker` children on this host, joined with this process in a node whose every
    rank takes a share of the stages before the trials (:mod:`advisor.workflows.node`); None for one process."""
    if workers < 2:
        return None
    from advisor.workflows.context import pick_device

    node = start_node(workers, recipe.storage_url, recipe.name, recipe.run_dir, pick_device(recipe.device), children,
                      resumed)
    report(f"workers: {workers - 1} more on this host, joined in a node of {workers} ranks "
           f"({node.backend}; logs in {recipe.run_dir / 'workers'})")
    return node


def worker_recipe(recipe: Recipe) -> dict[str, Any]:
    """The recipe as the workers read it (the study's copy once prepared): without the storage password."""
    data = recipe.model_dump(mode="json")
    if data.get("storage"):
        data["storage"] = url_without_password(data["storage"])
    return data


def join_node(spec: str) -> Node:
    """A worker's place in its coordinator's node, from ``ADVISOR_NODE``."""
    import torch.distributed as dist

    try:
        port, rank, world, backend = spec.split()
        port_n, rank_n, world_n = int(port), int(rank), int(world)
    except ValueError:
        raise InputError(f"{NODE_ENV}={spec!r}: expected 'PORT RANK WORLD BACKEND' (set by `advisor search "
                         "--workers`, not by hand)") from None
    try:  # the coordinator made the store before it started this process: it answers at once, or has ended
        store = dist.TCPStore(_HOST, port_n, world_n, False, timeout=datetime.timedelta(seconds=CONNECT_S))
        store.set_timeout(datetime.timedelta(seconds=timeout_s()))
    except RuntimeError as exc:
        raise SetupError(f"cannot reach the coordinator's node store at {_HOST}:{port_n} "
                         f"({str(exc).splitlines()[0][:200]}); the coordinator has ended") from None
    store.set(_READY.format(rank_n), "1")
    node = Node(Ranks(rank_n, world_n), backend, store)
    node.ranks = _init(backend, store, rank_n, world_n)
    parent = os.getppid()
    node.watch(lambda: os.getppid() != parent)
    return node


def finish_node(node: Node, timings: dict[str, Any] | None = None,
                report: Callable[[str], None] | None = None) -> None:
    """The last collective: every rank's busy seconds per stage reach rank 0, which keeps them in ``timings``
    (``{stage}_busy_s``: one value per rank; ``ranks``) and reports a line per stage; then the group is gone."""
    busy = node.ranks.gather(node.ranks.busy_s)
    node.close()
    if timings is None:
        return
    world = node.ranks.world
    timings["ranks"] = world
    for stage in STAGES:
        seconds = [round(b.get(stage, 0.0), 3) for b in busy]
        if not any(seconds):
            continue
        timings[f"{stage}_busy_s"] = seconds
        worked = sum(1 for s in seconds if s > 0)
        wall = timings.get(f"{stage}_s")
        if report:
            report(f"node: {stage}{f' {wall:.1f} s' if wall is not None else ''} on {worked} of {world} "
                   f"{'GPUs' if node.backend == 'nccl' else 'ranks'} (busy {', '.join(f'{s:.1f}' for s in seconds)} s)")


def report_trials(study: Any, node: Node, timings: dict[str, Any], report: Callable[[str], None]) -> None:
    """How long each process of the node spent in the trials it finished (Optuna's start and end of each trial,
    by the process the trial records): ``trials_busy_s``, coordinator first."""
    from optuna.trial import TrialState

    from advisor.search.storage import WORKER_ATTR

    pids = [os.getpid(), *(p.pid for p in node.children)]
    busy = [0.0] * len(pids)
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        pid = (t.user_attrs.get(WORKER_ATTR) or {}).get("pid")
        if pid in pids and t.datetime_start and t.datetime_complete:
            busy[pids.index(pid)] += (t.datetime_complete - t.datetime_start).total_seconds()
    timings["trials_busy_s"] = [round(b, 3) for b in busy]
    report(f"node: trials {timings.get('trials_s', 0.0):.1f} s on {sum(b > 0 for b in busy)} of {len(pids)} "
           f"{'GPUs' if node.backend == 'nccl' else 'ranks'} (busy {', '.join(f'{b:.1f}' for b in busy)} s)")


@contextmanager
def rank_failures(node: Node | None, resumed: bool) -> Iterator[None]:
    """The coordinator's node stages: on any failure the group is left at once (no worker waits for it); a
    collective that failed because a worker ended becomes that worker's own error."""
    if node is None:
        yield
        return
    try:
        yield
    except BaseException as exc:
        node.abort()
        if isinstance(exc, RankLost) and not pending():
            raise failed_rank(node, exc, resumed) from None
        raise


def failed_rank(node: Node, lost: RankLost, resumed: bool) -> AdvisorError:
    """The error of the worker that ended (waited for up to 10 s): its exit, its own `Error:` line, its log; its
    exit code where it is the rules' (2 bad input, 3 the machine), 3 where it was killed."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and all(p.poll() is None for p in node.children):
        time.sleep(0.1)
    after = ("finished trials are kept: continue with `advisor search ... --resume`" if resumed
             else "no trial had run: run the same command again")
    for rank, p in enumerate(node.children, start=1):
        code = p.poll()
        if code is None:
            continue
        log = (node.logs or Path(".")) / f"worker-{rank}.log"
        said = last_error_line(log)
        message = (f"worker-{rank} (rank {rank} of {node.ranks.world}, pid {p.pid}) {describe_exit(code)} during "
                   f"the node's {lost.stage} stage{f': {said}' if said else ''} (log: {log}); {after}")
        return {2: InputError, 1: AdvisorError}.get(code, SetupError)(message)
    return SetupError(f"{lost}; the workers' logs are in {node.logs}; {after}")


def last_error_line(log: Path) -> str | None:
    """The message of the last `Error:` line a worker wrote, if any."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    said = [x.removeprefix("Error:").strip() for x in lines if x.startswith("Error:")]
    return said[-1] if said else None
