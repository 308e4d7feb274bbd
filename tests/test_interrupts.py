"""Ctrl-C and SIGTERM at chosen moments of the trial loop, in this process (the signal sent to itself lands
exactly there), and what a resume rebuilds from the study: every queued plan scored once, none twice.
The same through the CLI at the moments a user hits: tests/test_lifecycle.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
from optuna.trial import TrialState
from study_checks import assert_each_plan_scored_once

from advisor import console
from advisor.formats import Format
from advisor.interrupts import signals_handled
from advisor.plan import LayerGroup, Plan
from advisor.recipe import validate_recipe
from advisor.search.storage import retry_callback
from advisor.search.study import open_study, run_search
from advisor.testing import AdditiveEvaluator

GROUPS = tuple(LayerGroup(f"layers.{i}.{r}", (f"m{i}{r}",), ((64, 64),)) for i in range(3) for r in ("qkv", "down"))
TRIALS = 8
SIGNALS = [signal.SIGINT, signal.SIGTERM]


@pytest.fixture(autouse=True)
def ctrl_c_as_a_terminal_gives_it():
    """pytest started as a background job of a non-interactive shell has SIGINT ignored, and the handlers rightly
    leave an ignored signal ignored: these tests send Ctrl-C as a terminal would deliver it."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        yield
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        yield


@pytest.fixture
def recipe(tmp_path):
    recipe = validate_recipe({"name": "s", "target": "b200", "out": str(tmp_path), "accuracy": {"max_kl": 0.1},
                              "search": {"trials": TRIALS, "seed": 1, "sampler": "random"}})
    recipe.run_dir.mkdir(parents=True)
    return recipe


class Counting(AdditiveEvaluator):
    """Counts the plans it really scored (a resume is a new process: a new evaluator)."""

    def __init__(self) -> None:
        super().__init__()
        self.plans: list[str] = []

    def evaluate(self, plan: Plan):
        self.plans.append(plan.id)
        return super().evaluate(plan)


def _resume(recipe) -> tuple[optuna.Study, Counting]:
    study, evaluator = open_study(recipe, resume=True), Counting()
    run_search(study, evaluator, recipe, GROUPS)
    return study, evaluator


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_inside_optunas_storage_update_stops_after_the_trial_is_stored(recipe, sig):
    """The moment that broke Optuna's `_run_trial` (UnboundLocalError): the signal lands while Optuna stores a
    finished trial. It is noted, the trial is stored whole, and the loop stops before the next one."""
    study = open_study(recipe, resume=False)
    storage = study._storage
    store = storage.set_trial_state_values
    finished = []

    def set_state(trial_id, state, values=None):
        if state == TrialState.COMPLETE:
            finished.append(trial_id)
            if len(finished) == 3:
                os.kill(os.getpid(), sig)  # Python runs the handler here, inside Optuna's tell
        return store(trial_id, state, values)

    storage.set_trial_state_values = set_state
    with signals_handled(), pytest.raises(KeyboardInterrupt):
        run_search(study, AdditiveEvaluator(), recipe, GROUPS)
    states = [t.state for t in study.get_trials()]
    assert states[:3] == [TrialState.COMPLETE] * 3 and TrialState.FAIL not in states
    assert TrialState.RUNNING not in states
    study, evaluator = _resume(recipe)
    assert len(evaluator.plans) == TRIALS - 3
    assert_each_plan_scored_once(study, TRIALS)


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_inside_an_evaluation_ends_it_at_once_and_the_resume_scores_that_plan(recipe, sig):
    class Slow(AdditiveEvaluator):
        def evaluate(self, plan):
            if self.calls == 2:  # the third trial
                os.kill(os.getpid(), sig)
                time.sleep(30)  # a long evaluation: the signal ends it, nobody waits for it
            return super().evaluate(plan)

    study = open_study(recipe, resume=False)
    t0 = time.monotonic()
    with signals_handled(), pytest.raises(KeyboardInterrupt):
        run_search(study, Slow(), recipe, GROUPS)
    assert time.monotonic() - t0 < 20
    trials = study.get_trials()
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert len(failed) == 1 and failed[0].user_attrs.get("worker")  # Optuna stored it as failed
    retry = [t for t in trials if t.system_attrs.get("failed_trial") == failed[0].number]
    assert len(retry) == 1 and retry[0].state == TrialState.WAITING  # queued again, its plan with it
    assert retry[0].system_attrs.get("fixed_params", retry[0].params) == failed[0].system_attrs["fixed_params"]
    study, evaluator = _resume(recipe)
    assert Plan.from_params(failed[0].system_attrs["fixed_params"]).id in evaluator.plans
    assert_each_plan_scored_once(study, TRIALS)


