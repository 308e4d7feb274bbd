"""lm-eval harness: local tasks, seeded subsets, cache, rank correlation; parity with lm-eval's own HFLM."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from advisor.accuracy import harness
from advisor.accuracy.stats import spearman  # noqa: E402
from advisor.errors import InputError  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared"
TINY = SHARED / "models" / "tinystories-656k"
EVAL = SHARED / "data" / "eval"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"test data missing: {path} (expected ../shared next to the repository; see ../shared/README.md)")
    return path


# ---------------------------------------------------------------- pure helpers


def test_select_indices_is_seeded_sorted_and_full_when_no_limit():
    a = harness.select_indices(100, 10, seed=3)
    assert a == harness.select_indices(100, 10, seed=3)
    assert a != harness.select_indices(100, 10, seed=4)
    assert a == sorted(a) and len(set(a)) == 10 and all(0 <= i < 100 for i in a)
    assert harness.select_indices(100, None, 0) is None
    assert harness.select_indices(100, 100, 0) is None
    with pytest.raises(InputError, match="limit"):
        harness.select_indices(100, 0, 0)


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([0.01, 0.02, 0.5], [0.4, 0.39, 0.1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)  # ties get average ranks
    assert math.isnan(spearman([1], [2]))
    assert math.isnan(spearman([1, 1], [2, 3]))
    with pytest.raises(ValueError):
        spearman([1, 2], [1])


def test_cache_round_trip_and_key(tmp_path):
    cache = harness.ScoreCache(tmp_path)
    s = harness.TaskScore("piqa", 0.6, 0.05, 100, 100, 0, "local:x")
    assert cache.get("m", "p", "piqa", 100, 0) is None
    cache.put("m", "p", s)
    assert cache.get("m", "p", "piqa", 100, 0) == s
    for other in (("m2", "p", "piqa", 100, 0), ("m", "p2", "piqa", 100, 0), ("m", "p", "arc_easy", 100, 0),
                  ("m", "p", "piqa", None, 0), ("m", "p", "piqa", 100, 1)):
        assert cache.get(*other) is None
    (stored,) = tmp_path.glob("*.json")
    assert json.loads(stored.read_text())["key"]["plan_id"] == "p"


def test_local_task_configs_resolve_data_files(tmp_path):
    for name in harness.LOCAL_TASKS:
        assert (harness.local_task_dir() / f"{name}.yaml").is_file()
    cfg = harness.task_config("piqa", need(EVAL))
    assert cfg["dataset_path"] == "json"
    assert Path(cfg["dataset_kwargs"]["data_files"]["test"]) == (EVAL / "piqa.jsonl").resolve()
    assert harness.task_config("hellaswag", EVAL) is None  # standard names pass through to lm-eval
    assert harness.task_config("piqa", None) is None  # no data dir: lm-eval's own piqa
    with pytest.raises(InputError, match="piqa.jsonl does not exist"):
        harness.task_config("piqa", tmp_path)
    with pytest.raises(InputError, match="does not exist"):
        harness.task_config(str(tmp_path / "nope.yaml"), None)


def test_accuracy_table():
    s = harness.TaskScore("piqa", 0.6, 0.05, 100, None, 0, "x")
    table = harness.accuracy_table({"all-bf16": {"piqa": s}}, ["piqa", "arc_easy"])
    assert "| all-bf16 | 60.00 ± 5.00 (n=100) | – |" in table


# ---------------------------------------------------------------- against lm-eval itself (CPU, tiny model)


def _lambada_subset(tmp_path: Path, tokenizer, n: int = 12) -> Path:
    """A YAML task over the first ``n`` LAMBADA rows that this tokenizer can split.

    (lm-eval asserts when context+continuation tokenizes into no more tokens than the
    context alone; the 2048-token TinyStories tokenizer does that for ~4% of rows.)
    """
    rows = []
    for line in need(EVAL / "lambada_openai.jsonl").read_text().splitlines():
        r = json.loads(line)
        if len(tokenizer.encode(r["context"] + " " + r["continuation"])) > len(tokenizer.encode(r["context"])):
            rows.append(line)
        if len(rows) == n:
            break
    (tmp_path / "lambada_small.jsonl").write_text("\n".join(rows) + "\n")
    cfg = (harness.local_task_dir() / "lambada_openai.yaml").read_text()
    cfg = cfg.replace("task: lambada_openai", "task: lambada_small").replace(
        "test: lambada_openai.jsonl", "test: lambada_small.jsonl")
    path = tmp_path / "lambada_small.yaml"
    path.write_text(cfg)
    return path


def test_in_memory_score_equals_lm_eval_hflm_run(tmp_path):
    """Our BF16 score of the in-memory model == lm-eval's own `hf` model run, same items, every digit."""
    import lm_eval
    import torch

    from advisor.models.loading import load_model
    from advisor.recipe.schema import ModelSpec

    torch.set_num_threads(min(2, torch.get_num_threads()))
    lm = load_model(ModelSpec(source=str(need(TINY))))
    lambada = _lambada_subset(tmp_path, lm.tokenizer)
    tasks, limit, seed = ["piqa", "arc_easy", str(lambada)], 10, 0

    ours = harness.score_plan(lm.model, lm.tokenizer, "bf16", "tiny", tasks, limit=limit, seed=seed,
                              data_dir=need(EVAL), cache_dir=tmp_path / "cache", batch_size=4)
    assert set(ours) == {"piqa", "arc_easy", "lambada_small"}

    cfgs, samples = [], {}
    for task in tasks:
        cfg = harness.task_config(task, EVAL if not task.endswith(".yaml") else None)
        n_docs = len(Path(next(iter(cfg["dataset_kwargs"]["data_files"].values()))).read_text().splitlines())
        samples[cfg["task"]] = harness.select_indices(n_docs, limit, seed) or list(range(n_docs))
        cfgs.append(cfg)
    ref = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={TINY},dtype=bfloat16", tasks=cfgs, batch_size=4, device="cpu",
        samples=samples, bootstrap_iters=1000, log_samples=False,
    )
    for name, indices in samples.items():
        res = ref["results"][name]
        assert ours[name].acc == res["acc,none"], name
        assert ours[name].acc_stderr == res["acc_stderr,none"], name
        assert ours[name].n == ref["n-samples"][name]["effective"] == len(indices) == limit
        if "acc_norm,none" in res:
            assert ours[name].acc_norm == res["acc_norm,none"], name

    # a second call is served from the cache without running the model
    again = harness.score_plan(None, None, "bf16", "tiny", tasks, limit=limit, seed=seed,
                               data_dir=EVAL, cache_dir=tmp_path / "cache")
    assert again == ours


