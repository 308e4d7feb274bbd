"""Many workers, one study, on Optuna's own storages: a real PostgreSQL server (started by the
tests, 127.0.0.1 only) and the journal file. Workers are real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from typer.testing import CliRunner

from advisor.cli import app

ROOT = Path(__file__).resolve().parents[1]
TRIALS = 12

WORKER = textwrap.dedent("""
    import os, sys, time
    from advisor.plan import LayerGroup
    from advisor.recipe import validate_recipe
    from advisor.search.study import open_study, run_search, make_sampler
    from advisor.testing import AdditiveEvaluator
    import optuna

    from advisor.search.storage import open_storage

    url, role, out, delay, trials = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
    hold = sys.argv[6:] == ["hold"]

    class Slow(AdditiveEvaluator):
        # "hold": the coordinator's first trial waits for another process's, so the work is shared however late
        held = hold and role == "coordinator"

        def evaluate(self, plan):
            end = time.monotonic() + 60
            while Slow.held and time.monotonic() < end and not any(
                    t.state == optuna.trial.TrialState.RUNNING and t.user_attrs.get("worker", {}).get("pid")
                    not in (None, os.getpid()) for t in study.get_trials()):
                time.sleep(0.05)
            Slow.held = False
            time.sleep(delay)
            return super().evaluate(plan)

    groups = tuple(LayerGroup(f"layers.{i}.{r}", (f"m{i}{r}",), ((64, 64),)) for i in range(3) for r in ("qkv", "down"))
    recipe = validate_recipe({"name": "d", "target": "b200", "out": out, "storage": url, "accuracy": {"max_kl": 0.1},
                              "search": {"trials": trials, "seed": 1, "sampler": "random", "heartbeat_s": 1}})
    if role == "coordinator":
        study = open_study(recipe, resume=False)
        study.set_user_attr("ready", True)
    else:
        storage = open_storage(url, heartbeat_s=1)
        while True:
            try:
                study = optuna.load_study(study_name="d", storage=storage, sampler=make_sampler("random", os.getpid()))
                if study.user_attrs.get("ready"):
                    break
            except KeyError:
                pass
            time.sleep(0.1)
    run_search(study, Slow(), recipe, groups, coordinator=(role == "coordinator"))
