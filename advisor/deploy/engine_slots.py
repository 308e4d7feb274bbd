"""This node's GPUs split into slots for engines that run side by side (``advisor verify --workers N``): slot k
holds torch's ``cuda:{k*g}`` .. ``cuda:{k*g+g-1}`` for engines of ``g`` GPUs each, named by UUID so that an
engine's process sees exactly those (``CUDA_VISIBLE_DEVICES`` of UUIDs holds under any mapping the parent was
started with, where plain indices would name other GPUs). Each plan takes a free slot, serves, and hands it back
(the standard library's thread pool: the plans of one command on one node, not a queue across hosts)."""

from __future__ import annotations

import queue
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TypeVar

from advisor.errors import SetupError

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Slot:
    first: int  # torch's index of the slot's first GPU in this process
    devices: tuple[str, ...]  # CUDA_VISIBLE_DEVICES entries of the slot's GPUs (GPU-<uuid>)


def device_id(index: int) -> str:
    """``CUDA_VISIBLE_DEVICES``' name of torch's ``cuda:{index}`` here: its UUID (``GPU-...``)."""
    from advisor.energy.meter import torch_device_uuid

    uuid = str(torch_device_uuid(index))
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def engine_slots(workers: int, gpus: int, visible: int) -> list[Slot]:
    """``workers`` slots of ``gpus`` GPUs each among the ``visible`` ones; SetupError (exit 3) where too few."""
    if workers * gpus > visible:
        raise SetupError(f"--workers {workers} with {gpus} GPU(s) an engine needs {workers * gpus} GPUs; torch sees "
                         f"{visible} here; give --workers {max(visible // gpus, 1)} or fewer")
    return [Slot(k * gpus, tuple(device_id(k * gpus + j) for j in range(gpus))) for k in range(workers)]


def run_on_slots(tasks: Sequence[T], slots: Sequence[Slot], work: Callable[[T, Slot], R]) -> list[R]:
    """``work(task, slot)`` for every task, as many at once as there are slots, each on a slot no other task holds
    meanwhile; results in the tasks' order. A task that fails does not stop the others; the first failure is
    raised once all have ended. Interrupted, no further task starts and the interruption is raised at once."""
    free: queue.Queue[Slot] = queue.Queue()
    for s in slots:
        free.put(s)

    def on_a_slot(task: T) -> R:
        slot = free.get()
        try:
            return work(task, slot)
        finally:
            free.put(slot)

    pool = ThreadPoolExecutor(max_workers=max(len(slots), 1), thread_name_prefix="engine-slot")
    futures = [pool.submit(on_a_slot, t) for t in tasks]
    try:
        wait(futures)
    except BaseException:  # Ctrl-C: no further task starts; those serving end as they would, and are kept
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise errors[0]
    return [f.result() for f in futures]
