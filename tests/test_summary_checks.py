"""The one reader of summary.json (advisor.report.schema.load_summary, behind show, export, recheck and verify)
refuses what its shape allows but no search writes: a KL that is not a finite number >= 0, a J/token that is not
a finite number > 0, a plan id that is not its formats' hash, and a trial the summary names (the recommendation,
the front, the baselines, the near-ties) that is not among its trials. Each refusal is one InputError (exit 2)
that names the field; every summary a search wrote (the shipped reports) is read as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from advisor.errors import InputError
from advisor.report.schema import load_summary, summary_problem

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(ROOT.glob("reports/**/summary.json"))
QUICKSTART = ROOT / "reports" / "quickstart" / "summary.json"


@pytest.fixture
def summary() -> dict:
    return json.loads(QUICKSTART.read_text())


def _at(data: dict) -> int:
    """The index in ``trials`` of the recommended trial."""
    return next(i for i, t in enumerate(data["trials"]) if t["trial"] == data["recommendation"]["trial"])


def _refused(data: dict, tmp_path: Path) -> str:
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as info:
        load_summary(path)
    message = str(info.value)
    assert message.startswith(f"{path} is not a valid summary.json: ")
    assert "rebuild it with `advisor report RUN_DIR`" in message
    return message


def test_every_shipped_summary_is_read_as_written():
    assert len(SHIPPED) >= 5
    for path in SHIPPED:
        summary = load_summary(path)
        assert summary_problem(summary) is None, path


@pytest.mark.parametrize(("value", "shown"), [("NaN", "nan"), ("Infinity", "inf"), (-1, "-1.0"), (-1e-9, "-1e-09")])
def test_a_kl_that_is_no_finite_number_at_least_0_is_refused_by_its_field(summary, tmp_path, value, shown):
    summary["trials"][3]["kl"] = value
    assert f": trials.3.kl: got {shown}; a KL is a finite number >= 0;" in _refused(summary, tmp_path)


def test_the_recommendation_is_checked_as_a_trial_is(summary, tmp_path):
    summary["recommendation"]["kl"] = "NaN"
    assert ": recommendation.kl: got nan;" in _refused(summary, tmp_path)


@pytest.mark.parametrize("key", ["energy", "predicted_energy"])
@pytest.mark.parametrize(("value", "shown"), [("Infinity", "inf"), ("NaN", "nan"), (0, "0.0"), (-0.5, "-0.5")])
def test_a_j_per_token_that_is_no_finite_number_above_0_is_refused_by_its_field(summary, tmp_path, key, value,
                                                                                 shown):
    summary["trials"][2][key][0]["j_per_token"] = value
    message = _refused(summary, tmp_path)
    assert f": trials.2.{key}.0.j_per_token: got {shown}; a J/token is a finite number > 0;" in message


def test_a_plan_id_that_is_not_its_formats_hash_is_refused(summary, tmp_path):
    record = summary["trials"][4]
    group = next(iter(record["formats"]))
    record["formats"][group] = "nvfp4" if record["formats"][group] != "nvfp4" else "bf16"
    message = _refused(summary, tmp_path)
    assert f": trials.4.plan_id: {record['plan_id']} does not match its formats (their id is " in message


def test_a_format_the_advisor_does_not_know_is_refused(summary, tmp_path):
    record = summary["trials"][4]
    record["formats"][next(iter(record["formats"]))] = "int3"
    assert ": trials.4.formats: 'int3' is not a valid Format" in _refused(summary, tmp_path)


def test_a_recommendation_whose_trial_is_gone_is_refused(summary, tmp_path):
    rec = summary["recommendation"]
    summary["trials"].pop(_at(summary))
    message = _refused(summary, tmp_path)
    assert f": recommendation: trial {rec['trial']} (plan {rec['plan_id']}) is not among the trials;" in message


def test_a_recommendation_that_names_another_trials_number_is_refused(summary, tmp_path):
    rec = summary["recommendation"]
    other = next(t for t in summary["trials"] if t["trial"] != rec["trial"])
    rec["trial"] = other["trial"]
    message = _refused(summary, tmp_path)
    assert f": recommendation: trial {other['trial']} (plan {rec['plan_id']}) is not among the trials;" in message


def test_a_recommendation_that_differs_from_its_trial_is_refused_naming_both(summary, tmp_path):
    at = _at(summary)
    summary["recommendation"]["ppl"] = summary["trials"][at]["ppl"] * 2
    message = _refused(summary, tmp_path)
    assert f": recommendation.ppl: {summary['recommendation']['ppl']}, but trials.{at}.ppl (the recommended " \
           f"trial) is {summary['trials'][at]['ppl']};" in message


def test_a_recommendation_equal_to_its_trial_is_read_even_where_it_holds_nan(summary, tmp_path):
    """NaN is never equal to itself: the comparison must not take an undefined drop for an edit."""
    at = _at(summary)
    task = {"task": "piqa", "metric": "acc,none", "verdict": "undecided", "n_items": 0, "n_available": 0,
            "looks": 1, "drop": "NaN", "ci_low": "NaN", "ci_high": "NaN", "confidence": 0.95, "method": "paired"}
    for record in (summary["recommendation"], summary["trials"][at]):
        record["acceptance"] = {"verdict": "undecided", "tasks": [task]}
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    assert load_summary(path).recommendation.acceptance.tasks[0].n_items == 0


@pytest.mark.parametrize(("field", "edit"), [
    ("front_trials", lambda d: d["front_trials"].append(999)),
    ("near_ties", lambda d: d["near_ties"].append(999)),
    ("baselines.all-fp8", lambda d: d["baselines"].update({"all-fp8": 999})),
])
def test_a_trial_number_the_summary_names_must_be_one_of_its_trials(summary, tmp_path, field, edit):
    edit(summary)
    assert f": {field}: trial 999 is not among the trials;" in _refused(summary, tmp_path)


def test_a_front_plan_the_summary_names_must_be_one_of_its_trials(summary, tmp_path):
    summary["front"].append("000000000000")
    assert ": front: plan 000000000000 is not among the trials;" in _refused(summary, tmp_path)


def test_a_run_without_a_recommendation_is_still_read(summary, tmp_path):
    """Not every run recommends (none within the budget): `show --plan` reads it; export and recheck refuse it."""
    summary["recommendation"] = None
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    assert load_summary(path).recommendation is None
