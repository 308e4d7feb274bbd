"""The node (`advisor search --workers N`): the stages before the trials shared by the ranks of a real gloo group
on 127.0.0.1, two processes on the CPU. Tolerance: none. Every shared stage computes each of its items (a
calibration batch, a bank module, a reference batch, a sensitivity probe) exactly as one process does, and the
ranks only exchange the results or take their maximum, so every number equals one process's bit for bit
(``torch.equal``, float ``==``). A rank that fails or dies ends the others with one error, never a hang."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import node_ranks
import pytest
import torch
import yaml
from conftest import tiny_recipe_dict
from pg_server import free_port

ROOT = Path(__file__).resolve().parents[1]
ADVISOR = [sys.executable, "-c", "from advisor.console import main; main()"]


def _recipe(out: Path) -> dict[str, Any]:
    """Three calibration batches (rank 0 takes two, rank 1 one) and two reference batches (one each)."""
    data = tiny_recipe_dict(out)
    data |= {"formats": ["bf16", "fp8", "nvfp4"], "energy": "predicted",
             "calibration": {"num_samples": 24, "seq_len": 16, "heldout_samples": 8, "heldout_seq_len": 16}}
    data["search"] |= {"sensitivity_samples": 4}
    return data


def _spawn(fn: Any, world: int, *args: Any, timeout_s: float = 150) -> list[int | None]:
    mp = torch.multiprocessing.get_context("spawn")
    port = free_port()
    procs = [mp.Process(target=fn, args=(rank, world, port, *args)) for rank in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(deadline - time.monotonic(), 0.1))
    hung = [p for p in procs if p.is_alive()]
    for p in hung:
        p.kill()
    assert not hung, f"{len(hung)} ranks still running after {timeout_s} s"
    return [p.exitcode for p in procs]


def _same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a.view(torch.uint8) if a.is_floating_point() and a.element_size() == 1 else a,
                           b.view(torch.uint8) if b.is_floating_point() and b.element_size() == 1 else b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def test_every_shared_stage_gives_one_process_numbers_bit_for_bit(tmp_path, tiny_model_dir):
    recipe = _recipe(tmp_path / "runs")
    assert _spawn(node_ranks.run_rank, 2, recipe, str(tmp_path)) == [0, 0]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]

    torch.set_num_threads(1)
    one = node_ranks.prepare_here({**recipe, "out": str(tmp_path / "one")})
    one["ranges"] = node_ranks.ranges_without_data_on_one_rank({**recipe, "out": str(tmp_path / "one")}, None)
    for rank, got in enumerate(ranks):
        for stage in ("tokens", "bank", "pack_stats", "reference", "sensitivity", "mixed"):
            _same(got[stage], one[stage], f"rank {rank} {stage}")
    _same(ranks[0]["ranges"], one["ranges"], "ranges with no batch on rank 1")
    assert one["pack_stats"][0] > 0 and one["sensitivity"]["damage"]
    # each rank worked in every shared stage but the tokens, which rank 0 sampled alone
    assert ranks[0]["busy"]["tokens"] > 0 and "tokens" not in ranks[1]["busy"]
    for stage in ("load", "calibration", "bank", "reference", "sensitivity"):
        assert all(r["busy"][stage] > 0 for r in ranks), stage


def test_a_rank_that_fails_ends_the_other_at_once_naming_the_stage(tmp_path, tiny_model_dir):
    recipe = _recipe(tmp_path / "runs")
    codes = _spawn(node_ranks.run_rank_that_fails, 2, recipe, str(tmp_path), timeout_s=120)
    assert codes == [0, 2]
    seen = torch.load(tmp_path / "rank0.pt", weights_only=False)
    kind, stage, message = seen["outcome"]
    assert (kind, stage) == ("lost", "bank"), seen
    assert "another process of the node stopped answering during the bank stage" in message
    assert seen["waited_s"] < 60  # the group's timeout is 60 s: the failure was seen, not timed out


def _write_recipe(tmp_path: Path) -> Path:
    data = tiny_recipe_dict(tmp_path / "runs")
    data["search"] = {"trials": 4, "seed": 0, "sampler": "guided"}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_search_with_two_workers_reports_each_stage_per_rank(tmp_path, tiny_model_dir):
    path = _write_recipe(tmp_path)
    done = subprocess.run([*ADVISOR, "search", "-r", str(path), "--workers", "2"], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [x for x in done.stderr.splitlines() if x.startswith("node: ")]
    stages = [x.split()[1] for x in lines]
    assert stages == ["load", "tokens", "calibration", "bank", "reference", "sensitivity", "trials"], lines
    assert "on 1 of 2 ranks" in lines[1] and "on 2 of 2 ranks" in lines[3]
    timings = json.loads((tmp_path / "runs" / "t" / "summary.json").read_text())["timings_s"]
    assert timings["ranks"] == 2
    assert len(timings["bank_busy_s"]) == 2 and all(s > 0 for s in timings["bank_busy_s"])
    assert len(timings["trials_busy_s"]) == 2 and sum(timings["trials_busy_s"]) > 0
    assert (tmp_path / "runs" / "t" / "sensitivity.json").is_file()


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_a_worker_killed_in_the_node_stages_ends_the_search_with_one_error(tmp_path, tiny_model_dir):
    path = _write_recipe(tmp_path)
    search = subprocess.Popen([*ADVISOR, "search", "-r", str(path), "--workers", "2"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "runs" / "t" / "workers" / "worker-1.log"
    try:
        deadline = time.monotonic() + 90
        while not (log.is_file() and "joined the node" in log.read_text()):
            assert search.poll() is None and time.monotonic() < deadline, "the worker never joined"
            time.sleep(0.1)
        (worker,) = _children(search.pid)
        os.kill(worker, signal.SIGKILL)
        _, err = search.communicate(timeout=90)
    finally:
        search.kill()
    errors = [x for x in err.splitlines() if x.startswith("Error:")]
    assert search.returncode == 3, err[-3000:]
    assert len(errors) == 1, err[-3000:]
    assert f"worker-1 (rank 1 of 2, pid {worker}) was killed by SIGKILL during the node's" in errors[0]
    assert "no trial had run: run the same command again" in errors[0]
    assert "Traceback" not in err


def test_a_worker_refused_before_it_joins_passes_its_error_and_exit_code_on(tmp_path, tiny_model_dir):
    path = _write_recipe(tmp_path)
    run_dir = tmp_path / "runs" / "t"
    (run_dir / "workers").mkdir(parents=True)
    (run_dir / "workers" / "worker-1").write_text("a file where the worker's folder goes")
    done = subprocess.run([*ADVISOR, "search", "-r", str(path), "--workers", "2"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    errors = [x for x in done.stderr.splitlines() if x.startswith("Error:")]
    assert done.returncode == 2, done.stderr[-3000:]
    assert len(errors) == 1 and "worker-1 (rank 1 of 2" in errors[0] and "exited with code 2" in errors[0]
    assert "--work-dir" in errors[0] and "is a file" in errors[0]


@pytest.mark.parametrize("raw", ["0", "-5", "soon"])
def test_a_bad_node_timeout_is_refused(monkeypatch, raw):
    from advisor.errors import InputError
    from advisor.workflows.node import TIMEOUT_ENV, timeout_s

    monkeypatch.setenv(TIMEOUT_ENV, raw)
    with pytest.raises(InputError, match=TIMEOUT_ENV):
        timeout_s()


def test_the_node_benchmark_dry_run_compares_two_ranks_with_one(tmp_path):
    """benchmarks/device/node_search.py on the CPU (tiny shape, 1 and 2 ranks): the GPU run's script, checked here."""
    done = subprocess.run([sys.executable, "benchmarks/device/node_search.py", "all", "--dry-run", "--work",
                           str(tmp_path), "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "node_search.json").read_text())
    one, two = report["search"]
    assert (one["gpus"], two["gpus"], one["rc"], two["rc"]) == (1, 2, 0, 0)
    same = two["against_1_gpu"]  # the trials themselves differ: two processes draw plans from one study
    assert same["same_tokens"] and same["same_sensitivity"] and same["same_kl_in_both"], same
    assert same["plans_in_both"] >= 2  # the baselines at least
    assert len(two["timings_s"]["sensitivity_busy_s"]) == 2 and "sensitivity_busy_s" not in one["timings_s"]
    assert "| 2 | 0 |" in (tmp_path / "out" / "node_search.md").read_text()


def test_ranks_that_hold_other_weights_or_score_otherwise_are_refused_by_every_rank():
    from advisor.errors import SetupError
    from advisor.models.replicas import Ranks
    from advisor.workflows.context import check_same_replicas

    class Seen(Ranks):  # what a gather of two ranks returns, without a group
        def gather(self, obj):
            return [obj, ("f" * 64, "cpu (float32 arithmetic)")]

    check_same_replicas(Seen(0, 2), "f" * 64, "cpu (float32 arithmetic)")
    with pytest.raises(SetupError, match=r"rank 1: cpu \(float32 arithmetic\)"):
        check_same_replicas(Seen(0, 2), "f" * 64, "cpu")
    with pytest.raises(SetupError, match="rank 1: .* weights ffffffffffff"):
        check_same_replicas(Seen(1, 2), "e" * 64, "cpu (float32 arithmetic)")
