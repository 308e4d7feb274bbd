"""`advisor worker`: join a running study from this or any other host and evaluate its trials."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from advisor.cli.common import err, handle_errors, out
from advisor.workflows.spawn import STORAGE_ENV


@handle_errors
def worker(
    study: Annotated[str, typer.Option("--study", help="Study name (the run's --name).")],
    storage: Annotated[str, typer.Option(
        "--storage", envvar=STORAGE_ENV, show_envvar=True,
        help="The study's Optuna storage: postgresql://USER@HOST/DB (password from PGPASSWORD or ~/.pgpass, or "
             "in the URL through the environment variable), or journal:PATH on the coordinator's host.")],
    work_dir: Annotated[Path | None, typer.Option(
        "--work-dir", help="Folder for this worker's tokens and caches (default: a new temporary folder).")] = None,
    artifacts: Annotated[Path | None, typer.Option(
        "--artifacts", help="The study's artifact folder as mounted on this host (default: the coordinator's path).")]
        = None,
) -> None:
    """Evaluate trials of a running `advisor search` study until its trial budget is used.

    The worker refuses a study whose settings (model weights, token sets, formats, workloads,
    energy mode, budgets, library versions) would make its numbers incomparable.
    """
    from advisor.cli.runs import check_study_storage
    from advisor.workflows.outputs import check_output_dir
    from advisor.workflows.worker import run_worker

    check_study_storage(storage)  # an SQLite or journal path that does not exist would be created empty
    if work_dir is not None:
        check_output_dir(work_dir, "--work-dir")
    done = run_worker(storage, study, work_dir=work_dir, artifacts=artifacts, console=err)
    out.print(f"worker finished {done} trials of study {study!r}", highlight=False)
