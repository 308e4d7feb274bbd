"""Processes of this host as run folders, studies and trials record them, and whether one still runs.

A record names its host, pid and the kernel's start time of the process, so a pid the
system has since given to another process is not mistaken for the holder. A killed child
that its parent has not reaped yet is a zombie: ``os.kill(pid, 0)`` succeeds on it, so the
state in ``/proc`` decides where there is one.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), if readable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # the name in parentheses may hold spaces
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:][:1] or None


def is_running(pid: int, start_ticks: int | None = None) -> bool:
    """True while ``pid`` is a live process (not a zombie) and, when ``start_ticks`` is given, the same one."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    state = _state(pid)
    if state in ("Z", "X"):
        return False
    if start_ticks is not None:
        now = process_start_ticks(pid)
        if now is not None and now != start_ticks:
            return False  # the pid was given to another process
    return True


def this_process() -> dict[str, Any]:
    """This process as a holder record: host, pid, start ticks and the wall-clock time of the claim."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "start_ticks": process_start_ticks(os.getpid()),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def holder_is_running(record: dict[str, Any]) -> bool | None:
    """Whether the process of ``record`` runs: None when it is on another host (this host cannot tell)."""
    if record.get("host") != socket.gethostname():
        return None
    pid = record.get("pid")
    if not isinstance(pid, int):
        return False
    return is_running(pid, record.get("start_ticks"))


def describe_holder(record: dict[str, Any]) -> str:
    what = record.get("command", "advisor search")
    return f"{what} (pid {record.get('pid')} on host {record.get('host')}, started {record.get('started')})"
