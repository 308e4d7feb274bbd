"""What a run resolves once, at its start: relative storage and model paths become absolute (so the run
is found again from any folder), and a resume compares what was resolved (a path written another way,
or `energy: auto` and the tier it stood for, is no change). A timeout that leaves no trial is an error."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from advisor.cli import app
from advisor.search.storage import absolute_url, open_storage
from advisor.search.study import check_same_key, key_differences

runner = CliRunner()


@pytest.fixture(scope="module")
def relative_run(tmp_path_factory):
    """A tiny search started in one folder with a relative --storage file and a relative model path."""
    from conftest import TINY_MODEL, tiny_recipe_dict

    tmp = tmp_path_factory.mktemp("paths")
    recipe = tiny_recipe_dict(Path("runs"), trials=3, sampler="random")
    recipe["model"]["source"] = os.path.relpath(TINY_MODEL, tmp)
    (tmp / "r.yaml").write_text(yaml.safe_dump(recipe))
    cwd = Path.cwd()
    os.chdir(tmp)
    try:
        res = runner.invoke(app, ["search", "-r", "r.yaml", "--storage", "sqlite:///rel.db"])
    finally:
        os.chdir(cwd)
    assert res.exit_code == 0, res.output
    return tmp


def test_a_relative_storage_is_stored_absolute_and_found_from_another_folder(relative_run, tmp_path, monkeypatch):
    stored = json.loads((relative_run / "runs" / "t" / "recipe.json").read_text())
    assert stored["storage_url"] == f"sqlite:///{relative_run / 'rel.db'}"
    assert Path(stored["recipe"]["model"]["source"]).is_absolute()
    (relative_run / "runs" / "t" / "summary.json").unlink()
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["report", str(relative_run / "runs" / "t")])
    assert res.exit_code == 0, res.output
    assert (relative_run / "runs" / "t" / "summary.json").is_file()


def test_resume_with_the_model_path_written_otherwise_and_the_tier_auto_chose_is_accepted(relative_run, monkeypatch):
    """From another folder, with the absolute model path and `--energy predicted` (what `auto` was on this
    CPU): the same run, so it resumes."""
    from conftest import TINY_MODEL

    monkeypatch.chdir(relative_run / "runs")
    res = runner.invoke(app, ["search", "-r", "../r.yaml", "--out", ".", "--storage", f"sqlite:///{relative_run}/rel.db",
                              "--model", str(TINY_MODEL), "--energy", "predicted", "--resume", "--trials", "3"])
    assert res.exit_code == 0, res.output


def test_a_timeout_that_leaves_no_trial_is_an_error_and_leaves_no_study(relative_run, monkeypatch):
    monkeypatch.chdir(relative_run)
    res = runner.invoke(app, ["search", "-r", "r.yaml", "--storage", "sqlite:///rel.db", "--name", "quick",
                              "--timeout", "1e-9"])
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "--timeout" in errors[0] and "before any trial finished" in errors[0]
    names = {s.study_name for s in open_storage(f"sqlite:///{relative_run}/rel.db").get_all_studies()}
    assert names == {"t"}  # its own empty study discarded: the rerun with a longer timeout just works
    assert not (relative_run / "runs" / "quick" / "summary.json").exists()


def test_absolute_url_resolves_files_only():
    cwd = os.getcwd()
    assert absolute_url("sqlite:///x.db") == f"sqlite:///{cwd}/x.db"
    assert absolute_url("sqlite:////abs/x.db?timeout=5") == "sqlite:////abs/x.db?timeout=5"
    assert absolute_url("journal:j/x.journal") == f"journal:{cwd}/j/x.journal"
    assert absolute_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert absolute_url("sqlite:///:memory:") == "sqlite:///:memory:"


def test_the_study_key_compares_paths_as_absolute_and_an_old_auto_with_auto(tmp_path, monkeypatch):
    from advisor.errors import InputError

    (tmp_path / "m").mkdir()
    monkeypatch.chdir(tmp_path)
    key = {"model": {"source": str(tmp_path / "m")}, "energy": "predicted"}
    assert key_differences({"model": {"source": "m"}, "energy": "predicted"}, key) == []
    assert key_differences({"model": {"source": "other/hub-id"}, "energy": "predicted"}, key) != []
    check_same_key({**key, "energy": "auto"}, key, "s", "--resume", asked_energy="auto")  # a study made before
    with pytest.raises(InputError, match="energy: 'measured' -> 'predicted'"):
        check_same_key({**key, "energy": "measured"}, key, "s", "--resume", asked_energy="auto")

