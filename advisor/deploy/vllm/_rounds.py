"""Several rounds of workloads served by one vLLM engine in one child process: the measured batch search
(:mod:`advisor.search.measured._batch_search`) decides each round's batches from the round before, and a vLLM engine
takes a minute or more to start, so the child keeps its engine and asks the parent for the next round.

The child runs :func:`advisor.deploy.vllm._serve.serve` with ``more``: after each round it sends the energy rows so
far (``("rows", rows)``) and waits for the next round's workloads (an empty list ends it); at the end it sends
``("ok", result)``, or ``("error", first line, is an import error)`` as
:func:`advisor.deploy.vllm._engine.run_in_child`'s child does.

Within :func:`processes_ahead`, every engine process is started one job ahead: a spare process imports vLLM (and has
vLLM's registry look at the model's architectures, a subprocess of its own on a machine that has not cached it)
while the parent exports, scores or serves the job before, and the next job is handed to it.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from advisor.deploy.vllm._progress import say
from advisor.deploy.vllm._serve import ServeJob, serve
from advisor.errors import SetupError, UnsupportedError

More = Callable[[dict[str, Any]], Sequence[dict[str, Any]]]


def pin_devices(job: ServeJob) -> None:
    """In an engine's own (spawned) process, before CUDA starts: see only the job's GPUs, where it names them."""
    if job.devices:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(job.devices)


def _answer(conn: Any, serving: Callable[[], dict[str, Any]]) -> None:
    """``serving``'s result sent as ``("ok", result)``, or what stopped it as ``("error", first line, is an import
    error)``; the pipe closed either way."""
    try:
        conn.send(("ok", serving()))
    except BaseException as exc:  # noqa: BLE001 (sent to the parent, which decides)
        text = str(exc).strip().splitlines()
        conn.send(("error", f"{type(exc).__name__}: {text[0] if text else ''}", isinstance(exc, ImportError)))
    finally:
        conn.close()


def one_child(target: Callable[[ServeJob], dict[str, Any]], job: ServeJob, conn: Any) -> None:
    """A child that serves one job and answers once."""
    pin_devices(job)
    _answer(conn, lambda: target(job))


def _rounds_child(target: Callable[..., dict[str, Any]], job: ServeJob, conn: Any) -> None:
    pin_devices(job)

    def more(rows: dict[str, Any]) -> list[dict[str, Any]]:
        conn.send(("rows", rows))
        return list(conn.recv())

    _answer(conn, lambda: target(job, more=more))


# the engine processes serving a job in rounds now, from any thread (kill_engines ends them)
_engines: set[Any] = set()


def kill_engines() -> None:
    """Every engine process this process serves a job in rounds with, killed: a verify stopped while an engine
    served in a thread of its own (its thread then ends with the engine's death)."""
    for proc in list(_engines):
        with suppress(OSError, ValueError):
            proc.kill()


def run_rounds_in_child(job: ServeJob, more: More, install_hint: str, target: Callable[..., dict[str, Any]] = serve,
                        timeout_s: float = 3600.0) -> dict[str, Any]:
    """``target(job, more=...)`` in a fresh (spawned) process whose ``more`` asks ``more`` here; each round gets
    ``timeout_s``. Errors as :func:`advisor.deploy.vllm._engine.run_in_child` raises them (``install_hint``: how
    to install vLLM, for an import error)."""
    proc, parent = start_child(_rounds_child, target, job)
    _engines.add(proc)
    try:
        while True:
            if not parent.poll(timeout_s):
                proc.kill()
                raise UnsupportedError(f"vLLM did not finish a round serving {job.checkpoint} in {timeout_s:.0f} s")
            reply = parent.recv()
            if reply[0] != "rows":
                break
            try:
                parent.send(list(more(reply[1])))
            except BaseException:  # the child waits for an answer that will not come
                proc.kill()
                raise
    except EOFError:
        proc.join()
        raise UnsupportedError(f"vLLM's process serving {job.checkpoint} died (exit code {proc.exitcode}) "
                               "before answering; its log above says why") from None
    finally:
        _engines.discard(proc)
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
    return child_answer(reply, job.checkpoint, install_hint)


def child_answer(reply: tuple[Any, ...], checkpoint: str, install_hint: str) -> dict[str, Any]:
    """A child's last message: its result, or the error it names (an import error: ``install_hint``)."""
    if reply[0] == "ok":
        return reply[1]
    if reply[2]:
        raise SetupError(f"--engine vllm: {reply[1]}; {install_hint}")
    raise UnsupportedError(f"vLLM could not serve {checkpoint} ({reply[1]})")


# ----------------------------------------------------------------------------------- processes started ahead
# within processes_ahead: "devices", "architectures", the jobs "left" (None: not said) and the "spare" (process, pipe)
_ahead: dict[str, Any] = {}
_handing_over = threading.Lock()


def _spare(devices: tuple[str, ...], architectures: tuple[str, ...], conn: Any) -> None:
    if devices:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    began = time.perf_counter()
    warm_imports(architectures)
    # when this process's own work ended, beside the meterings' clock times: a host stall during one is suspected of it
    say(f"the next engine's process has vLLM imported ({time.perf_counter() - began:.0f} s, "
        f"{time.strftime('%H:%M:%S', time.gmtime())} UTC)")
    try:
        handed = conn.recv()
    except EOFError:  # the parent ended without a job for it
        return
    if handed is not None:
        child, target, job = handed
        child(target, job, conn)


def warm_imports(architectures: Sequence[str]) -> None:
    """vLLM imported and its registry's look at each of ``architectures`` done, as an engine's start would; what
    fails here fails again in the job, which says why."""
    with suppress(Exception):
        from vllm import LLM  # noqa: F401 (the import is the work)
        from vllm.model_executor.models import ModelRegistry

        for arch in architectures:
            ModelRegistry._try_inspect_model_cls(arch)  # cached on disk by vLLM; a subprocess when not


def _spawn(function: Callable[..., None], *args: Any) -> tuple[Any, Any]:
    """``function(*args, conn)`` in a spawned process (not a daemon: vLLM starts processes of its own); the process
    and the parent's end of the duplex pipe ``conn`` is the other end of."""
    ctx = multiprocessing.get_context("spawn")
    parent, end = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=function, args=(*args, end), daemon=False)
    proc.start()
    end.close()
    return proc, parent


