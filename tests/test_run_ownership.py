"""A run owns its folder and its study: a second `advisor search` of the same run is refused at once,
no run deletes or reuses a study it did not create, and a lock or an owner record left by a dead
process is taken over. Real SQLite, journal and PostgreSQL storages; no model is loaded here."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from typer.testing import CliRunner

from advisor.cli import app
from advisor.errors import InputError
from advisor.recipe import validate_recipe
from advisor.search.storage import OWNER_ATTR, STALE_S, is_running, open_storage, read_owner
from advisor.search.study import open_owned_study
from advisor.workflows.run_lock import LOCK_NAME, run_folder_lock

runner = CliRunner()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_zombie_is_not_a_running_process():
    """A killed child its parent has not reaped answers a signal probe; it is no worker any more."""
    proc = subprocess.Popen(["sleep", "30"])
    os.kill(proc.pid, 9)
    time.sleep(0.3)  # dead, not reaped: a zombie
    os.kill(proc.pid, 0)  # the old probe: no error
    assert not is_running(proc.pid)
    proc.wait()
    assert is_running(os.getpid()) and not is_running(proc.pid)


def test_the_run_folder_lock_refuses_a_second_holder_and_goes_away_after(tmp_path):
    warnings: list[str] = []
    with run_folder_lock(tmp_path / "run", warnings.append):
        record = json.loads((tmp_path / "run" / LOCK_NAME).read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname() and record["started"]
        with pytest.raises(InputError, match=f"in use by advisor search \\(pid {os.getpid()} on host"), \
                run_folder_lock(tmp_path / "run", warnings.append):
            pass
    assert not (tmp_path / "run" / LOCK_NAME).exists() and not warnings
    with run_folder_lock(tmp_path / "run", warnings.append):  # free again
        pass


def test_a_lock_left_by_a_dead_process_is_taken_over_with_one_warning(tmp_path):
    (tmp_path / LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": dead_pid(), "started": "x"}))
    warnings: list[str] = []
    with run_folder_lock(tmp_path, warnings.append):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert len(warnings) == 1 and "no longer running" in warnings[0]


def test_a_lock_record_of_another_host_is_refused(tmp_path):
    (tmp_path / LOCK_NAME).write_text(json.dumps({"host": "elsewhere", "pid": 1, "started": "x"}))
    with pytest.raises(InputError, match="on another host.*delete"), run_folder_lock(tmp_path, print):
        pass


def test_search_in_a_folder_another_run_holds_is_refused_in_one_line(tmp_path, tiny_recipe):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(tiny_recipe))
    run_dir = Path(tiny_recipe["out"]) / tiny_recipe["name"]
    with run_folder_lock(run_dir, print):
        res = runner.invoke(app, ["search", "-r", str(path)])
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if "Error:" in line]
    assert len(errors) == 1 and f"pid {os.getpid()}" in errors[0] and "Traceback" not in res.output
    assert not (run_dir / "study.db").exists()  # refused before any work


@pytest.fixture(params=["sqlite", "journal", "postgresql"])
def storage_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.db'}"
    if request.param == "journal":
        return f"journal:{tmp_path / 'shared.journal'}"
    return request.getfixturevalue("postgres_server").create_database(f"own{abs(hash(str(tmp_path))) % 10**8}")


def _recipe(tmp_path: Path, url: str, out: str = "a"):
    return validate_recipe({"name": "s", "target": "b200", "out": str(tmp_path / out), "storage": url,
                            "search": {"trials": 4, "seed": 1, "sampler": "random", "heartbeat_s": 1}})


def test_a_study_in_use_is_refused_and_never_deleted_and_resumes_once_released(storage_url, tmp_path):
    warnings: list[str] = []
    first = open_owned_study(_recipe(tmp_path, storage_url), False, {"k": 1}, warnings.append)
    for resume in (False, True):  # another run of the same study, from another folder
        with pytest.raises(InputError, match=f"study 's' in .* is in use by advisor search \\(pid {os.getpid()}"):
            open_owned_study(_recipe(tmp_path, storage_url, "b"), resume, {"k": 1}, warnings.append)
    storage = open_storage(storage_url)
    assert [s.study_name for s in storage.get_all_studies()] == ["s"]  # the empty study was not "a leftover"
    first.release()
    with pytest.raises(InputError, match="already exists.*--resume"):
        open_owned_study(_recipe(tmp_path, storage_url, "b"), False, {"k": 1}, warnings.append)
    again = open_owned_study(_recipe(tmp_path, storage_url, "b"), True, {"k": 1}, warnings.append)
    again.release(discard_if_empty=True)  # resumed, not created: never deleted
    assert [s.study_name for s in storage.get_all_studies()] == ["s"] and not warnings


def test_an_owner_that_died_is_taken_over_with_one_warning_and_a_live_remote_one_is_not(tmp_path):
    url = f"journal:{tmp_path / 'shared.journal'}"
    open_owned_study(_recipe(tmp_path, url), False, {"k": 1}, print).ownership._stop.set()
    storage = open_storage(url)
    study_id = storage.get_study_id_from_name("s")
    record = read_owner(storage, study_id)
    storage.set_study_system_attr(study_id, OWNER_ATTR, {**record, "pid": dead_pid()})
    warnings: list[str] = []
    taken = open_owned_study(_recipe(tmp_path, url, "b"), True, {"k": 1}, warnings.append)
    taken.release()
    assert len(warnings) == 1 and "no longer running" in warnings[0]
    remote = {**record, "host": "elsewhere", "beat": time.time(), "ended": None}
    storage.set_study_system_attr(study_id, OWNER_ATTR, remote)
    with pytest.raises(InputError, match="in use by .*on host elsewhere"):
        open_owned_study(_recipe(tmp_path, url, "b"), True, {"k": 1}, warnings.append)
    storage.set_study_system_attr(study_id, OWNER_ATTR, {**remote, "beat": time.time() - 2 * STALE_S})
    open_owned_study(_recipe(tmp_path, url, "b"), True, {"k": 1}, warnings.append).release()  # silent too long


def test_a_study_created_by_another_run_meanwhile_is_refused_not_reused(tmp_path, monkeypatch):
    """The loser of a simultaneous creation (it looked before the winner created): one InputError, no KeyError."""
    url = f"journal:{tmp_path / 'shared.journal'}"
    winner = open_owned_study(_recipe(tmp_path, url), False, {"k": 1}, print)
    looked = []

    def first_look_misses(storage, name):  # the study exists: every later look finds it
        looked.append(name)
        return None if len(looked) == 1 else storage.get_study_id_from_name(name)

    monkeypatch.setattr("advisor.search.study._open._study_id", first_look_misses)
    with pytest.raises(InputError, match=f"in use by advisor search \\(pid {os.getpid()}"):
        open_owned_study(_recipe(tmp_path, url, "b"), False, {"k": 1}, print)
    winner.release()


def test_search_of_a_study_another_run_holds_in_postgresql_exits_2_in_one_line(postgres_server, tmp_path, tiny_recipe):
    url = postgres_server.create_database("heldstudy")
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(tiny_recipe))
    held = open_owned_study(_recipe(tmp_path, url).model_copy(update={"name": "t"}), False, {"k": 1}, print)
    try:
        for extra in ([], ["--resume"]):
            res = runner.invoke(app, ["search", "-r", str(path), "--storage", url, "--out", str(tmp_path / "b"),
                                      *extra])
            assert res.exit_code == 2, res.output
            errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
            assert len(errors) == 1 and "in use by advisor search" in errors[0] and "KeyError" not in res.output
            assert postgres_server.password not in res.output
    finally:
        held.release()
    assert optuna.load_study(study_name="t", storage=open_storage(url)).user_attrs["study_key"] == {"k": 1}


def test_workers_join_the_owned_study_and_a_killed_child_is_reaped_and_named(tmp_path, tiny_recipe):
    """`--workers 2`: the child joins the coordinator's study (no claim, no lock); killed with SIGKILL once its
    trials have begun, it is reaped and named in one warning line, and the run ends with the budget met. (A kill
    inside a trial, whose trial is retried: tests/test_distributed.py; at five moments:
    benchmarks/reliability_faults.py; before the trials, in the node's stages: tests/test_node.py.)"""
    import signal

    from optuna.trial import TrialState

    trials = 6
    path = tmp_path / "r.yaml"
    slow = {**tiny_recipe["calibration"], "heldout_samples": 8, "heldout_seq_len": 64}  # trials the kill lands among
    path.write_text(yaml.safe_dump({**tiny_recipe, "calibration": slow,
                                    "search": {"trials": trials, "seed": 0, "sampler": "random"}}))
    run_dir = Path(tiny_recipe["out"]) / tiny_recipe["name"]
    parent = subprocess.Popen([sys.executable, "-c", "from advisor.console import main; main()", "search", "-r",
                               str(path), "--workers", "2"], cwd=Path(__file__).resolve().parents[1],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children")
    log = run_dir / "workers" / "worker-1.log"
    end = time.monotonic() + 300
    while not (log.is_file() and "trials: started" in log.read_text()):
        assert parent.poll() is None and time.monotonic() < end, "the worker never started its trials"
        time.sleep(0.05)
    victim = int(children.read_text().split()[0])
    os.kill(victim, signal.SIGKILL)
    out, err = parent.communicate(timeout=300)
    assert parent.returncode == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning: worker-1")]
    assert len(warnings) == 1 and f"pid {victim}" in warnings[0] and "SIGKILL" in warnings[0], err
    study = optuna.load_study(study_name="t", storage=open_storage(f"journal:{run_dir / 'study.journal'}"))
    states = [t.state for t in study.get_trials()]
    assert states.count(TrialState.COMPLETE) == trials and TrialState.RUNNING not in states
    assert "recommended:" in out