""")


def _start(url: str, role: str, out: Path, delay: float, hold: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WORKER, url, role, str(out), str(delay), str(TRIALS),
                             *(["hold"] if hold else [])], cwd=ROOT, stderr=subprocess.PIPE, text=True)


def _load(url: str) -> optuna.Study:
    from advisor.search.storage import open_storage

    return optuna.load_study(study_name="d", storage=open_storage(url))


def _baseline_trials(study: optuna.Study) -> list[str]:
    return [t.user_attrs.get("label") for t in study.get_trials()
            if t.state == TrialState.COMPLETE and t.user_attrs.get("label", "").startswith("all-")
            and "fixed_params" in t.system_attrs]


@pytest.fixture(params=["postgresql", "journal"])
def storage_url(request, tmp_path):
    if request.param == "journal":
        return f"journal:{tmp_path / 'study.journal'}"
    server = request.getfixturevalue("postgres_server")
    return server.create_database(f"d{abs(hash(str(tmp_path))) % 10**8}")


def test_three_workers_share_one_budget_and_run_each_baseline_once(storage_url, tmp_path):
    procs = [_start(storage_url, "coordinator", tmp_path, 0.1, hold=True)]
    procs += [_start(storage_url, "worker", tmp_path, 0.1) for _ in range(2)]
    errors = [p.communicate(timeout=180)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errors
    study = _load(storage_url)
    complete = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    assert len(complete) == TRIALS  # none lost, none over budget
    assert sorted(_baseline_trials(study)) == ["all-bf16", "all-fp8", "all-nvfp4"]
    pids = {t.user_attrs["worker"]["pid"] for t in complete}
    assert len(pids) >= 2  # the work was really shared


def test_a_worker_killed_mid_trial_has_its_trial_retried_and_nothing_else_changes(storage_url, tmp_path):
    procs = [_start(storage_url, "coordinator", tmp_path, 1.5)]
    victim = _start(storage_url, "worker", tmp_path, 1.5)  # long trials: the kill lands inside one

    def victim_running() -> bool:
        try:
            study = _load(storage_url)
        except KeyError:
            return False
        return any(t.state == TrialState.RUNNING and t.user_attrs.get("worker", {}).get("pid") == victim.pid
                   for t in study.get_trials())

    end = time.monotonic() + 60
    while not victim_running():
        assert time.monotonic() < end, "the worker never started a trial"
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert procs[0].wait(timeout=180) == 0, procs[0].communicate()[1]
    study = _load(storage_url)
    trials = study.get_trials()
    killed = [t for t in trials if t.state == TrialState.FAIL]
    assert len(killed) == 1 and killed[0].user_attrs["worker"]["pid"] == victim.pid
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == killed[0].number]
    assert len(retried) == 1 and retried[0].state == TrialState.COMPLETE
    assert killed[0].params.items() <= retried[0].params.items()  # the params it had drawn before it died
    assert sum(t.state == TrialState.COMPLETE for t in trials) == TRIALS
    assert not [t for t in trials if t.state == TrialState.RUNNING]


runner = CliRunner()


@pytest.fixture(scope="module")
def postgres_run(tmp_path_factory, postgres_server):
    """A finished tiny search whose study lives in PostgreSQL, run through the CLI with a password."""
    from conftest import tiny_recipe_dict

    tmp = tmp_path_factory.mktemp("pg")
    url = postgres_server.create_database("tinyrun")
    recipe = tiny_recipe_dict(tmp / "runs", trials=4, sampler="random")
    path = tmp / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    res = runner.invoke(app, ["search", "-r", str(path), "--storage", url])
    assert res.exit_code == 0, res.output
    return tmp, path, url, postgres_server.password


def test_a_postgresql_password_never_reaches_a_file_or_the_output(postgres_run):
    tmp, path, url, password = postgres_run
    run_dir = tmp / "runs" / "t"
    outputs = [runner.invoke(app, ["report", str(run_dir), "--storage", url]).output,
               runner.invoke(app, ["show", str(run_dir)]).output,
               runner.invoke(app, ["search", "-r", str(path), "--storage", url]).output]  # refused: exists
    assert "already exists" in outputs[-1] and "***" in outputs[-1]
    for text in outputs:
        assert password not in text
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert password.encode() not in f.read_bytes(), f
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["storage"].startswith("postgresql") and ":***@" in summary["storage"]


def test_resume_and_worker_with_changed_settings_are_refused(postgres_run):
    tmp, path, url, _ = postgres_run
    resumed = runner.invoke(app, ["search", "-r", str(path), "--storage", url, "--resume", "--max-kl", "0.01"])
    assert resumed.exit_code == 2 and "accuracy.max_kl" in resumed.output
    from advisor.search.storage import open_storage

    study = optuna.load_study(study_name="t", storage=open_storage(url))
    key = study.user_attrs["study_key"]
    study.set_user_attr("study_key", {**key, "versions": {**key["versions"], "torch": "1.0.0"}})
    try:
        joined = runner.invoke(app, ["worker", "--study", "t", "--storage", url, "--work-dir", str(tmp / "w")])
    finally:
        study.set_user_attr("study_key", key)
    assert joined.exit_code == 2, joined.output
    assert "versions.torch" in joined.output and "Traceback" not in joined.output


UNREAPED_PARENT = textwrap.dedent("""
    import subprocess, sys
    # A coordinator whose worker child is its own, started and never waited for while it runs trials: killed,
    # the child stays a zombie until the end, and a signal probe of its pid succeeds.
    worker_script, url, out, delay, trials = sys.argv[1:6]
    child = subprocess.Popen([sys.executable, "-c", worker_script, url, "worker", out, delay, trials])
    print(child.pid, flush=True)
    sys.argv = ["x", url, "coordinator", out, delay, trials]
    exec(worker_script)