def _spawn_spare() -> None:
    _ahead["spare"] = _spawn(_spare, _ahead["devices"], _ahead["architectures"])


def _close_spare() -> None:
    spare = _ahead.pop("spare", None)
    if spare is not None:
        proc, conn = spare
        with suppress(OSError):  # the spare has ended already
            conn.send(None)
        conn.close()
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join()


def start_child(child: Callable[..., None], target: Callable[..., dict[str, Any]], job: ServeJob
                ) -> tuple[Any, Any]:
    """``child(target, job, conn)`` in an engine process of its own: the spare started ahead where
    :func:`processes_ahead` holds one for the job's GPUs (and the next spare started at once), else a fresh one.
    Returns the process and the parent's end of its duplex pipe."""
    with _handing_over:  # verify's engines started during its exports each start from a thread of their own
        spare = _ahead.get("spare")
        if _ahead.get("left") is not None:
            _ahead["left"] -= 1
        if spare is not None and tuple(job.devices) == _ahead["devices"] and spare[0].is_alive():
            del _ahead["spare"]
            proc, conn = spare
            conn.send((child, target, job))
            if _ahead["left"] is None or _ahead["left"] > 0:
                _spawn_spare()
            return proc, conn
    return _spawn(child, target, job)


@contextmanager
def processes_ahead(architectures: Sequence[str] = (), devices: Sequence[str] = (), jobs: int | None = None
                    ) -> Iterator[None]:
    """Within the block, each engine process for ``devices`` (the jobs' own, empty for the GPUs this process sees)
    is started one job ahead (the module's docstring), none past the block's ``jobs`` (where it says how many it
    starts at most: a spare importing vLLM beside the last engine's start only slows it); the spare left over is
    ended with the block."""
    if "devices" in _ahead:  # nested: the outer block's spares serve
        yield
        return
    _ahead.update(devices=tuple(devices), architectures=tuple(architectures), left=jobs)
    try:
        if jobs is None or jobs > 0:
            _spawn_spare()
        yield
    finally:
        _close_spare()
        _ahead.clear()
