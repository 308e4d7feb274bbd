"""Bad input across all eight commands: each case ends with its exit code and exactly one `Error:`
line that names the problem and the fix, and never with a traceback. The cases and the files
they point at are in tests/bad_input_cases.py; `benchmarks/reliability_table.py` runs this file
and turns what it records into reports/reliability.md."""

from __future__ import annotations

import errno
import json
import os
import sys

import pytest
import torch
import yaml
from bad_input_cases import CASES, EVAL_DATA, TINY_MODEL, Case, build_workspace, tiny_recipe
from conftest import need
from typer.testing import CliRunner

from advisor.cli import app

runner = CliRunner()
COMMANDS = {"search", "report", "show", "eval", "export", "recheck", "profile", "measure"}
RECORD_ENV = "ADVISOR_RELIABILITY_LOG"  # a JSON-lines file: set by benchmarks/reliability_table.py


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, str]:
    """One finished tiny search (2 baselines, ~10 s) and the broken files the cases name."""
    need(TINY_MODEL)
    need(EVAL_DATA)
    runs = tmp_path_factory.mktemp("finished")
    recipe = runs / "tiny.yaml"
    recipe.write_text(yaml.safe_dump(tiny_recipe(runs)))
    result = runner.invoke(app, ["search", "-r", str(recipe)])
    assert result.exit_code == 0, result.output
    return build_workspace(tmp_path_factory.mktemp("ws"), runs / "tiny")


def _args(case: Case, workspace: dict[str, str]) -> list[str]:
    missing = [k for k in case.needs if k not in workspace]
    if missing:
        pytest.skip(f"this machine has no {', '.join(missing)} (e.g. a read-only folder for root)")
    if case.cpu_only and torch.cuda.is_available():
        pytest.skip("on a GPU machine the command runs for real")
    return [a.format(**workspace) for a in case.args]


def _record(case: Case, workspace: dict[str, str], result, error_lines: list[str], passed: bool) -> None:
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    message = error_lines[0] if len(error_lines) == 1 else " | ".join(error_lines) or "(no Error: line)"
    for key in ("ws", "run_out"):  # temporary paths, shown by name
        message = message.replace(workspace[key], f"${key.upper()}")
    with open(path, "a") as f:
        f.write(json.dumps({"case": case.id, "command": "advisor " + " ".join(case.args), "exit_code": result.exit_code,
                            "expected_exit": case.exit_code, "message": message, "passed": passed,
                            "added": case.added}) + "\n")


def _disk_full(monkeypatch) -> None:
    """Every file the advisor writes fails as on a full disk, where it writes it."""
    import advisor.files
    import advisor.report.plots

    def no_space(path, write):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(advisor.files, "replace_atomically", no_space)
    monkeypatch.setattr(advisor.report.plots, "replace_atomically", no_space)


def _hub_offline(monkeypatch) -> None:
    """The Hugging Face libraries in offline mode, as the CLI sets them where the hub does not resolve."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


FAULTS = {"disk full": _disk_full, "hub offline": _hub_offline}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_fails_clean(case: Case, workspace, monkeypatch):
    args = _args(case, workspace)
    for module in case.missing_modules:  # an import of it now raises ImportError
        monkeypatch.setitem(sys.modules, module, None)
    if case.fault is not None:
        FAULTS[case.fault](monkeypatch)
    result = runner.invoke(app, args)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    checks = {
        "exit code": result.exit_code == case.exit_code,
        "one Error: line": len(errors) == 1,
        "names the problem": bool(errors) and case.problem in errors[0],
        "names the fix": bool(errors) and case.fix in errors[0],
        "no traceback": "Traceback" not in result.output and (
            result.exception is None or isinstance(result.exception, SystemExit)),
        "stdout clean": "Error:" not in result.stdout,
        "no secret shown": not any(s in result.output for s in case.never_shown),
    }
    _record(case, workspace, result, errors, all(checks.values()))
    failed = [name for name, ok in checks.items() if not ok]
    assert not failed, f"{failed}: exit {result.exit_code}\n{result.output}"


def test_the_suite_covers_every_command_with_60_cases():
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)
    covered = {c.args[0] for c in CASES}
    assert covered >= COMMANDS, COMMANDS - covered


@pytest.mark.parametrize("where", ["before the command", "after the command", "after an argument"])
def test_debug_works_anywhere_and_keeps_the_exit_code(where, tmp_path):
    args = {"before the command": ["--debug", "show", str(tmp_path)],
            "after the command": ["show", "--debug", str(tmp_path)],
            "after an argument": ["show", str(tmp_path), "--debug"]}[where]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" in result.stderr and "InputError" in result.stderr
    assert sum(line.startswith("Error:") for line in result.stderr.splitlines()) == 1
    plain = runner.invoke(app, ["show", str(tmp_path)])  # and the switch does not stick
    assert plain.exit_code == 2 and "Traceback" not in plain.output


def test_debug_after_a_double_dash_is_an_argument():
    from advisor.cli.group import hoist_debug

    assert hoist_debug(["show", "x", "--debug"]) == ["--debug", "show", "x"]
    assert hoist_debug(["show", "--", "--debug"]) == ["show", "--", "--debug"]
    assert hoist_debug(["show", "x"]) == ["show", "x"]


def test_an_unexpected_exception_is_one_line_that_points_to_debug(monkeypatch, tmp_path):
    import advisor.report.schema as schema

    def broken(path):
        raise KeyError("shape")

    monkeypatch.setattr(schema, "load_summary", broken)
    (tmp_path / "summary.json").write_text("{}")
    result = runner.invoke(app, ["show", str(tmp_path)])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "Error: unexpected KeyError: 'shape' (a bug: rerun with --debug for the traceback and report it)"]
    debug = runner.invoke(app, ["show", str(tmp_path), "--debug"])
    assert debug.exit_code == 1 and "Traceback" in debug.stderr and "KeyError: 'shape'" in debug.stderr


def test_results_are_never_wrapped_off_a_terminal(capsys):
    from rich.table import Table

    from advisor.cli.common import out

    long_line = "-".join(str(i) for i in range(200))  # ~700 characters
    out.print(long_line)
    table = Table(title="title " + long_line)
    table.add_column("c")
    table.add_row(long_line)
    out.print(table)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == long_line
    assert lines[1].strip() == "title " + long_line
    assert any(long_line in line for line in lines[2:])


def test_a_missing_postgres_driver_names_an_installed_alternative(monkeypatch):
    from advisor.errors import SetupError
    from advisor.search.storage import check_storage_url

    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.setattr("advisor.search.storage._driver.module_installed", lambda module: module == "psycopg2")
    with pytest.raises(SetupError) as info:
        check_storage_url("postgresql://advisor:hunter2@db.example/studies")
    message = str(info.value)
    assert "pip install 'psycopg[binary]'" in message
    assert "or use the installed psycopg2 driver: postgresql+psycopg2://advisor:***@db.example/studies" in message
    assert "hunter2" not in message