""")


def test_a_killed_child_of_the_coordinator_has_its_trial_retried_and_the_coordinator_ends(tmp_path):
    """kill -9 of a coordinator's own worker child inside a trial, on the journal (no heartbeat): the unreaped
    child is a zombie, which the old `os.kill(pid, 0)` probe took for alive, so its trial stayed RUNNING and
    the coordinator waited for it forever."""
    url = f"journal:{tmp_path / 'study.journal'}"
    parent = subprocess.Popen([sys.executable, "-c", UNREAPED_PARENT, WORKER, url, str(tmp_path), "1.0", "8"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    end = time.monotonic() + 60
    while not any(t.state == TrialState.RUNNING and t.user_attrs.get("worker", {}).get("pid") == child
                  for t in (_trials(url))):
        assert time.monotonic() < end, "the child never started a trial"
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    try:
        parent.wait(timeout=60)
    finally:
        parent.kill()
    assert parent.returncode == 0, parent.stderr.read()
    trials = _trials(url)
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 8
    killed = [t for t in trials if t.state == TrialState.FAIL]
    assert len(killed) == 1 and killed[0].user_attrs["worker"]["pid"] == child
    assert not [t for t in trials if t.state == TrialState.RUNNING]


def _trials(url: str) -> list:
    try:
        return _load(url).get_trials()
    except (KeyError, ValueError):
        return []


def test_run_search_counts_only_the_trials_it_finished_itself(tmp_path):
    """Two workers share one budget: each returns its own count (`advisor worker` printed every worker's)."""
    import threading

    from advisor.plan import LayerGroup
    from advisor.recipe import validate_recipe
    from advisor.search.study import open_study, run_search
    from advisor.testing import AdditiveEvaluator

    class Slow(AdditiveEvaluator):
        def evaluate(self, plan):
            time.sleep(0.05)
            return super().evaluate(plan)

    groups = tuple(LayerGroup(f"layers.{i}.qkv", (f"m{i}",), ((64, 64),)) for i in range(3))
    recipe = validate_recipe({"name": "d", "target": "b200", "out": str(tmp_path), "accuracy": {"max_kl": 0.1},
                              "storage": f"journal:{tmp_path / 'study.journal'}",
                              "search": {"trials": 10, "seed": 1, "sampler": "random"}})
    study = open_study(recipe, resume=False)
    counts: dict[str, int] = {}

    def worker(label: str) -> None:
        counts[label] = run_search(study, Slow(), recipe, groups, coordinator=label == "a",
                                   worker={"host": "h", "pid": os.getpid(), "gpu_uuid": label})
    threads = [threading.Thread(target=worker, args=(label,)) for label in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(complete) == 10 and sum(counts.values()) == 10
    for label in "ab":
        assert counts[label] == sum(t.user_attrs["worker"]["gpu_uuid"] == label for t in complete)


def test_a_trial_that_died_before_naming_its_worker_is_retried(tmp_path, monkeypatch):
    """Killed between Optuna creating the trial and the objective's first line: no pid to check, so its age
    decides (the journal has no heartbeat); the coordinator would otherwise wait for it forever."""
    from advisor.search.storage import reap

    study = optuna.create_study(storage=_journal(tmp_path), study_name="d")
    trial = study.ask()
    trial.suggest_categorical("layers.0.qkv", ["bf16", "fp8"])
    reap(study)
    assert study.get_trials()[0].state == TrialState.RUNNING  # young: it may still name itself
    monkeypatch.setattr("advisor.search.storage._recovery.UNNAMED_GRACE_S", 0.0)
    reap(study)
    trials = study.get_trials()
    assert trials[0].state == TrialState.FAIL and trials[1].state == TrialState.WAITING
    assert trials[1].system_attrs["failed_trial"] == 0


def _journal(tmp_path: Path) -> optuna.storages.BaseStorage:
    from advisor.search.storage import open_storage

    return open_storage(f"journal:{tmp_path / 'j.journal'}")


def test_spawned_workers_get_a_gpu_each_by_uuid(tmp_path, monkeypatch):
    """An index in CUDA_VISIBLE_DEVICES names a physical GPU, not the coordinator's cuda:i where it was itself
    started with a mapping (CUDA_VISIBLE_DEVICES=4,5,6): each worker is given its GPU's UUID."""
    from advisor.workflows import spawn

    monkeypatch.setattr(spawn, "visible_gpus", lambda: 3)
    monkeypatch.setattr("advisor.deploy.engine_slots.device_id", lambda i: f"GPU-uuid-of-cuda{i}")
    envs = []

    class Started:
        def __init__(self, cmd, env, stdout, stderr):
            envs.append(env)

        def wait(self):
            return 0

    monkeypatch.setattr(spawn.subprocess, "Popen", Started)
    spawn.spawn_workers(2, "sqlite:///x.db", "study", tmp_path)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["GPU-uuid-of-cuda1", "GPU-uuid-of-cuda2"]