# ---------------------------------------------------------------- `advisor eval` flag errors (no model load)


@pytest.mark.parametrize(("args", "message"), [
    (["--limit", "0"], "--limit: must be at least 1"),
    (["--tasks", " , "], "--tasks: give at least one task"),
    (["--data-dir", "/nonexistent/dir"], "--data-dir: /nonexistent/dir is not a directory"),
    (["--device", "tpu"], "--device: got 'tpu'"),
])
def test_eval_command_flag_errors(args, message):
    import typer
    from typer.testing import CliRunner

    from advisor.cli.evaluate import eval_plan

    app = typer.Typer()
    app.command("eval")(eval_plan)
    app.command("other")(lambda: None)
    result = CliRunner().invoke(app, ["eval", "--plan", "bf16", *args])
    assert isinstance(result.exception, InputError)
    assert message in str(result.exception)


def test_eval_command_missing_task_data(tmp_path):
    import typer
    from typer.testing import CliRunner

    from advisor.cli.evaluate import eval_plan

    app = typer.Typer()
    app.command("eval")(eval_plan)
    app.command("other")(lambda: None)
    result = CliRunner().invoke(app, ["eval", "--plan", "bf16", "--tasks", "piqa", "--data-dir", str(tmp_path)])
    assert isinstance(result.exception, InputError)
    assert "piqa.jsonl does not exist" in str(result.exception)
