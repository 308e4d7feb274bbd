"""Interruptions, resumes and run folders: nothing finished is lost, nothing incomparable is mixed,
and a failed run never blocks the corrected one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
import pytest
import yaml
from study_checks import assert_each_plan_scored_once
from typer.testing import CliRunner

from advisor.cli import app
from advisor.recipe import validate_recipe
from advisor.search.study import open_study, run_search
from advisor.testing import AdditiveEvaluator

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "from advisor.console import main; main()"]  # what the `advisor` script runs
runner = CliRunner()
GROUPS_CODE = ('tuple(LayerGroup(f"layers.{i}.{r}", (f"m{i}{r}",), ((64, 64),)) '
               'for i in range(3) for r in ("qkv", "down"))')


def _study_recipe(tmp_path: Path, trials: int = 12):
    return validate_recipe({"name": "s", "target": "b200", "out": str(tmp_path), "accuracy": {"max_kl": 0.1},
                            "search": {"trials": trials, "seed": 1, "sampler": "random", "heartbeat_s": 1}})


SLOW_WORKER = textwrap.dedent(f"""
    import sys, time
    from advisor.plan import LayerGroup
    from advisor.recipe import validate_recipe
    from advisor.search.study import open_study, run_search
    from advisor.testing import AdditiveEvaluator

    class Slow(AdditiveEvaluator):
        def evaluate(self, plan):
            time.sleep(2.0)  # long trials: the kill lands inside one, not between two
            return super().evaluate(plan)

    recipe = validate_recipe({{"name": "s", "target": "b200", "out": sys.argv[1], "accuracy": {{"max_kl": 0.1}},
                              "search": {{"trials": 12, "seed": 1, "sampler": "random", "heartbeat_s": 1}}}})
    recipe.run_dir.mkdir(parents=True, exist_ok=True)
    study = open_study(recipe, resume=False)
    run_search(study, Slow(), recipe, {GROUPS_CODE})
""")


def _wait_for(predicate, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


def test_kill_9_mid_trial_then_resume_loses_nothing_and_retries_the_stranded_trial(tmp_path):
    recipe = _study_recipe(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", SLOW_WORKER, str(tmp_path)], cwd=ROOT)
    storage = recipe.storage_url

    def states():
        try:
            study = optuna.load_study(study_name="s", storage=storage)
        except Exception:
            return []
        return [t.state for t in study.get_trials(deepcopy=False)]

    _wait_for(lambda: states().count(optuna.trial.TrialState.COMPLETE) >= 3
              and optuna.trial.TrialState.RUNNING in states())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = optuna.load_study(study_name="s", storage=storage)
    done = {t.number: t.values for t in before.get_trials(states=(optuna.trial.TrialState.COMPLETE,))}
    stranded = next(t for t in before.get_trials() if t.state == optuna.trial.TrialState.RUNNING)

    from advisor.plan import LayerGroup

    groups = tuple(LayerGroup(f"layers.{i}.{r}", (f"m{i}{r}",), ((64, 64),)) for i in range(3) for r in ("qkv", "down"))
    study = open_study(recipe, resume=True)
    run_search(study, AdditiveEvaluator(), recipe, groups)
    trials = study.get_trials()
    assert {t.number: t.values for t in trials if t.number in done} == done  # nothing finished changed
    assert trials[stranded.number].state == optuna.trial.TrialState.FAIL
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == stranded.number]
    assert len(retried) == 1 and retried[0].state == optuna.trial.TrialState.COMPLETE
    assert stranded.params.items() <= retried[0].params.items()  # the params it had drawn before it died
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials) == 12


def _tiny_yaml(tmp_path: Path, tiny_recipe: dict, **changes) -> Path:
    data = {**tiny_recipe, "search": {"trials": 40, "seed": 0, "sampler": "random"}, **changes}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _tiny_recipe_file(tmp_path: Path, **calibration: int) -> Path:
    """recipes/tiny.yaml (guided: 3 baselines and knapsack proposals queued, 8 trials) writing into tmp_path."""
    data = yaml.safe_load((ROOT / "recipes" / "tiny.yaml").read_text())
    data["model"]["source"] = str((ROOT / data["model"]["source"]).resolve())
    data["calibration"].update(calibration)
    data["out"] = str(tmp_path / "runs")
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _search(path: Path, *flags: str, own_group: bool = False) -> subprocess.Popen:
    """The CLI as a terminal starts it: pytest run as a background job (`pytest &` in a non-interactive shell) has
    SIGINT ignored, which its children inherit, and the search would never see the Ctrl-C."""
    return subprocess.Popen([*CLI, "search", "-r", str(path), *flags], cwd=ROOT, stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, start_new_session=own_group,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _stop_after(proc: subprocess.Popen, finished: int, already: int, stop, delay_s: float) -> str:
    """Read its progress lines until ``finished`` trials of the study are done (and at least one by this
    process: a signal during its imports would find no handler yet), wait ``delay_s``, then ``stop()`` (unless
    it ended first); returns the stderr read so far."""
    seen, done = [], already
    while done < max(finished, already + 1):
        line = proc.stderr.readline()
        if not line:
            return "".join(seen)
        seen.append(line)
        done += line.startswith("trial ") and " KL " in line
    time.sleep(delay_s)
    stop()
    return "".join(seen)


@contextmanager
def _tiny_study(tmp_path: Path, journal: bool = False) -> Iterator[optuna.Study]:
    """The run's study, read with no connection left open after (the next process writes the same file)."""
    from advisor.search.storage import open_storage

    run_dir = tmp_path / "runs" / "tiny"
    url = f"journal:{run_dir / 'study.journal'}" if journal else f"sqlite:///{run_dir / 'study.db'}"
    storage = open_storage(url)
    try:
        yield optuna.load_study(study_name="tiny", storage=storage)
    finally:
        if isinstance(storage, optuna.storages.RDBStorage):
            storage.engine.dispose()


