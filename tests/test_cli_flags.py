"""What a newcomer meets first: help that matches the code, workload flags that edit instead of
replace, and progress lines when stderr is not a terminal."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from typer.testing import CliRunner

from advisor.cli import app
from advisor.errors import InputError
from advisor.recipe.choices import choices
from advisor.recipe.schema import Recipe, SearchSpec
from advisor.recipe.workload_flags import edit_workloads, parse_workload_flag
from advisor.workflows.progress import ProgressReporter

runner = CliRunner()


def _help(command: str) -> str:
    res = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200", "TERM": "dumb"})
    assert res.exit_code == 0
    return " ".join(res.output.split())


@pytest.mark.parametrize(("option", "model", "field"), [
    ("--sampler", SearchSpec, "sampler"), ("--energy", Recipe, "energy"), ("--target", Recipe, "target"),
    ("--device", Recipe, "device"), ("--engine", Recipe, "engine"),
])
def test_search_help_lists_exactly_the_schema_choices(option, model, field):
    text = _help("search")
    section = text[text.index(option):][:400]
    for value in choices(model, field):
        assert value in section, (option, value)
    default = model.model_fields[field].default
    assert f"default: {getattr(default, 'value', default)}" in section


WORKLOADS = [{"name": "chat", "batch_size": 16, "input_tokens": 512, "output_tokens": 256},
             {"name": "batch1", "batch_size": 1, "input_tokens": 512, "output_tokens": 256}]


def test_first_workload_flags_edit_it_and_keep_the_others():
    out = edit_workloads(WORKLOADS, {"batch_size": 64, "input_tokens": None, "output_tokens": None}, [])
    assert [w["name"] for w in out] == ["chat", "batch1"]
    assert out[0]["batch_size"] == 64 and out[1] == WORKLOADS[1]


def test_workload_flag_edits_a_named_workload_or_adds_one():
    out = edit_workloads(WORKLOADS, {}, ["batch1:batch=2", "long:input=8192,output=512"])
    assert [w["name"] for w in out] == ["chat", "batch1", "long"]
    assert out[1]["batch_size"] == 2 and out[1]["input_tokens"] == 512
    assert out[2]["input_tokens"] == 8192 and out[2]["output_tokens"] == 512


@pytest.mark.parametrize("bad", ["chat", "chat:", "chat:speed=3", "chat:batch=many", ":batch=3"])
def test_bad_workload_flags_name_the_problem(bad):
    with pytest.raises(InputError, match="--workload"):
        parse_workload_flag(bad)


def test_search_keeps_the_recipe_workloads_when_a_flag_edits_one(tmp_path):
    import yaml

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"workloads": WORKLOADS, "out": str(tmp_path / "runs"),
                                      "model": {"source": str(tmp_path / "no-model")}}))
    res = runner.invoke(app, ["search", "-r", str(recipe), "--batch-size", "64"])
    assert "workloads: chat: batch 64, 512 in / 256 out; batch1: batch 1, 512 in / 256 out" in res.output


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_progress_without_a_terminal_prints_a_line_at_least_every_interval():
    buf = io.StringIO()
    clock = FakeClock()
    reporter = ProgressReporter(Console(file=buf, force_terminal=False, width=200), clock=clock, interval_s=60,
                                heartbeat=False)
    with reporter.stage("sensitivity", total=100) as stage:
        for done in range(1, 101):
            clock.t += 2.0  # a 200 s stage
            stage.advance(done)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "sensitivity: started (100 steps)"
    assert lines[-1] == "sensitivity: finished in 3m20s"
    progress = [line for line in lines[1:-1]]
    assert len(progress) == 3  # at 60, 120 and 180 s
    assert progress[0] == "sensitivity: 30/100, elapsed 1m00s, ETA 2m20s"


def test_progress_heartbeat_reports_a_silent_stage():
    buf = io.StringIO()
    clock = FakeClock()
    reporter = ProgressReporter(Console(file=buf, force_terminal=False, width=200), clock=clock, interval_s=0.05)
    import time

    with reporter.stage("loading model"):
        clock.t = 61.0
        time.sleep(0.3)  # the heartbeat thread wakes every min(interval, 5 s)
    lines = buf.getvalue().splitlines()
    assert any(line.startswith("loading model: elapsed 1m01s") for line in lines), lines
