"""`advisor report` and `advisor show`: read a finished (or running) run back from its storage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from advisor.cli.common import handle_errors, out
from advisor.errors import AdvisorError, InputError, SetupError
from advisor.files import disk_full_message


def _open_run(run_dir: Path, storage: str | None):
    """The run's study; a SQLite or journal file inside the folder is found wherever the folder is."""
    import optuna

    from advisor.search.storage import open_storage, redact_text, redact_url, resolve_url

    meta_path = run_dir / "recipe.json"
    if not meta_path.is_file():
        raise InputError(f"{run_dir} is not a run directory (no recipe.json); give the folder `advisor search` wrote")
    try:
        data = json.loads(meta_path.read_text())
        name, stored = data["name"], data.get("storage_url")
        if not isinstance(name, str) or not isinstance(stored, str | None):
            raise TypeError(f"name {name!r} and storage_url {stored!r}: text expected")
        url = storage or resolve_url(stored, run_dir)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{meta_path} is not the run file `advisor search` writes ({type(exc).__name__}: {exc}); "
                         "it is written by `advisor search`: rerun the search") from None
    check_study_storage(url)
    try:
        return optuna.load_study(study_name=name, storage=open_storage(url))
    except KeyError:
        raise InputError(f"no study named {name!r} in {redact_url(url)}; pass --storage with the study's URL") from None
    except AdvisorError:
        raise
    except Exception as exc:  # noqa: BLE001 (SQLAlchemy and Optuna raise many kinds for a bad database)
        first = redact_text(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, url)
        raise InputError(f"cannot read study {name!r} from {redact_url(url)} ({first}); the database is damaged "
                         "or not an Optuna study: rerun `advisor search`, or pass --storage") from None


def check_study_storage(url: str) -> None:
    """The URL is usable and an SQLite or journal study exists (both would be created empty)."""
    from sqlalchemy.engine import make_url

    from advisor.search.storage import JOURNAL_PREFIX, check_storage_url

    if url.startswith(JOURNAL_PREFIX):
        if not Path(url.removeprefix(JOURNAL_PREFIX)).is_file():
            raise InputError(f"the study journal {url.removeprefix(JOURNAL_PREFIX)} does not exist; pass --storage "
                             "with the study's URL")
        return

    check_storage_url(url, folder_must_exist=False)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").is_file():
        raise InputError(f"the study database {parsed.database} does not exist; pass --storage with the study's "
                         "URL (e.g. sqlite:///RUN_DIR/study.db)")


@handle_errors
def report(
    run_dir: Annotated[Path, typer.Argument(help="Run directory written by `advisor search`.")],
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL, if not the run's own.")] = None,
) -> None:
    """Rebuild report.md, the plots and summary.json from the study storage."""
    from advisor.report.summary import write_report
    from advisor.workflows.outputs import check_output_dir

    study = _open_run(run_dir, storage)
    check_output_dir(run_dir, "RUN_DIR")
    try:
        path = write_report(study, run_dir)
    except OSError as exc:
        if (full := disk_full_message(exc)) is not None:
            raise SetupError(full) from None
        raise InputError(f"cannot write the report into {run_dir} ({exc.strerror}); make the folder writable") from None
    out.print(str(path))


@handle_errors
def show(
    run_dir: Annotated[Path, typer.Argument(help="Run directory written by `advisor search` (or its summary.json).")],
    plan: Annotated[str | None, typer.Option(help="Plan id to print (default: the recommendation).")] = None,
) -> None:
    """Print the recommendation (or one plan) as JSON: per-group formats and its numbers."""
    from advisor.report.schema import load_summary, plan_ids_listed

    path = run_dir if run_dir.is_file() else run_dir / "summary.json"
    if not run_dir.exists():
        raise InputError(f"{run_dir} does not exist; give the folder `advisor search` wrote (or its summary.json)")
    if not path.is_file() and not (run_dir / "recipe.json").is_file():
        raise InputError(f"{path} does not exist and {run_dir} is not a run directory (no recipe.json); give the "
                         "folder `advisor search` wrote (or its summary.json)")
    if not path.is_file():
        raise InputError(f"{path} does not exist; run `advisor report {run_dir}` first (a run stopped before its "
                         "first trial has nothing to report: continue it with `advisor search ... --resume`)")
    summary = load_summary(path)
    known = plan_ids_listed(r.plan_id for r in summary.trials)
    if not summary.trials:
        raise InputError(f"{path} holds no finished trial; run `advisor search` (with --resume) to finish some")
    if plan is None and summary.recommendation is None:
        raise InputError(f"{path} holds no recommendation; pass --plan with one of its plans: {known}")
    target = plan or summary.recommendation.plan_id
    record = summary.record(target)
    if record is None:
        raise InputError(f"--plan: no plan {target!r} in {path}; known: {known}")
    out.print_json(record.model_dump_json())


