"""Whatever a search writes, every command reads: `report`, `show`, `export` and `recheck` run over
each variety of summary a finished search can leave: lm-eval scores that tie for every plan (the
slope interval is undefined), a judged task with no items, a run of one plan, a normal run, and a
summary of the older writer that held an undefined interval as [null, null].

The varieties come from one real tiny search (3 baselines); lm-eval results are stored in its study
through the search's own API (record_benchmark, paired_drop) instead of scoring real items, which
would take minutes and could not force a tie."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import TINY_MODEL, need, tiny_recipe_dict
from summary_readers import read_as_every_command
from typer.testing import CliRunner

from advisor.cli import app
from advisor.search.acceptance import PlanAcceptance, TaskAcceptance, Verdict
from advisor.search.stats import paired_drop
from advisor.search.trial_record import record_benchmark

runner = CliRunner()
TASK = "lambada_openai"


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished tiny search: all-bf16, all-fp8 and all-nvfp4, no lm-eval."""
    need(TINY_MODEL)
    root = tmp_path_factory.mktemp("finished")
    recipe = tiny_recipe_dict(root / "runs", trials=3, sampler="random")
    recipe["formats"] = ["bf16", "fp8", "nvfp4"]
    (root / "r.yaml").write_text(yaml.safe_dump(recipe))
    result = runner.invoke(app, ["search", "-r", str(root / "r.yaml")])
    assert result.exit_code == 0, result.output
    return root / "runs" / "t"


def _copy(run: Path, where: Path) -> tuple[Path, optuna.Study]:
    copy = where / run.name
    shutil.copytree(run, copy)
    meta = json.loads((copy / "recipe.json").read_text())
    return copy, optuna.load_study(study_name=meta["name"], storage=f"sqlite:///{copy / 'study.db'}")


def _score(value: float, n: int) -> dict:
    return {"task": TASK, "metric": "acc,none", "value": value, "stderr": 0.0, "n": n, "n_docs": 5153,
            "higher_is_better": True}


def _judge(study: optuna.Study, reference: list[int], plan_items: dict[str, list[int]]) -> None:
    """Store lm-eval results as the benchmark stage does: BF16 scored, each other plan judged against it."""
    plans = {t.user_attrs["label"]: t.user_attrs["plan_id"] for t in study.trials}
    record_benchmark(study, plans["all-bf16"], {TASK: _score(sum(reference) / max(len(reference), 1),
                                                             len(reference))})
    for label, items in plan_items.items():
        interval = paired_drop(reference, items, 0.95)
        task = TaskAcceptance(TASK, "acc,none", 5153, 1, interval, Verdict.UNDECIDED)
        record_benchmark(study, plans[label], {TASK: _score(sum(items) / max(len(items), 1), len(items))},
                         PlanAcceptance(Verdict.UNDECIDED, (task,)).to_dict())


def _ties(run: Path, where: Path) -> Path:
    copy, study = _copy(run, where)
    _judge(study, [0, 0, 0, 0], {"all-fp8": [0, 0, 0, 0], "all-nvfp4": [0, 0, 0, 0]})
    return copy


def _no_items(run: Path, where: Path) -> Path:
    copy, study = _copy(run, where)
    _judge(study, [], {"all-fp8": [], "all-nvfp4": []})
    return copy


def _one_plan(run: Path, where: Path) -> Path:
    """The run with only its first (all-bf16) trial: a search stopped after one plan."""
    copy, old = _copy(run, where)
    (copy / "study.db").unlink()
    new = optuna.create_study(study_name=old.study_name, storage=f"sqlite:///{copy / 'study.db'}",
                              directions=old.directions)
    for key, value in old.user_attrs.items():
        new.set_user_attr(key, value)
    new.add_trial(old.trials[0])
    return copy


def _older_writer(run: Path, where: Path) -> Path:
    """The ties run's summary as the writer before 'undefined' left it: NaN written as null."""
    copy = _ties(run, where)
    assert runner.invoke(app, ["report", str(copy)]).exit_code == 0
    data = json.loads((copy / "summary.json").read_text())
    for fit in data["proxy_calibration"]:
        fit.pop("undefined")
        fit["slope_ci"] = [None, None]
    (copy / "summary.json").write_text(json.dumps(data))
    return copy