def _completed(tmp_path: Path) -> int:
    with _tiny_study(tmp_path) as study:
        return len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)))


SLOW_TRIALS = {"heldout_samples": 16, "heldout_seq_len": 64}  # about a second a trial: a signal lands inside one


@pytest.mark.parametrize("signals, calibration, delay_s", [
    ((signal.SIGTERM, signal.SIGINT, signal.SIGTERM), {}, 0.0),  # lands between trials, in Optuna's bookkeeping
    ((signal.SIGINT, signal.SIGTERM, signal.SIGINT), SLOW_TRIALS, 0.2),  # lands inside the next evaluation
], ids=["between-trials", "inside-a-trial"])
def test_signals_after_trials_1_3_and_7_then_resume_score_each_queued_plan_once(tmp_path, tiny_model_dir, signals,
                                                                                 calibration, delay_s):
    """SIGTERM behaves as Ctrl-C at every moment: exit 130 and one line naming the resume; after the lines of
    trials 1, 3 and 7 (the last of 8: the signal lands after the trials), each followed by --resume, the
    study holds 8 distinct plans, each scored once, every queued plan among them."""
    path = _tiny_recipe_file(tmp_path, **calibration)
    for i, (sig, finished) in enumerate(zip(signals, (2, 4, 8), strict=True)):
        already = _completed(tmp_path) if i else 0
        proc = _search(path, *(["--resume"] if i else []))  # after the read: SQLite may be locked while it writes
        err = _stop_after(proc, finished, already, lambda p=proc, s=sig: p.send_signal(s), delay_s)
        err += proc.communicate(timeout=300)[1]
        errors = [line for line in err.splitlines() if line.startswith("Error:")]
        assert "Traceback" not in err, err
        if proc.returncode == 0:  # the run ended before the last signal came
            assert finished == 8 and not errors, err
            continue
        assert proc.returncode == 130 and len(errors) == 1, err
        assert "interrupted:" in errors[0] and errors[0].endswith("--resume"), err
        with _tiny_study(tmp_path) as study:
            assert optuna.trial.TrialState.RUNNING not in [t.state for t in study.get_trials()]
    resumed = _search(path, "--resume")
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    with _tiny_study(tmp_path) as study:
        assert_each_plan_scored_once(study, 8)
    rows = json.loads((tmp_path / "runs" / "tiny" / "summary.json").read_text())["trials"]
    assert len({r["plan_id"] for r in rows}) == len(rows) == 8


def test_kill_9_of_a_workers_run_then_resume_scores_each_queued_plan_once(tmp_path, tiny_model_dir):
    """`--workers 2` killed with SIGKILL, coordinator and child together, inside a trial once the coordinator has
    finished two (the child takes trials from the same moment: about four in the study); the resume fails and
    retries what the dead processes left running, and re-scores nothing."""
    path = _tiny_recipe_file(tmp_path, **SLOW_TRIALS)
    proc = _search(path, "--workers", "2", own_group=True)
    _stop_after(proc, 2, 0, lambda: os.killpg(proc.pid, signal.SIGKILL), 0.2)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    resumed = _search(path, "--workers", "2", "--resume")
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    with _tiny_study(tmp_path, journal=True) as study:
        assert_each_plan_scored_once(study, 8)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_before_the_study_is_opened_exits_130_with_one_line(tmp_path, tiny_model_dir, sig):
    """An interrupt in the first seconds (the recipe read, the preflight) ends as every other one: exit 130 and
    one line, here that nothing was changed."""
    proc = _search(_tiny_recipe_file(tmp_path))
    first = proc.stderr.readline()  # the workloads line: the command runs
    proc.send_signal(sig)
    err = first + proc.communicate(timeout=60)[1]
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert proc.returncode == 130 and len(errors) == 1 and "run it again" in errors[0], err
    assert "Traceback" not in err


