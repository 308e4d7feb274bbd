"""Which `advisor search` owns a study: one run per study, in any storage (SQLite, journal, PostgreSQL).

The run that creates a study, or resumes it, writes an owner record in the study's system
attributes (host, pid, process start, the time of the claim) and refreshes its ``beat`` from a
thread while it runs; it marks the record ended on the way out. Another `advisor search` of the
same study is refused while the owner lives: on this host its process is checked, on another
host a beat younger than :data:`STALE_S` counts as alive. A record left by a process that died
(kill -9, power cut) is taken over with one warning line. `advisor worker` and the `--workers`
children never claim: they join the owner's study on purpose.

Two runs resuming at once both read a free record and both write their own: each reads the
record again after :data:`SETTLE_S` and only the one whose record stayed goes on.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import optuna

from advisor.errors import InputError
from advisor.search.storage._processes import describe_holder, holder_is_running, this_process

OWNER_ATTR = "advisor:owner"
BEAT_S = 30.0
STALE_S = 4 * BEAT_S
SETTLE_S = 0.5


def read_owner(storage: optuna.storages.BaseStorage, study_id: int) -> dict[str, Any] | None:
    record = storage.get_study_system_attrs(study_id).get(OWNER_ATTR)
    return record if isinstance(record, dict) else None


def owner_is_live(record: dict[str, Any] | None) -> bool:
    if not record or record.get("ended"):
        return False
    running = holder_is_running(record)
    if running is not None:
        return running
    return time.time() - float(record.get("beat", 0)) < STALE_S


def in_use_error(name: str, shown_url: str, record: dict[str, Any] | None) -> InputError:
    holder = describe_holder(record) if record else "another advisor search that is creating it now"
    return InputError(f"study {name!r} in {shown_url} is in use by {holder}; wait for it to finish, or choose "
                      "another --name")


class StudyOwnership:
    """This run's claim on a study; :meth:`release` marks it ended (also on errors and interrupts)."""

    def __init__(self, storage: optuna.storages.BaseStorage, study_id: int, record: dict[str, Any]) -> None:
        self.storage, self.study_id, self.record = storage, study_id, record
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._beat_loop, name="advisor-study-owner", daemon=True)
        self._beat.start()

    def _beat_loop(self) -> None:
        while not self._stop.wait(BEAT_S):
            try:
                self._write({**self.record, "beat": time.time()})
            except Exception:  # noqa: BLE001 (a missed beat only ages the record; the next one retries)
                continue

    def _write(self, record: dict[str, Any]) -> None:
        self.storage.set_study_system_attr(self.study_id, OWNER_ATTR, record)

    def release(self) -> None:
        self._stop.set()
        self._beat.join(timeout=5)
        try:
            if (read_owner(self.storage, self.study_id) or {}).get("token") == self.record["token"]:
                self._write({**self.record, "beat": time.time(), "ended": time.time()})
        except Exception:  # noqa: BLE001 (study deleted by its creator's cleanup, or storage gone: nothing to mark)
            pass


def claim_study(storage: optuna.storages.BaseStorage, study_id: int, name: str, shown_url: str,
                created: bool, warn: Callable[[str], None]) -> StudyOwnership:
    """Claim the study this run ``created``, or the existing one it resumes (refused while its owner lives)."""
    if not created:
        current = read_owner(storage, study_id)
        if current is None:  # its creator may be between create_study and its claim
            time.sleep(SETTLE_S)
            current = read_owner(storage, study_id)
        if owner_is_live(current):
            raise in_use_error(name, shown_url, current)
        if current and not current.get("ended"):
            warn(f"study {name!r}: taking over from {describe_holder(current)}, which is no longer running")
    record = {**this_process(), "command": "advisor search", "token": uuid.uuid4().hex, "beat": time.time()}
    storage.set_study_system_attr(study_id, OWNER_ATTR, record)
    if not created:
        time.sleep(SETTLE_S)
        now = read_owner(storage, study_id)
        if (now or {}).get("token") != record["token"]:
            raise in_use_error(name, shown_url, now)
    return StudyOwnership(storage, study_id, record)