VARIETIES = {"normal": None, "ties": _ties, "no items": _no_items, "one plan": _one_plan,
             "older writer's nulls": _older_writer}


@pytest.mark.parametrize("variety", list(VARIETIES))
def test_every_command_reads_every_variety(variety, finished, tmp_path):
    make = VARIETIES[variety]
    run = finished if make is None else make(finished, tmp_path)
    if variety != "older writer's nulls":  # report rebuilds from the study; the older summary is read as is
        result = runner.invoke(app, ["report", str(run)])
        assert result.exit_code == 0, result.output
    read_as_every_command(run / "summary.json")
    summary = json.loads((run / "summary.json").read_text())
    commands = {
        "show": ["show", str(run)],
        "export": ["export", str(run), "--out", str(tmp_path / "export")],
        "recheck": ["recheck", "--recommendation", str(run), "--model", str(TINY_MODEL), "--out",
                    str(tmp_path / "recheck")],
    }
    for name, args in commands.items():
        result = runner.invoke(app, args)
        assert result.exit_code == 0, f"{name}: {result.output}"
    if variety == "ties":
        fit = summary["proxy_calibration"][0]
        assert fit["slope_ci"] is None and "same drop" in fit["undefined"]["slope_ci"]
        assert "slope 95% interval undefined: every scored plan has the same drop" in (run / "report.md").read_text()
    if variety == "no items":
        tasks = [t for r in summary["trials"] if r["acceptance"] for t in r["acceptance"]["tasks"]]
        assert tasks and all(t["n_items"] == 0 and t["drop"] == "NaN" and t["verdict"] == "undecided" for t in tasks)
        assert "drop undefined: no items scored" in (run / "report.md").read_text()
    if variety == "one plan":
        assert [r["label"] for r in summary["trials"]] == ["all-bf16"]


def test_report_replaces_symlinks_in_the_run_folder_and_writes_nothing_outside(finished, tmp_path):
    run, _ = _copy(finished, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("report.md", "summary.json", "front.png"):
        (outside / name).write_text("not the advisor's")
        (run / name).unlink()
        (run / name).symlink_to(outside / name)
    result = runner.invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    assert all((outside / n).read_text() == "not the advisor's" for n in ("report.md", "summary.json", "front.png"))
    assert not any((run / n).is_symlink() for n in ("report.md", "summary.json", "front.png"))
    assert json.loads((run / "summary.json").read_text())["tool"] == "precision-advisor"
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]


REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted(str(p.relative_to(REPO)) for p in (REPO / "reports").rglob("verify.json")))
def test_every_shipped_verify_json_reads_as_verify_wrote_it(path):
    """One reader of verify.json (advisor.report.load_verify): the files kept in reports/ read back typed, each
    operating point's numbers in the summary's own point records, and write back to the same data."""
    from advisor.report import load_verify

    root = REPO
    result = load_verify(root / path)
    assert result.plans and all(r.plan_id for r in result.plans)
    again = json.loads(result.model_dump_json())
    original = json.loads((root / path).read_text())
    assert [p["plan_id"] for p in again["plans"]] == [p["plan_id"] for p in original["plans"]]
    for mine, theirs in zip(again["plans"], original["plans"], strict=True):
        for o, t in zip(mine["operating"], theirs.get("operating") or [], strict=True):
            assert {k: o["vllm"][k] for k in t["vllm"] if k in o["vllm"]} == {
                k: v for k, v in t["vllm"].items() if k in o["vllm"]}


def test_a_verify_json_that_is_not_verifys_is_one_error_naming_the_field(tmp_path):
    from advisor.errors import InputError
    from advisor.report import load_verify

    bad = tmp_path / "verify.json"
    bad.write_text(json.dumps({"run": "r", "engine": "vllm", "vllm_version": "0.26.0", "gpu": "H100",
                               "date": "2026-11-29", "verified": True, "plans": [{"role": "bf16"}]}))
    with pytest.raises(InputError, match=r"plans\.0\.plan_id: Field required"):
        load_verify(bad)
    with pytest.raises(InputError, match="does not exist"):
        load_verify(tmp_path / "none.json")
