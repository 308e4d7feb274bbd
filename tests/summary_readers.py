"""What each command that reads a summary.json does with it before any model work, in one function: the
session hook in conftest.py applies it to every summary a test writes, tests/test_summaries_readable.py
to the varieties a search can produce (ties, one plan, no items, a summary of the older writer)."""

from __future__ import annotations

import json
from pathlib import Path

from advisor.deploy.verification import read_summary, stored_numbers, stored_plan, summary_recipe
from advisor.report.markdown import render_markdown
from advisor.report.schema import load_summary


def read_as_every_command(path: Path) -> None:
    """Raise (InputError or any other) where `show`, `report`, `export`, `recheck` or `verify` would refuse
    ``path``."""
    summary = load_summary(path)  # show
    for record in summary.trials:
        json.loads(record.model_dump_json())  # what show prints is JSON
    render_markdown(summary.model_dump(mode="json"))  # report, from the summary's own data
    if summary.recommendation is None:
        return  # export and recheck refuse a run without a recommendation, on purpose
    data = read_summary(path)  # export, recheck and verify
    plan, record = stored_plan(data, None, path)
    summary_recipe(data)
    stored_numbers(data, record)
