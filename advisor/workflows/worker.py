"""`advisor worker`, top to bottom: join a study from any host, check that this worker's numbers
would be comparable, fetch the shared token sets, prepare the model side, run trials from
the study's shared budget until it is used, meter plans from the measurement queue on this GPU
(``--energy measured``), then leave. A child of `advisor search --workers N` (``ADVISOR_NODE`` set) is a rank of
its coordinator's node instead: it receives the recipe and the tokens from rank 0 and prepares the model side
and the sensitivity tables with the other ranks (:mod:`advisor.workflows.node`), then runs trials the same way.

The coordinator (`advisor search`) enqueues baselines and proposals, runs the lm-eval and
report stages and owns the run folder; a worker only evaluates trials and meters plans.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
from rich.console import Console

from advisor.errors import InputError, Interrupted
from advisor.files import temporary_folder
from advisor.interrupts import signals_handled, stop_taken
from advisor.recipe import validate_recipe
from advisor.search.storage import absolute_url, fetch_tokens, open_storage, redact_url
from advisor.search.study import (
    KEY_ATTR,
    check_same_key,
    check_same_model,
    check_same_scoring,
    finished_trials,
    make_sampler,
    run_search,
    silence_interrupt_tracebacks,
    study_key,
)
from advisor.search.trial_record import label_of
from advisor.versions import package_versions
from advisor.workflows.node import NODE_ENV, Node, finish_node, join_node
from advisor.workflows.progress import ProgressReporter
from advisor.workflows.run_settings import energy_tier, priced_engine


def run_worker(url: str, study_name: str, work_dir: Path | None = None, artifacts: Path | None = None,
               console: Console | None = None) -> int:
    """Returns how many trials this worker finished. Without ``work_dir`` it works in a temporary folder,
    removed however the worker ends. Ctrl-C and SIGTERM (the coordinator stopping it) stop it as they
    stop a search (``advisor.interrupts``): exit 130, its trial in flight failed and queued again."""
    with signals_handled():
        try:
            if work_dir is None:
                with temporary_folder(f"advisor-worker-{study_name}-") as folder:
                    return _run_worker(url, study_name, folder, artifacts, console)
            return _run_worker(url, study_name, work_dir, artifacts, console)
        except KeyboardInterrupt:
            stop_taken()
            raise Interrupted(f"interrupted: this worker's trial in flight, if any, is queued again in study "
                              f"{study_name!r}; its other processes go on") from None


def _run_worker(url: str, study_name: str, work_dir: Path, artifacts: Path | None, console: Console | None) -> int:
    progress = ProgressReporter(console or Console(stderr=True))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    silence_interrupt_tracebacks()
    url = absolute_url(url)
    work_dir = Path(work_dir)
    spec = os.environ.get(NODE_ENV)
    node = join_node(spec) if spec else None  # a child of `advisor search --workers`: a rank of its node
    with rank_failures_here(node):
        if node is not None:
            progress.print(f"joined the node as rank {node.ranks.rank} of {node.ranks.world} ({node.backend})")
            attrs = _study_attrs(url, study_name, need_recipe=False)
            attrs["recipe"] = node.ranks.broadcast(None)  # the coordinator's, before it stores it in the study
        else:
            attrs = _study_attrs(url, study_name)
        recipe = validate_recipe({**attrs["recipe"], "name": study_name, "out": str(work_dir), "storage": url},
                                 f"recipe stored in study {study_name!r}")
        key = study_key(recipe, package_versions(), energy_tier(recipe), priced_engine(recipe))
        check_same_key(attrs.get(KEY_ATTR), key, study_name, "advisor worker", asked_energy=recipe.energy)
        storage = open_storage(url, heartbeat_s=recipe.search.heartbeat_s)
        sampler = make_sampler(recipe.search.sampler, (recipe.search.seed + os.getpid()) % 2**32)
        study = optuna.load_study(study_name=study_name, storage=storage, sampler=sampler)

        if node is None:
            with progress.stage("fetch shared token sets"):
                key = fetch_tokens(study, recipe.run_dir / "tokens.pt", artifacts)
                (recipe.run_dir / "tokens.key.json").write_text(json.dumps(key, indent=2))
        from advisor.workflows.context import prepare

        with progress.stage("prepare") as stage:
            ctx = prepare(recipe, status=lambda msg: (stage.advance(note=msg), progress.step(f"  {msg}")),
                          stored_fingerprint=study.user_attrs.get("model", {}).get("fingerprint"),
                          ranks=node.ranks if node else None)
        if node is not None:
            if recipe.search.sampler == "guided":
                with progress.stage("sensitivity") as stage:
                    ctx.sensitivity(on_step=lambda done, total: stage.advance(done, total))
            finish_node(node)  # the coordinator has stored the model and queued the baselines and proposals
    check_same_model(study.user_attrs.get("model", {}).get("fingerprint"), ctx.fingerprint, study_name)
    check_same_scoring(study.user_attrs.get("device"), ctx.scoring_place, study_name, "advisor worker")
    with progress.stage("trials", total=recipe.search.trials) as stage:
        def on_trial(st: optuna.Study, t: optuna.trial.FrozenTrial) -> None:
            stage.advance(finished_trials(st))
            if not progress.terminal and t.values:
                progress.print(f"trial {t.number}: {label_of(t)} KL {t.values[0]:.4f}, "
                               f"{t.values[1]:.4g} J/token")

        finished = run_search(study, ctx, recipe, ctx.loaded.shape.groups, callbacks=[on_trial],
                              coordinator=False, worker=ctx.worker())
    if ctx.measured_model is not None:
        from advisor.workflows.measured_tier import worker_stage

        worker_stage(study, storage, ctx.measured_model, recipe, progress)
    return finished


@contextmanager
def rank_failures_here(node: Node | None) -> Iterator[None]:
    """A worker of a node leaves the group at once when it fails, so that no other rank waits for it."""
    try:
        yield
    except BaseException:
        if node is not None:
            node.abort()
        raise


def _study_attrs(url: str, study_name: str, need_recipe: bool = True) -> dict:
    try:
        study = optuna.load_study(study_name=study_name, storage=open_storage(url))
    except KeyError:
        raise InputError(f"advisor worker: no study named {study_name!r} in {redact_url(url)}; start it with "
                         "`advisor search ... --storage URL` first") from None
    attrs = dict(study.user_attrs)
    if need_recipe and "recipe" not in attrs:
        raise InputError(f"advisor worker: study {study_name!r} has no recipe yet (its coordinator is still "
                         "preparing, or it was made by an older advisor); retry in a minute")
    return attrs