def test_an_interrupt_a_library_wrapped_in_another_error_is_still_an_interrupt(recipe):
    """A KeyboardInterrupt raised inside a library's callback may come back as a RuntimeError (a plan's own error
    otherwise, never retried): while a signal is pending it is the interrupt, and the plan is queued again."""
    class Wrapping(AdditiveEvaluator):
        def evaluate(self, plan):
            if self.calls == 2:
                try:
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(30)
                except KeyboardInterrupt as exc:
                    raise RuntimeError("error in a callback") from exc
            return super().evaluate(plan)

    study = open_study(recipe, resume=False)
    with signals_handled(), pytest.raises(KeyboardInterrupt):
        run_search(study, Wrapping(), recipe, GROUPS)
    failed = [t for t in study.get_trials() if t.state == TrialState.FAIL]
    assert len(failed) == 1 and "error" not in failed[0].user_attrs
    study, _ = _resume(recipe)
    assert_each_plan_scored_once(study, TRIALS)


def test_a_second_signal_while_stopping_is_noted_not_raised(recipe):
    """Ctrl-C twice: the first stops the run, the second cannot cut the cleanup (the failed trial's retry)."""
    class Twice(AdditiveEvaluator):
        def evaluate(self, plan):
            if self.calls == 1:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(30)
            return super().evaluate(plan)

    from advisor.search.storage import retry_interrupted_trials as retry

    def retry_after_another_signal(study):
        os.kill(os.getpid(), signal.SIGTERM)
        return retry(study)

    study = open_study(recipe, resume=False)
    with signals_handled(), pytest.MonkeyPatch.context() as mp, pytest.raises(KeyboardInterrupt):
        mp.setattr("advisor.search.storage._budget.retry_interrupted_trials", retry_after_another_signal)
        run_search(study, Twice(), recipe, GROUPS)
    assert any("failed_trial" in t.system_attrs for t in study.get_trials())
    study, _ = _resume(recipe)
    assert_each_plan_scored_once(study, TRIALS)


def test_a_queued_trial_failed_before_its_params_were_set_is_queued_again_by_the_resume(recipe):
    """What an older advisor left after a SIGTERM (the reviewer's trial 4): a queued plan's trial failed with no
    params and no retry. The resume queues it again with its fixed params and scores it; the budget holds."""
    study = open_study(recipe, resume=False)
    run_search(study, AdditiveEvaluator(), recipe.model_copy(
        update={"search": recipe.search.model_copy(update={"trials": 3})}), GROUPS)
    plan = Plan({g.name: Format.FP8 if i else Format.NVFP4 for i, g in enumerate(GROUPS)})
    study.enqueue_trial(plan.params())
    trial = study.ask()
    study.tell(trial, state=TrialState.FAIL)
    assert study.get_trials()[-1].params == {}
    study, evaluator = _resume(recipe)
    assert plan.id in evaluator.plans
    assert_each_plan_scored_once(study, TRIALS)


def test_a_plan_the_study_scored_is_not_scored_again_by_a_resumed_process(recipe):
    """The record of scored plans is the study, not the process: a repeat after a resume takes the stored
    scores and is marked a repeat."""
    study = open_study(recipe, resume=False)
    run_search(study, AdditiveEvaluator(), recipe, GROUPS)
    bf16 = Plan.uniform(GROUPS, Format.BF16)
    study.enqueue_trial(bf16.params())  # as a sampler would propose it again
    more = recipe.model_copy(update={"search": recipe.search.model_copy(update={"trials": TRIALS + 1})})
    evaluator = Counting()
    run_search(open_study(more, resume=True), evaluator, more, GROUPS)
    assert evaluator.plans == []
    first, again = [t for t in study.get_trials() if t.user_attrs.get("plan_id") == bf16.id]
    assert again.user_attrs["repeat"] and not first.user_attrs["repeat"] and again.values == first.values


def test_a_plan_whose_own_evaluation_failed_is_not_retried_by_the_resume(recipe):
    class Broken(AdditiveEvaluator):
        def evaluate(self, plan):
            if plan.uniform_format() == Format.NVFP4:
                raise RuntimeError("CUDA out of memory")
            return super().evaluate(plan)

    study = open_study(recipe, resume=False)
    run_search(study, Broken(), recipe, GROUPS)
    failed = [t for t in study.get_trials() if t.state == TrialState.FAIL]
    assert len(failed) == 1 and "out of memory" in failed[0].user_attrs["error"]
    study, evaluator = _resume(recipe)
    assert evaluator.plans == [] and not any("failed_trial" in t.system_attrs for t in study.get_trials())


