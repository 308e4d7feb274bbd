"""Several rounds of workloads served by one vLLM engine in one child process: the measured batch search
(:mod:`advisor.search.measured._batch_search`) decides each round's batches from the round before, and a vLLM engine
takes a minute or more to start, so the child keeps its engine and asks the parent for the next round.

The child runs :func:`advisor.deploy.vllm._serve.serve` with ``more``: after each round it sends the energy rows so
far (``("rows", rows)``) and waits for the next round's workloads (an empty list ends it); at the end it sends
``("ok", result)``, or ``("error", first line, is an import error)`` as
:func:`advisor.deploy.vllm._engine.run_in_child`'s child does.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from typing import Any

from advisor.deploy.vllm._serve import ServeJob, serve
from advisor.errors import SetupError, UnsupportedError

More = Callable[[dict[str, Any]], Sequence[dict[str, Any]]]


def pin_devices(job: ServeJob) -> None:
    """In an engine's own (spawned) process, before CUDA starts: see only the job's GPUs, where it names them."""
    if job.devices:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(job.devices)


def _rounds_child(target: Callable[..., dict[str, Any]], job: ServeJob, conn: Any) -> None:
    pin_devices(job)

    def more(rows: dict[str, Any]) -> list[dict[str, Any]]:
        conn.send(("rows", rows))
        return list(conn.recv())

    try:
        conn.send(("ok", target(job, more=more)))
    except BaseException as exc:  # noqa: BLE001 (sent to the parent, which decides)
        text = str(exc).strip().splitlines()
        conn.send(("error", f"{type(exc).__name__}: {text[0] if text else ''}", isinstance(exc, ImportError)))
    finally:
        conn.close()


def run_rounds_in_child(job: ServeJob, more: More, install_hint: str, target: Callable[..., dict[str, Any]] = serve,
                        timeout_s: float = 3600.0) -> dict[str, Any]:
    """``target(job, more=...)`` in a fresh (spawned) process whose ``more`` asks ``more`` here; each round gets
    ``timeout_s``. Errors as :func:`advisor.deploy.vllm._engine.run_in_child` raises them (``install_hint``: how
    to install vLLM, for an import error)."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=_rounds_child, args=(target, job, child), daemon=False)
    proc.start()
    child.close()
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
