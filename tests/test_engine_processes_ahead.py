"""Engine processes started one job ahead (advisor.deploy.vllm._rounds.processes_ahead): the job runs in a process
that was waiting with vLLM (here the fake) imported, the next one is started as a job is handed over, a job for
other GPUs gets a fresh process, and the spare left over ends with the block."""

from __future__ import annotations

import multiprocessing
import sys

from advisor.deploy.vllm import ServeJob, processes_ahead, run_in_child, run_rounds_in_child


def where_it_ran(job, more=None):
    """A child's target (module level, so a spawned process finds it): its process, and whether vLLM was imported
    before the job came."""
    import os

    if more is not None:
        assert more({}) == []
    return {"pid": os.getpid(), "vllm_ready": "vllm" in sys.modules, "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}


def waiting(before: frozenset[int] = frozenset()) -> set[int]:
    """This process's live children, less ``before`` (another test's that are still ending)."""
    return {p.pid for p in multiprocessing.active_children()} - before


def importable_fake_vllm(tmp_path, monkeypatch) -> None:
    """A ``vllm`` package a spawned process imports: the fake."""
    (tmp_path / "pkgs" / "vllm").mkdir(parents=True)
    (tmp_path / "pkgs" / "vllm" / "__init__.py").write_text(
        "import sys\nfrom advisor.testing_vllm import fake_vllm\nsys.modules[__name__] = fake_vllm()\n")
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))


def test_each_job_runs_in_a_process_started_ahead_with_vllm_imported(tmp_path, monkeypatch):
    importable_fake_vllm(tmp_path, monkeypatch)
    job = ServeJob(str(tmp_path), vocab_size=64)
    before = frozenset(waiting())

    fresh = run_in_child(job, target=where_it_ran)  # outside the block: a process of its own, nothing imported
    assert not fresh["vllm_ready"] and not waiting(before)

    with processes_ahead(("LlamaForCausalLM",)):
        ahead = waiting(before)
        assert len(ahead) == 1
        first = run_in_child(job, target=where_it_ran)
        assert first["pid"] in ahead and first["vllm_ready"]
        ahead = waiting(before)  # the next one, started when the first job was handed over
        assert len(ahead) == 1 and first["pid"] not in ahead
        second = run_rounds_in_child(job, lambda rows: [], "pip install vllm", target=where_it_ran)
        assert second["pid"] in ahead and second["vllm_ready"]
        other = run_in_child(ServeJob(str(tmp_path), vocab_size=64, devices=("1",)), target=where_it_ran)
        assert other["pid"] not in waiting(before) | ahead and other["visible"] == "1" and not other["vllm_ready"]
    assert not waiting(before)  # the spare left over ended with the block


def test_no_process_is_started_ahead_past_the_jobs_the_block_said(tmp_path, monkeypatch):
    """Two jobs said: the second runs in the spare started ahead of it, and none waits beside it (a spare importing
    vLLM during the last engine's start only slows that start)."""
    importable_fake_vllm(tmp_path, monkeypatch)
    job = ServeJob(str(tmp_path), vocab_size=64)
    before = frozenset(waiting())
    with processes_ahead(("LlamaForCausalLM",), jobs=2):
        first = run_in_child(job, target=where_it_ran)
        (ahead,) = waiting(before)
        second = run_in_child(job, target=where_it_ran)
        assert second["pid"] == ahead and second["vllm_ready"] and first["vllm_ready"]
        assert not waiting(before)
    with processes_ahead(jobs=0):
        assert not waiting(before)


def test_a_spare_says_when_its_import_ended(tmp_path, monkeypatch, capfd):
    """The clock time beside the meterings' (a host stall during one was suspected of a spare's import)."""
    importable_fake_vllm(tmp_path, monkeypatch)
    with processes_ahead(jobs=1):
        run_in_child(ServeJob(str(tmp_path), vocab_size=64), target=where_it_ran)
    said = [x for x in capfd.readouterr().err.splitlines() if x.startswith("the next engine's process has vLLM")]
    assert len(said) == 1 and said[0].endswith(" UTC)")  # the one spare the block started


def busy_a_long_while(job, more=None):
    """A child's target that takes long before its first round, as an engine starting or metering does."""
    import time

    time.sleep(120)
    return {}


def test_an_engine_killed_from_another_thread_ends_the_serving_thread_with_it(tmp_path, monkeypatch):
    """What stops a verify's early engine (verify_early.EarlyServing.stop): its process killed while its serving
    thread waits on it, so neither is left behind."""
    import threading
    import time

    from advisor.deploy.vllm import kill_engines
    from advisor.errors import UnsupportedError

    importable_fake_vllm(tmp_path, monkeypatch)
    before, outcome = frozenset(waiting()), {}

    def serving():
        try:
            run_rounds_in_child(ServeJob(str(tmp_path), vocab_size=64), lambda _rows: [], "pip install vllm",
                                target=busy_a_long_while)
        except UnsupportedError as exc:
            outcome["error"] = str(exc)

    thread = threading.Thread(target=serving)
    thread.start()
    deadline = time.monotonic() + 60
    while not waiting(before) and time.monotonic() < deadline:  # the engine's process is up
        time.sleep(0.1)
    started = time.monotonic()
    while thread.is_alive() and time.monotonic() - started < 30:  # its thread may not have listed it yet
        kill_engines()
        thread.join(timeout=0.5)
    assert not thread.is_alive()  # within 30 s, not the child's 120
    assert "died" in outcome["error"]
    assert not waiting(before)
