"""`advisor verify`'s engines started while the plans export: all-BF16 served from the model's own folder starts at
once (vLLM's imports, torch.compile, CUDA graphs, a fresh machine's kernel compiles: 1-2 minutes), and every other
plan's engine as soon as its export is written, while this process quantizes and writes the rest. Each engine
scores the served KL, then holds (:class:`EarlyEngines`): none meters until the exports are done and every engine
started has finished starting (:meth:`EarlyEngines.ready`), then they meter one at a time, each once the one before
has ended (:meth:`EarlyServing.result`), so no metering shares the GPU with an export, another engine's start or
another metering, and a later plan's engine start (a minute an 8B plan on an H200) is off the meterings' path. Their
KV pools are sized rather than profiled (vLLM's memory profile assumes no other process changes its memory
meanwhile), and each starts only where it fits beside the other engines and, while any plan is still to export,
the exports' working set (:func:`~advisor.deploy.serving_gpus.engine_beside`, :class:`EarlyEngines`); a plan whose
engine does not fit is served after them, as before: on an H200, both of a 4B's plans are expected to fit, and of an
8B's three, all-BF16 and the plan exported last, not the one exported while another was still to come (by this
module's arithmetic; the 4B's two started early on an H200: reports/benchmarks/verify_time.md, its round 10)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
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
                 status: Callable[[str], None], reserved_bytes: int = 0) -> None:
        self.role, self._serve, self._status = role, serve, status
        self.reserved_bytes = reserved_bytes  # the GPU memory its engine takes once started
        self._go, self._stopped = threading.Event(), False
        self._ready = threading.Event()  # started and holding, or failed
        self._answer: dict[str, Any] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="verify-early-engine", daemon=True)

    def start(self) -> EarlyServing:
        self._thread.start()
        return self

    def _hold(self) -> None:
        self._ready.set()
        self._go.wait()
        if self._stopped:
            raise _Stopped

    def _run(self) -> None:
        try:
            self._answer = self._serve(self._hold)
        except BaseException as exc:  # noqa: BLE001 (reported by result(), which the main thread calls)
            self._error = exc
        finally:
            self._ready.set()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def wait_ready(self) -> None:
        self._ready.wait()

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
        """The engine let meter (:meth:`go`) and what it answered; None where it failed (said, and the role is served
        afresh after)."""
        self.go()
        self._thread.join()
        if self._error is not None:
            self._status(f"the engine started during the exports failed ({type(self._error).__name__}: "
                         f"{str(self._error).strip().splitlines()[0] if str(self._error).strip() else ''}); "
                         f"serving {self.role} again")
            return None
        return self._answer


def start_early(role: str, plan: Plan, path: Path, s: Serving, shape: ModelShape, beside_bytes: int,
                free_bytes: int | None = None) -> EarlyServing | None:
    """``role``'s serving started now in an engine held before metering (module docstring); None where its serving
    was kept before, or the engine does not fit beside ``beside_bytes`` more of this process's GPU memory in
    ``free_bytes`` (what is free now where not given)."""
    from advisor.deploy.serving_gpus import total_gpu_bytes

    job, key = role_job(role, plan, path, s)
    if not searched_in_serving(s, plan):  # only a serving in rounds can hold before its first
        return None
    if read_serving(s.run_dir, plan.id, key) is not None:  # serve_plans reads it back, and says so
        return None
    fits = engine_beside(shape, *engine_sizes(job), beside_bytes, free_bytes)
    if fits is None:
        return None
    share, kv = fits
    job = replace(job, hold=True, kv_cache_bytes=kv, gpu_memory_utilization=share)
    s.status(f"serving plan {plan.id} ({shown_role(role, plan.id)}) in vLLM: its engine starts while the plans "
             "export, and meters once they are done")
    return EarlyServing(role, lambda hold: serve_role(role, plan, path, job, key, s, hold=hold), s.status,
                        int(share * total_gpu_bytes())).start()


class EarlyEngines:
    """The engines started while the plans export, by role (module docstring): all-BF16's from the model's folder at
    once (:meth:`start_bf16`), each other plan's once its export is written (:meth:`start`). The GPU's memory is
    counted by reservation from what was free before the first: each engine started holds its share, and the
    exports' working set is kept free while any role is still to export (what the GPU says is free meanwhile counts
    an engine still starting as free)."""

    def __init__(self, s: Serving, shape: ModelShape, exports_bytes: int, roles: Sequence[str]) -> None:
        from advisor.deploy.serving_gpus import free_gpu_bytes

        self.s, self.shape, self.exports_bytes = s, shape, exports_bytes
        self.to_export = list(roles)
        self.free_bytes = free_gpu_bytes()
        self.started: dict[str, EarlyServing] = {}
        self.plan_ids: dict[str, str] = {}

    def start(self, role: str, plan: Plan, path: Path) -> None:
        """``role``'s export written (or served from the model's folder): its engine started where it is not yet
        and fits (the class docstring)."""
        if role in self.to_export:
            self.to_export.remove(role)
        self._start(role, plan, path)

    def start_bf16(self, plans: dict[str, Plan], as_is: Path | None) -> None:
        """The engine of the role holding all-BF16 started before the exports, where the model's folder serves it
        and some other role exports (else there is nothing to start beside)."""
        from advisor.deploy.checkpoint import folder_serving

        served_as_is = {role: folder_serving(plan, as_is) for role, plan in plans.items()}
        role = next((r for r in plans if "bf16" in r.split("+")), None)
        path = served_as_is[role] if role is not None else None
        if role is None or path is None or all(p is not None for p in served_as_is.values()):
            return
        self._start(role, plans[role], path)

    def _start(self, role: str, plan: Plan, path: Path) -> None:
        if role in self.started:
            return
        taken = sum(e.reserved_bytes for e in self.started.values())
        early = start_early(role, plan, path, self.s, self.shape, self.exports_bytes if self.to_export else 0,
                            self.free_bytes - taken)
        if early is not None:
            self.started[role], self.plan_ids[role] = early, plan.id

    def ready(self) -> None:
        """Once the exports are done: wait until every engine started has finished starting (or failed), so that
        no metering shares the GPU with another engine's start."""
        starting = [f"plan {self.plan_ids[role]} ({shown_role(role, self.plan_ids[role])})"
                    for role, early in self.started.items() if not early.ready]
        if starting:
            self.s.status(f"the first metering waits for {', '.join(starting)}: "
                          f"{'its engine is' if len(starting) == 1 else 'their engines are'} still starting")
        for early in self.started.values():
            early.wait_ready()

    def stop(self) -> None:
        for early in self.started.values():
            early.stop()
