"""lm-eval harness: local tasks, nested seeded subsets, per-item cache, task validation; parity with
lm-eval's own HFLM; a generative task on the tiny model."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from advisor.accuracy import harness  # noqa: E402
from advisor.errors import InputError  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared"
TINY = SHARED / "models" / "tinystories-656k"
EVAL = SHARED / "data" / "eval"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"test data missing: {path} (expected ../shared next to the repository; see ../shared/README.md)")
    return path


# ---------------------------------------------------------------- pure helpers


def test_select_indices_is_seeded_sorted_nested_and_full_when_no_limit():
    a = harness.select_indices(100, 10, seed=3)
    assert a == harness.select_indices(100, 10, seed=3)
    assert a != harness.select_indices(100, 10, seed=4)
    assert a == sorted(a) and len(set(a)) == 10 and all(0 <= i < 100 for i in a)
    assert set(a) < set(harness.select_indices(100, 20, seed=3))  # a larger subset holds a smaller one
    assert harness.item_order(100, 3)[:10] == harness.item_order(100, 3)[:20][:10]
    assert harness.select_indices(100, None, 0) is None
    assert harness.select_indices(100, 100, 0) is None
    with pytest.raises(InputError, match="limit"):
        harness.select_indices(100, 0, 0)


def _score(items: dict[int, float], limit: int | None = None) -> harness.TaskScore:
    return harness.TaskScore.from_items("piqa", "acc,none", items, limit=limit, seed=0, source="local:x", n_docs=10)


def test_task_score_summarizes_its_items_as_lm_eval_does():
    s = _score({3: 1.0, 1: 0.0, 7: 1.0, 2: 1.0})
    assert list(s.items) == [1, 2, 3, 7] and s.n == 4 and s.value == 0.75
    assert s.stderr == pytest.approx(math.sqrt(0.75 * 0.25 * 4 / 3) / 2)  # sample sd / sqrt(n)
    assert s.subset([1, 7], 2).value == 0.5
    assert harness.TaskScore.from_dict(s.to_dict()) == s
    assert s.to_dict(with_items=False)["items"] == {}


def test_cache_adds_items_across_batches_and_keys_by_plan_task_seed(tmp_path):
    cache = harness.ScoreCache(tmp_path)
    assert cache.get("m", "p", "piqa", [1, 2], 0) is None
    cache.put("m", "p", _score({1: 1.0, 2: 0.0}, limit=2))
    cache.put("m", "p", _score({5: 1.0, 6: 1.0}, limit=4))
    assert cache.get("m", "p", "piqa", [1, 2, 5, 6], 0, limit=4).value == 0.75
    assert cache.get("m", "p", "piqa", [1, 3], 0) is None  # item 3 was never scored
    for other in (("m2", "p", "piqa"), ("m", "p2", "piqa"), ("m", "p", "arc_easy")):
        assert cache.get(*other, [1, 2], 0) is None
    assert cache.get("m", "p", "piqa", [1, 2], 1) is None  # another seed
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
    s = harness.TaskScore("piqa", "acc,none", 0.6, 0.05, 100, None, 0, "x")
    table = harness.accuracy_table({"all-bf16": {"piqa": s}}, ["piqa", "arc_easy"])
    assert "| all-bf16 | 60.00 ± 5.00 (n=100, acc) | – |" in table


def test_validate_tasks_names_every_problem_before_loading(tmp_path):
    assert harness.validate_tasks(["piqa", "gsm8k"], need(EVAL)) == ["piqa", "gsm8k"]
    bad_metric = tmp_path / "bleu_task.yaml"
    bad_metric.write_text("task: bleu_task\ndataset_path: json\ndataset_kwargs: {data_files: {test: piqa.jsonl}}\n"
                          "output_type: generate_until\nmetric_list:\n  - metric: bleu\n    aggregation: bleu\n")
    with pytest.raises(InputError) as err:
        harness.validate_tasks(["piqa", str(bad_metric), "lambada_openai_typo", "mmlu", "piqa"], EVAL)
    msg = str(err.value)
    assert "aggregates with 'bleu'" in msg
    assert "unknown task 'lambada_openai_typo'" in msg and "did you mean lambada_openai" in msg
    assert "'mmlu' is a group" in msg
    assert "name one task twice" in msg
    with pytest.raises(InputError, match="piqa.jsonl does not exist"):
        harness.validate_tasks(["piqa"], tmp_path)


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
        assert ours[name].metric == "acc,none"
        assert ours[name].value == res["acc,none"], name
        assert ours[name].stderr == res["acc_stderr,none"], name
        assert ours[name].n == ref["n-samples"][name]["effective"] == len(indices) == limit
        assert sorted(ours[name].items) == indices and set(ours[name].items.values()) <= {0.0, 1.0}

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


# ---------------------------------------------------------------- a generative task on the tiny model


def _greedy_task(tmp_path: Path, model, tokenizer, n: int = 6, new_tokens: int = 10) -> Path:
    """A generate_until task whose targets are the model's own greedy continuations, computed with
    transformers the way lm-eval's HFLM generates (the tokenizer's special tokens, greedy, special
    tokens dropped from the text, cut at the stop strings and the EOS text)."""
    import torch

    stories = need(SHARED / "data" / "text" / "tinystories_val.txt").read_text().split("\n\n")
    rows = []
    for story in stories[:n]:
        prompt = " ".join(story.split()[:12])
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        target = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        for stop in (".", "\n", tokenizer.eos_token):  # lm-eval also stops at the EOS text
            target = target.split(stop)[0]
        rows.append(json.dumps({"prompt": prompt, "target": target}))
    (tmp_path / "greedy.jsonl").write_text("\n".join(rows) + "\n")
    path = tmp_path / "greedy.yaml"
    path.write_text(
        "task: greedy_echo\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: greedy.jsonl\n"
        "output_type: generate_until\ntest_split: test\ndoc_to_text: '{{prompt}}'\ndoc_to_target: '{{target}}'\n"
        f"generation_kwargs:\n  until: ['.', \"\\n\"]\n  do_sample: false\n  max_gen_toks: {new_tokens}\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n")
    return path


def test_generative_task_scores_exact_match_item_by_item_on_the_in_memory_model(tmp_path):
    """Targets are BF16's own greedy answers: BF16 matches every item; a damaged copy of the same
    in-memory model matches fewer, and the paired drop says so."""
    import copy

    import torch

    from advisor.models.loading import load_model
    from advisor.recipe.schema import ModelSpec
    from advisor.search.stats import paired_drop

    torch.set_num_threads(min(2, torch.get_num_threads()))
    lm = load_model(ModelSpec(source=str(need(TINY))))
    task = str(_greedy_task(tmp_path, lm.model, lm.tokenizer))
    bf16 = harness.score_plan(lm.model, lm.tokenizer, "bf16", "tiny", [task], cache_dir=tmp_path / "c",
                              batch_size=1)["greedy_echo"]
    assert bf16.metric == "exact_match,none" and bf16.n == 6
    assert bf16.items == {i: 1.0 for i in range(6)}

    damaged = copy.deepcopy(lm.model)
    with torch.no_grad():
        for p in damaged.parameters():
            p.add_(torch.randn_like(p) * p.float().std().to(p.dtype) * 0.5)
    worse = harness.score_plan(damaged, lm.tokenizer, "noisy", "tiny", [task], cache_dir=tmp_path / "c",
                               batch_size=1)["greedy_echo"]
    assert worse.value < 1.0 and set(worse.items.values()) <= {0.0, 1.0}
    drop = paired_drop([bf16.items[i] for i in range(6)], [worse.items[i] for i in range(6)], 0.95)
    assert drop.drop == pytest.approx(1.0 - worse.value) and 0 < drop.ci_low <= drop.drop <= drop.ci_high


def test_local_gsm8k_runs_as_a_generative_task(tmp_path):
    """The shipped GSM8K YAML on the tiny model: exact match of the last number, per item."""
    import torch

    from advisor.models.loading import load_model
    from advisor.recipe.schema import ModelSpec

    torch.set_num_threads(min(2, torch.get_num_threads()))
    lm = load_model(ModelSpec(source=str(need(TINY))))
    score = harness.score_plan(lm.model, lm.tokenizer, "bf16", "tiny", ["gsm8k"], limit=3, seed=0,
                               data_dir=need(EVAL), batch_size=3)["gsm8k"]
    assert score.metric == "exact_match,flexible-extract" and score.n == 3 and score.n_docs == 1319
    assert sorted(score.items) == harness.select_indices(1319, 3, 0)
    assert set(score.items.values()) <= {0.0, 1.0}


def test_lm_eval_bars_and_notices_stay_out_of_the_log(tmp_path, capfd):
    import lm_eval.models.huggingface as hf_module
    import tqdm

    from advisor.models.loading import load_model
    from advisor.recipe.schema import ModelSpec

    lm = load_model(ModelSpec(source=str(need(TINY))))
    scores = harness.score_plan(lm.model, lm.tokenizer, "bf16", "tiny", ["piqa"], limit=4, seed=0,
                                data_dir=need(EVAL), batch_size=4)
    assert scores["piqa"].n == 4
    err = capfd.readouterr().err
    assert "Running loglikelihood" not in err and "already-initialized" not in err, err[-500:]
    assert hf_module.tqdm is tqdm.tqdm  # put back


def test_the_preflight_accepts_every_local_task_and_refuses_a_metric_that_is_not_per_item(tmp_path):
    """gsm8k is generative (``exact_match``): the pre-flight checks the primary metric the scoring uses, not
    ``acc``; a task whose metric is a corpus-level aggregate cannot be compared item by item."""
    import yaml

    from advisor.accuracy.task_check import check_tasks

    check_tasks(list(harness.LOCAL_TASKS), need(EVAL))
    cfg = yaml.safe_load((Path(harness.__file__).parent / "tasks" / "piqa.yaml").read_text())
    cfg.update(task="piqa_corpus", metric_list=[{"metric": "perplexity", "aggregation": "perplexity",
                                                 "higher_is_better": False}])
    cfg["dataset_kwargs"]["data_files"]["test"] = str(need(EVAL) / "piqa.jsonl")
    path = tmp_path / "piqa_corpus.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(InputError, match="not a mean of per-item values"):
        check_tasks([str(path)], need(EVAL))


def test_cpu_default_batch_scores_every_request_as_one_at_a_time(tmp_path):
    """On a CPU lm-eval batches 8 requests (harness.default_batch_size); the log-likelihoods and the
    per-item scores are those of scoring one request at a time (in float32, as a CPU without BF16
    instructions scores: BF16's sums of log-probabilities keep 3 digits)."""
    import torch
    from lm_eval.api.instance import Instance

    from advisor.models.loading import load_model
    from advisor.recipe.schema import ModelSpec

    torch.set_num_threads(min(2, torch.get_num_threads()))
    lm = load_model(ModelSpec(source=str(need(TINY))))
    lm.model.float()
    assert harness.default_batch_size(lm.model) == 8
    rows = [json.loads(line) for line in need(EVAL / "piqa.jsonl").read_text().splitlines()[:12]]
    requests = [Instance("loglikelihood", row, (row["query"] + "Answer:", " " + choice), i)
                for i, row in enumerate(rows) for choice in row["choices"]]
    batched = harness.make_lm(lm.model, lm.tokenizer, batch_size=8).loglikelihood(requests)
    alone = harness.make_lm(lm.model, lm.tokenizer, batch_size=1).loglikelihood(requests)
    assert len(batched) == len(alone) == 24
    assert [a[1] for a in batched] == [b[1] for b in alone], (batched, alone)
    assert all(math.isclose(a[0], b[0], rel_tol=1e-5) for a, b in zip(batched, alone, strict=True)), (batched, alone)
    default = harness.score_plan(lm.model, lm.tokenizer, "bf16", "tiny", ["piqa"], limit=20, data_dir=EVAL)
    one = harness.score_plan(lm.model, lm.tokenizer, "bf16", "tiny", ["piqa"], limit=20, data_dir=EVAL, batch_size=1)
    assert default["piqa"].items == one["piqa"].items and len(one["piqa"].items) == 20
