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

SAMPLE = harness.select_indices(5153, 10, 0)  # the items `--limit 10` scores (seed 0)


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
        "--data-dir", str(need(EVAL_DATA)), "--limit", "10", "--out", str(out)])
    assert result.exit_code == 0, result.output
    (score,) = json.loads(out.read_text())["results"]
    assert (score["n"], score["unscorable"]) == (9, 1)
    assert "(n=9)" in result.stdout
    assert any("1 of 10 items left out as unscorable" in r.getMessage()
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
    assert count == 1 and len(kept) == 9 and kept == sorted(kept) and set(kept) < set(SAMPLE)


def test_an_old_cached_score_reads_as_nothing_left_out():
    old = {"task": "piqa", "acc": 0.5, "acc_stderr": 0.1, "n": 10, "limit": 10, "seed": 0, "source": "lm-eval"}
    assert harness.TaskScore.from_dict(old).unscorable == 0
