"""`advisor verify`'s first engine started while the plans export: all-BF16 is served from the model's own folder, so
its engine can start (vLLM's imports, torch.compile, CUDA graphs, a fresh machine's kernel compiles: 1-2 minutes)
while this process quantizes and writes the other plans. The engine scores the served KL, then holds: it meters
only once :meth:`EarlyServing.go` says the GPU is its alone, so no metering shares the GPU with an export. Its KV pool
is sized rather than profiled (vLLM's memory profile assumes no other process changes its memory meanwhile), and it
starts only where it fits beside the exports' working set (:func:`~advisor.deploy.serving_gpus.engine_beside`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from advisor.deploy.serving_gpus import engine_beside
from advisor.deploy.verification import read_serving, shown_role
from advisor.deploy.vllm import engine_sizes, kill_engines
from advisor.models.shape import ModelShape
from advisor.plan import Plan
from advisor.workflows.verify_serving import Serving, role_job, searched_in_serving, serve_role

STOP_WAIT_S = 60.0  # for the engine's thread to end once its engine is killed


class _Stopped(Exception):
    """The exports failed: the held engine is stopped unmetered."""


class EarlyServing:
    """One role's serving in a thread of its own, its engine held before metering until :meth:`go`."""

    def __init__(self, role: str, serve: Callable[[Callable[[], None]], dict[str, Any]],
                 status: Callable[[str], None]) -> None:
        self.role, self._serve, self._status = role, serve, status
        self._go, self._stopped = threading.Event(), False
        self._answer: dict[str, Any] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="verify-early-engine", daemon=True)

    def start(self) -> EarlyServing:
        self._thread.start()
        return self

    def _hold(self) -> None:
        self._go.wait()
        if self._stopped:
            raise _Stopped

    def _run(self) -> None:
        try:
            self._answer = self._serve(self._hold)
        except BaseException as exc:  # noqa: BLE001 (reported by result(), which the main thread calls)
            self._error = exc

    def go(self) -> None:
        """The GPU is the engine's alone now: it meters."""
        self._go.set()

    def stop(self) -> None:
        """No metering, or no more of it: the engine is killed (the exports failed, or the verify was stopped) and
        the thread ends with it."""
        self._stopped = True
        self._go.set()
        kill_engines()
        self._thread.join(timeout=STOP_WAIT_S)

    def result(self) -> dict[str, Any] | None:
        """What the engine answered; None where it failed (said, and the role is served afresh after)."""
        self._thread.join()
        if self._error is not None:
            self._status(f"the engine started during the exports failed ({type(self._error).__name__}: "
                         f"{str(self._error).strip().splitlines()[0] if str(self._error).strip() else ''}); "
                         f"serving {self.role} again")
            return None
        return self._answer


def start_early(role: str, plan: Plan, path: Path, s: Serving, shape: ModelShape, beside_bytes: int
                ) -> EarlyServing | None:
    """``role``'s serving started now in an engine held before metering (module docstring); None where its serving
    was kept before, or the engine does not fit beside ``beside_bytes`` more of this process's GPU memory."""
    job, key = role_job(role, plan, path, s)
    if not searched_in_serving(s, plan):  # only a serving in rounds can hold before its first
        return None
    if read_serving(s.run_dir, plan.id, key) is not None:  # serve_plans reads it back, and says so
        return None
    fits = engine_beside(shape, *engine_sizes(job), beside_bytes)
    if fits is None:
        return None
    share, kv = fits
    job = replace(job, hold=True, kv_cache_bytes=kv, gpu_memory_utilization=share)
    s.status(f"serving plan {plan.id} ({shown_role(role, plan.id)}) in vLLM: its engine starts while the plans "
             "export, and meters once they are done")
    return EarlyServing(role, lambda hold: serve_role(role, plan, path, job, key, s, hold=hold), s.status).start()


def start_early_bf16(plans: dict[str, Plan], as_is: Path | None, s: Serving, shape: ModelShape, beside_bytes: int
                     ) -> EarlyServing | None:
    """:func:`start_early` for the role holding all-BF16 where the model's folder serves it and some other role
    exports (else there is nothing to start beside)."""
    from advisor.deploy.checkpoint import folder_serving

    served_as_is = {role: folder_serving(plan, as_is) for role, plan in plans.items()}
    role = next((r for r in plans if "bf16" in r.split("+")), None)
    path = served_as_is[role] if role is not None else None
    if role is None or path is None or all(p is not None for p in served_as_is.values()):
        return None
    return start_early(role, plans[role], path, s, shape, beside_bytes)
