"""`advisor report` and `advisor show`: read a finished (or running) run back from its storage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from advisor.cli.common import handle_errors, out
from advisor.errors import InputError


def _open_run(run_dir: Path, storage: str | None):
    """The run's study; a SQLite or journal file inside the folder is found wherever the folder is."""
    import optuna

    from advisor.search.storage import open_storage, redact_url, resolve_url

    meta_path = run_dir / "recipe.json"
    if not meta_path.is_file():
        raise InputError(f"{run_dir} is not a run directory (no recipe.json); give the folder `advisor search` wrote")
    try:
        data = json.loads(meta_path.read_text())
        name = data["name"]
    except (ValueError, KeyError, TypeError):
        raise InputError(f"{meta_path} is not a run file `advisor search` wrote (unreadable JSON or no name)") from None
    url = storage or resolve_url(data.get("storage_url"), run_dir)
    try:
        return optuna.load_study(study_name=name, storage=open_storage(url))
    except KeyError:
        raise InputError(f"no study named {name!r} in {redact_url(url)}") from None


@handle_errors
def report(
    run_dir: Annotated[Path, typer.Argument(help="Run directory written by `advisor search`.")],
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL, if not the run's own.")] = None,
) -> None:
    """Rebuild report.md, the plots and summary.json from the study storage."""
    from advisor.report.summary import write_report

    study = _open_run(run_dir, storage)
    path = write_report(study, run_dir)
    out.print(str(path))


@handle_errors
def show(
    run_dir: Annotated[Path, typer.Argument(help="Run directory written by `advisor search`.")],
    plan: Annotated[str | None, typer.Option(help="Plan id to print (default: the recommendation).")] = None,
) -> None:
    """Print the recommendation (or one plan) as JSON: per-group formats and its numbers."""
    from advisor.report.schema import load_summary

    path = run_dir / "summary.json"
    if not path.is_file():
        raise InputError(f"{path} does not exist; run `advisor report {run_dir}` first")
    summary = load_summary(path)
    target = plan or (summary.recommendation.plan_id if summary.recommendation else None)
    record = summary.record(target) if target else None
    if record is None:
        known = ", ".join(sorted({r.plan_id for r in summary.trials})[:10])
        raise InputError(f"--plan: no plan {target!r} in {path}; known: {known}")
    out.print_json(record.model_dump_json())


