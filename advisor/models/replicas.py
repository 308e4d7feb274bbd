"""A model replicated over the processes of one node: which process (rank) does which item of a stage, and how
each rank's results reach every rank.

Every rank holds a whole replica of the model. A stage whose work is a list of independent items (calibration
batches, bank modules, held-out batches, sensitivity probes) gives item ``i`` to rank ``i % world``; each rank
computes its items exactly as one process would, and the results are exchanged with torch.distributed's
collectives (NCCL between GPUs, gloo on CPUs) on the group :mod:`advisor.workflows.node` starts. Nothing here
chooses or starts ranks; ``Ranks()`` is one process alone, whose collectives do nothing.

A collective that fails because another rank has gone (a closed connection, a timeout) raises
:class:`RankLost` naming the stage; the coordinator turns it into the failed rank's own error.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from advisor.errors import SetupError

T = TypeVar("T")


class RankLost(SetupError):
    """A collective failed: another rank of the node stopped (exit code 3 unless the coordinator names why)."""

    def __init__(self, stage: str, detail: str) -> None:
        super().__init__(f"another process of the node stopped answering during the {stage} stage ({detail})")
        self.stage = stage


@dataclass
class Ranks:
    """This process's place in the node: ``rank`` of ``world``; ``device`` is where collectives' tensors must be
    (``cuda`` for NCCL, ``cpu`` for gloo). ``busy_s``: the seconds this rank computed in each stage."""

    rank: int = 0
    world: int = 1
    device: str = "cpu"
    busy_s: dict[str, float] = field(default_factory=dict)
    stage: str = "prepare"

    @property
    def spread(self) -> bool:
        return self.world > 1

    def indices(self, n: int) -> Sequence[int]:
        """The items of ``n`` this rank computes (every ``world``-th, from its own rank)."""
        return range(self.rank, n, self.world)

    def owner(self, i: int) -> int:
        return i % self.world

    @contextmanager
    def busy(self, stage: str) -> Iterator[None]:
        """Count the seconds of the block as this rank's work in ``stage`` (GPU work finished included)."""
        self.stage = stage
        t = time.perf_counter()
        try:
            yield
        finally:
            if self.device == "cuda" and torch.cuda.is_available():
                torch.cuda.synchronize()
            self.busy_s[stage] = self.busy_s.get(stage, 0.0) + time.perf_counter() - t

    def _collective(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RuntimeError as exc:  # gloo: "Connection closed by peer"; NCCL: a timeout or an aborted group
            raise RankLost(self.stage, f"{what}: {str(exc).splitlines()[0][:200]}") from exc

    def gather(self, obj: T) -> list[T]:
        """Every rank's ``obj``, in rank order (torch.distributed's all_gather_object: small objects only)."""
        if not self.spread:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        self._collective("all_gather_object", dist.all_gather_object, out, obj)
        return out

    def merged(self, part: dict[Any, T]) -> dict[Any, T]:
        """The union of every rank's ``part`` (each item computed by one rank)."""
        out: dict[Any, T] = {}
        for p in self.gather(part):
            out.update(p)
        return out

    def broadcast(self, obj: T, src: int = 0) -> T:
        """Rank ``src``'s ``obj`` on every rank (small objects only)."""
        if not self.spread:
            return obj
        import torch.distributed as dist

        box = [obj]
        self._collective("broadcast_object_list", dist.broadcast_object_list, box, src=src)
        return box[0]

    def broadcast_(self, t: torch.Tensor, src: int) -> torch.Tensor:
        """Fill ``t`` (allocated with the right shape and dtype on every rank) with rank ``src``'s, in place; sent
        as its bytes, so any dtype travels (float8 included) and arrives bit for bit."""
        if not self.spread or t.numel() == 0:
            return t
        import torch.distributed as dist

        flat = t.view(-1).view(torch.uint8)
        wire = flat if flat.device.type == self.device else flat.to(self.device)
        self._collective("broadcast", dist.broadcast, wire, src=src)
        if wire is not flat:
            flat.copy_(wire)
        return t

    def max_(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` replaced in place by the elementwise maximum over the ranks' ``t`` (exact: no rounding)."""
        if not self.spread:
            return t
        import torch.distributed as dist

        wire = t if t.device.type == self.device else t.to(self.device)
        self._collective("all_reduce", dist.all_reduce, wire, op=dist.ReduceOp.MAX)
        if wire is not t:
            t.copy_(wire)
        return t

    def barrier(self) -> None:
        if self.spread:
            import torch.distributed as dist

            self._collective("barrier", dist.barrier)