def test_two_retries_of_one_failed_trial_run_once(recipe):
    """Two processes queued one failed trial again at once: the second retry is turned away unscored."""
    study = open_study(recipe, resume=False)
    plan = Plan.uniform(GROUPS, Format.FP8)
    study.enqueue_trial(plan.params())
    failed = study.ask()
    study.tell(failed, state=TrialState.FAIL)
    retry = retry_callback(None)
    for _ in range(2):
        retry(study, study.get_trials()[failed.number])
    evaluator = Counting()
    run_search(study, evaluator, recipe, GROUPS)
    assert evaluator.plans.count(plan.id) == 1
    twin = [t for t in study.get_trials() if "duplicate_retry_of" in t.user_attrs]
    assert len(twin) == 1 and twin[0].state == TrialState.PRUNED
    assert_each_plan_scored_once(study, TRIALS)


def test_a_signal_whose_raise_python_swallowed_in_a_finalizer_is_raised_at_the_next_check(monkeypatch):
    """Raised inside a finalizer, a KeyboardInterrupt cannot propagate (Python only prints it): the signal stays
    noted, the next check between trials or stages raises it, and its traceback is not printed."""
    import sys

    from advisor.interrupts import check, stop_taken

    printed = []
    monkeypatch.setattr(sys, "unraisablehook", printed.append)  # what Python would print

    class Finalized:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, inside the finalizer

    with signals_handled():
        Finalized()  # collected at once
        with pytest.raises(KeyboardInterrupt):
            check()
        stop_taken()  # the command turned it into its stop
        check()
    assert printed == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_command_line_loads_exits_130_with_one_line(sig):
    """The `advisor` script's first second is imports: a signal there is an interrupt (exit 130, one `Error:`
    line), not Python's default (SIGTERM killed the process with no line)."""
    code = ("import os, signal, time\nfrom advisor import console\n"
            f"console._load_cli = lambda: (os.kill(os.getpid(), {int(sig)}), time.sleep(30))\nconsole.main()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 130, done
    assert done.stderr.splitlines() == [f"Error: {console.INTERRUPTED_STARTING}"]


def test_a_retry_another_process_has_just_taken_is_not_failed_as_its_dead_predecessor(recipe):
    """Optuna's retry copies the failed trial's user attributes; the dead process's name must not come with it, or
    a reaper that looks before the taker's objective names itself fails a running trial (seen in CI: the taker then
    broke with "Cannot tell a FAIL trial")."""
    from advisor.search.storage import WORKER_ATTR, reap, this_worker

    study = open_study(recipe, resume=False)
    dead = {**this_worker(), "pid": 2**22 + 7, "start_ticks": 1}  # no such process on this host
    study.enqueue_trial(Plan.uniform(GROUPS, Format.FP8).params())
    stranded = study.ask()
    stranded.set_user_attr(WORKER_ATTR, dead)
    study.tell(stranded, state=TrialState.FAIL)
    retry_callback(None)(study, study.get_trials()[stranded.number])
    taken = study.ask()  # another process takes the retry; its objective has not named it yet
    frozen = study.get_trials()[taken.number]
    assert frozen.system_attrs["failed_trial"] == stranded.number and WORKER_ATTR not in frozen.user_attrs
    reap(study)  # what every worker does before it takes a trial
    assert study.get_trials()[taken.number].state == TrialState.RUNNING


def test_an_error_a_library_raises_for_the_interrupt_outside_a_trial_is_the_interrupt(recipe):
    """A signal that lands inside an import's C initialisation comes out as ``ImportError: initialization failed``
    (seen in CI in the report stage, as exit 1 "a bug"): with the signal pending it is the interrupt, exit 130 and
    the resume line; without one, the error stands."""
    from advisor.errors import Interrupted
    from advisor.interrupts import deferred
    from advisor.workflows.search import interrupts_as_errors

    study = open_study(recipe, resume=False)
    resume = "advisor search -r r.yaml --resume"
    with signals_handled():
        with pytest.raises(Interrupted, match=f"continue with: {resume}"), interrupts_as_errors(study, recipe, resume):
            with deferred():
                os.kill(os.getpid(), signal.SIGTERM)  # noted
            raise ImportError("initialization failed")
        with pytest.raises(ImportError), interrupts_as_errors(study, recipe, resume):
            raise ImportError("initialization failed")