def test_a_failed_first_run_does_not_block_the_corrected_rerun(tmp_path, tiny_recipe):
    bad = _tiny_yaml(tmp_path, tiny_recipe, calibration={**tiny_recipe["calibration"],
                                                         "source": str(tmp_path / "missing.txt")})
    failed = runner.invoke(app, ["search", "-r", str(bad)])
    assert failed.exit_code == 2 and "missing.txt" in failed.output
    good = _tiny_yaml(tmp_path, tiny_recipe)
    rerun = runner.invoke(app, ["search", "-r", str(good), "--trials", "4"])
    assert rerun.exit_code == 0, rerun.output


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    from conftest import tiny_recipe_dict

    tmp = tmp_path_factory.mktemp("lifecycle")
    recipe = tiny_recipe_dict(tmp / "runs", trials=4, sampler="random")
    path = tmp / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    res = runner.invoke(app, ["search", "-r", str(path)])
    assert res.exit_code == 0, res.output
    return tmp, path


def test_a_moved_and_a_copied_run_folder_report_from_their_own_study(finished_run, tmp_path):
    src = finished_run[0] / "runs" / "t"
    copied = tmp_path / "copy"
    shutil.copytree(src, copied)
    (copied / "summary.json").unlink()
    moved = tmp_path / "moved"
    shutil.move(str(copied), moved)
    res = runner.invoke(app, ["report", str(moved)])
    assert res.exit_code == 0, res.output
    assert json.loads((moved / "summary.json").read_text())["run"] == "t"
    assert "sqlite:///study.db" in (moved / "recipe.json").read_text()  # relative, not the original's path


@pytest.mark.parametrize(("flags", "field"), [
    (["--max-kl", "0.01"], "accuracy.max_kl"),
    (["--model", "../shared/models/other"], "model.source"),
    (["--formats", "bf16,fp8"], "formats"),
    (["--target", "h100", "--formats", "bf16,fp8"], "target"),
    (["--batch-size", "64"], "workloads"),
    (["--tasks", "lambada_openai"], "benchmark.tasks"),
    (["--calibration", "../shared/data/text/tinystories_val.txt"], "calibration.source"),
])
def test_resume_with_a_changed_comparability_field_is_refused(finished_run, flags, field):
    tmp, path = finished_run
    stored = (tmp / "runs" / "t" / "recipe.json").read_text()
    res = runner.invoke(app, ["search", "-r", str(path), "--resume", *flags])
    assert res.exit_code == 2, res.output
    assert "Error:" in res.output and field in res.output and "Traceback" not in res.output
    assert (tmp / "runs" / "t" / "recipe.json").read_text() == stored


def test_resume_where_energy_auto_now_means_another_tier_is_refused(finished_run, monkeypatch):
    """`auto` chose the predicted tier on this CPU; with a GPU of the target kind it would measure: a real
    change, named. (`--energy predicted`, the tier `auto` chose, resumes: tests/test_run_paths.py.)"""
    from advisor.energy import prediction
    from advisor.formats import GPU

    tmp, path = finished_run
    monkeypatch.setattr(prediction, "gpu_here", lambda: (GPU.B200, "NVIDIA B200"))
    res = runner.invoke(app, ["search", "-r", str(path), "--resume"])
    assert res.exit_code == 2, res.output
    assert "energy: 'predicted' -> 'measured'" in res.output and "Traceback" not in res.output


def test_an_interrupt_inside_a_trial_logs_neither_its_parameters_nor_a_traceback():
    """Optuna logs a failed trial from ``optuna.study._optimize`` with its parameters and traceback, through the
    handlers of the ``optuna`` logger (a logger's own filters never see its children's records); an interrupt
    leaves only the caller's one-line resume hint, and other failures are still logged."""
    import io
    import logging

    from advisor.search.study import silence_interrupt_tracebacks

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)  # stands in for Optuna's default handler on stderr
    optuna_logger = logging.getLogger("optuna")
    optuna_logger.addHandler(handler)
    try:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        silence_interrupt_tracebacks()
        study = optuna.create_study()

        def objective(trial: optuna.Trial) -> float:
            trial.suggest_categorical("layers.0.qkv", ["bf16", "fp8"])
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            study.optimize(objective, n_trials=1)
        assert stream.getvalue() == ""

        def broken(trial: optuna.Trial) -> float:
            raise ValueError("a real failure")

        study.optimize(broken, n_trials=1, catch=(ValueError,))
        assert "a real failure" in stream.getvalue() and "Traceback" in stream.getvalue()
        again = optuna.create_study()  # its trial 0 fails for real: both of its lines are logged
        again.optimize(broken, n_trials=1, catch=(ValueError,))
        assert "Trial 0 failed with value" in stream.getvalue()
    finally:
        optuna_logger.removeHandler(handler)
