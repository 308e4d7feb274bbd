"""The layout's promises: logic packages free of heavy imports, a light `--help`, small modules,
a versioned summary.json, and no storage password in what a run writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from advisor.cli import app
from advisor.search.storage import redact_text, redact_url, url_without_password

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "modelopt", "lm_eval", "pynvml", "transformers")


def _imported_after(code: str) -> list[str]:
    probe = f"{code}\nimport json, sys; print('HEAVY=' + json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    line = next(x for x in reversed(out.stdout.splitlines()) if x.startswith("HEAVY="))
    return json.loads(line.removeprefix("HEAVY="))


@pytest.mark.parametrize("package", ["search", "report", "recipe"])
def test_logic_packages_import_no_heavy_library(package):
    modules = sorted(p.stem for p in (ROOT / "advisor" / package).glob("*.py") if p.stem != "__init__")
    code = "; ".join(f"import advisor.{package}.{m}" for m in modules)
    assert _imported_after(code) == []


def test_help_imports_no_torch():
    code = ("import sys; sys.argv = ['advisor', '--help']\nfrom advisor.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass")
    assert _imported_after(code) == []


def test_search_help_imports_no_torch():
    code = ("import sys; sys.argv = ['advisor', 'search', '--help']\nfrom advisor.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass")
    assert "torch" not in _imported_after(code)


def test_no_module_is_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "advisor").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


def test_redaction_of_storage_urls():
    url = "postgresql+psycopg2://advisor:s3cr%40t@db.example:5432/studies"
    assert redact_url(url) == "postgresql+psycopg2://advisor:***@db.example:5432/studies"
    assert url_without_password(url) == "postgresql+psycopg2://advisor@db.example:5432/studies"
    assert "s3cr" not in redact_text(f"cannot open {url}: refused", url)
    assert redact_url("sqlite:///runs/q/study.db") == "sqlite:///runs/q/study.db"


def test_run_file_never_holds_the_password(tmp_path):
    from advisor.recipe import validate_recipe
    from advisor.workflows.search import write_run_file

    recipe = validate_recipe({"name": "r", "out": str(tmp_path),
                              "storage": "postgresql://advisor:hunter2@127.0.0.1:5432/advisor"})
    recipe.run_dir.mkdir(parents=True)
    write_run_file(recipe)
    text = (recipe.run_dir / "recipe.json").read_text()
    assert "hunter2" not in text and "postgresql://advisor@127.0.0.1:5432/advisor" in text


def _old_summary(tmp_path: Path) -> Path:
    """A summary.json as written before schema_version existed (format version 1)."""
    run = tmp_path / "old"
    run.mkdir()
    rec = {"plan_id": "abc", "label": "all-fp8", "formats": {"layers.0.qkv": "fp8"}, "kl": 0.01}
    (run / "summary.json").write_text(json.dumps({
        "tool": "precision-advisor", "version": "0.1.0", "recommendation": rec, "trials": [rec],
        "accuracy_budget": {"max_kl": 0.05}, "recipe": {}, "workloads": []}))
    return run


@pytest.mark.parametrize("command", ["show", "recheck"])
def test_previous_summary_version_is_refused_clearly(tmp_path, command):
    run = _old_summary(tmp_path)
    args = {"show": ["show", str(run)],
            "recheck": ["recheck", "--recommendation", str(run / "summary.json"), "--model", str(tmp_path)]}[command]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "Error:" in res.output and "schema version 1" in res.output and "advisor report" in res.output
    assert "Traceback" not in res.output
