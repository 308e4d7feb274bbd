"""lm-eval items whose answer has no tokens of its own with the model's tokenizer are left out and
counted, never a crash. Issue 12: `advisor eval --plan fp8 --model tinystories-656k --tasks
lambada_openai --limit 10` ended in lm-eval's bare AssertionError."""

from __future__ import annotations

import json
import logging

import pytest
from bad_input_cases import EVAL_DATA, TINY_MODEL
from conftest import need
from typer.testing import CliRunner

from advisor.accuracy import harness
from advisor.accuracy.unscorable import continuation_tokens, drop_unscorable, unscorable_doc_ids
from advisor.cli import app

# The items `--limit 30` scores (seed 0): the first 30 of the seeded order, one of which has an
# answer the tiny model's tokenizer gives no tokens of its own (the issue's `--limit 10` drew one
# too, under the item order used before per-item acceptance).
SAMPLE = harness.select_indices(5153, 30, 0)


@pytest.fixture(scope="module")
def lambada_and_lm():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(need(TINY_MODEL))
    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL)
    (_, (task, _)), = harness.load_tasks(["lambada_openai"], need(EVAL_DATA)).items()
    task.set_config(key="num_fewshot", value=0)
    return task, harness.make_lm(model, tokenizer, batch_size=4)


def test_the_issue_command_scores_and_counts_the_unscorable_item(tmp_path, caplog):
    # The issue ran --plan fp8; which items cannot be scored depends on the tokenizer alone, and
    # bf16 skips ModelOpt's calibration (tens of seconds on two cores).
    out = tmp_path / "scores.json"
    result = CliRunner().invoke(app, [
        "eval", "--plan", "bf16", "--model", str(need(TINY_MODEL)), "--tasks", "lambada_openai",
        "--data-dir", str(need(EVAL_DATA)), "--limit", "30", "--out", str(out)])
    assert result.exit_code == 0, result.output
    (score,) = json.loads(out.read_text())["results"]
    assert (score["n"], score["unscorable"]) == (29, 1)
    assert "(n=29, acc)" in result.stdout
    assert any("1 of 30 items left out as unscorable" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)


def test_the_ids_found_are_items_whose_answer_has_no_tokens(lambada_and_lm):
    task, lm = lambada_and_lm
    (bad,) = unscorable_doc_ids(task, lm, SAMPLE)
    assert bad in SAMPLE
    # the same item alone, and with a scorable neighbour: lm-eval numbers a sample 0..k-1,
    # the ids returned are the task's own
    good = next(i for i in SAMPLE if i != bad)
    assert unscorable_doc_ids(task, lm, [bad]) == {bad}
    assert unscorable_doc_ids(task, lm, sorted([bad, good])) == {bad}
    task.build_all_requests(samples=[bad])
    assert [continuation_tokens(lm, *inst.args[:2]) for inst in task.instances] == [0]
    task.build_all_requests(samples=[good])
    assert all(continuation_tokens(lm, *inst.args[:2]) > 0 for inst in task.instances)


def test_drop_unscorable_keeps_the_rest_in_order(lambada_and_lm):
    task, lm = lambada_and_lm
    kept, count = drop_unscorable(task, lm, "lambada_openai", SAMPLE)
    assert count == 1 and len(kept) == 29 and kept == sorted(kept) and set(kept) < set(SAMPLE)


def test_a_score_without_the_count_reads_as_nothing_left_out():
    score = harness.TaskScore.from_items("piqa", "acc,none", {0: 1.0, 1: 0.0}, limit=2, seed=0, source="lm-eval")
    assert score.unscorable == 0
    assert harness.TaskScore.from_dict({k: v for k, v in score.to_dict().items() if k != "unscorable"}).unscorable == 0
