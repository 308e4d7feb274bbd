"""A study opened for a run: created, or loaded to resume, and never two runs' trials mixed (a name that exists
without ``--resume``, a study another run holds, a key that differs are refused); :func:`open_owned_study` also
claims it for this run (:mod:`advisor.search.storage`'s owner record)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna

from advisor.errors import InputError
from advisor.recipe.schema import Recipe
from advisor.search.storage import (
    SETTLE_S,
    StudyOwnership,
    claim_study,
    in_use_error,
    open_storage,
    owner_is_live,
    read_owner,
    redact_url,
)
from advisor.search.study._interrupt_log import silence_interrupt_tracebacks
from advisor.search.study._key import KEY_ATTR, check_same_key, study_key
from advisor.versions import package_versions


def make_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    """Samplers read the constraints that trials record with ``Trial.set_constraint``."""
    if name in ("tpe", "guided"):
        return optuna.samplers.TPESampler(seed=seed, multivariate=True)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise InputError(f"search.sampler: unknown sampler {name!r}; allowed: guided, tpe, nsga2, random")


def open_study(
    recipe: Recipe,
    resume: bool,
    key: dict[str, Any] | None = None,
    url: str | None = None,
    sampler: optuna.samplers.BaseSampler | None = None,
) -> optuna.Study:
    """Create the study, or load it when ``resume``; never silently mix two runs (see :func:`open_owned_study`,
    which also claims it for this run)."""
    return _open(recipe, resume, key, url, sampler)[0]


@dataclass
class OwnedStudy:
    """A study this run holds (:mod:`advisor.search.storage._ownership`); ``created``: by this run, now."""

    study: optuna.Study
    ownership: StudyOwnership
    created: bool

    def release(self, discard_if_empty: bool = False) -> None:
        """Give the study up; ``discard_if_empty``: delete it when this run created it and it holds no
        finished or running trial (a failed start leaves nothing that blocks the corrected rerun)."""
        self.ownership.release()
        if discard_if_empty and self.created and is_leftover(self.study):
            optuna.delete_study(study_name=self.study.study_name, storage=self.ownership.storage)


def open_owned_study(recipe: Recipe, resume: bool, key: dict[str, Any], warn: Callable[[str], None]) -> OwnedStudy:
    """:func:`open_study`, then this run's owner record on it: a study whose owner still runs is refused."""
    study, storage, created = _open(recipe, resume, key)
    study_id = storage.get_study_id_from_name(recipe.name)
    ownership = claim_study(storage, study_id, recipe.name, redact_url(recipe.storage_url), created, warn)
    return OwnedStudy(study, ownership, created)


def _open(
    recipe: Recipe,
    resume: bool,
    key: dict[str, Any] | None = None,
    url: str | None = None,
    sampler: optuna.samplers.BaseSampler | None = None,
) -> tuple[optuna.Study, optuna.storages.BaseStorage, bool]:
    """(study, storage, created). Refused: a name that exists without ``resume`` (whoever made it: no run
    deletes or reuses a study it did not create), a study another run is creating or running, a ``resume``
    of a missing study, a ``resume`` whose study key differs (the fields are named)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    silence_interrupt_tracebacks()
    key = key if key is not None else study_key(recipe, package_versions())
    sampler = sampler or make_sampler(recipe.search.sampler, recipe.search.seed)
    url = url or recipe.storage_url
    storage = open_storage(url, heartbeat_s=recipe.search.heartbeat_s)
    shown = redact_url(url)
    study_id = _study_id(storage, recipe.name)
    if study_id is not None:
        owner = _settled_owner(storage, study_id)
        if owner_is_live(owner):
            raise in_use_error(recipe.name, shown, owner)
    if study_id is not None and not resume:
        raise InputError(f"a study named {recipe.name!r} already exists in {shown}; "
                         "pass --resume to continue it, or choose another --name or --out")
    if resume and study_id is None:
        raise InputError(f"--resume: no study named {recipe.name!r} in {shown} to resume")
    if study_id is not None:
        try:
            study = optuna.load_study(study_name=recipe.name, storage=storage, sampler=sampler)
        except KeyError:  # its creator discarded it (a failed start) since we looked
            raise InputError(f"--resume: no study named {recipe.name!r} in {shown} to resume") from None
        check_same_key(study.user_attrs.get(KEY_ATTR), key, recipe.name, "--resume", asked_energy=recipe.energy)
        created = False
    else:
        try:
            study = optuna.create_study(study_name=recipe.name, storage=storage,
                                        directions=["minimize", "minimize"], sampler=sampler)
        except optuna.exceptions.DuplicatedStudyError:  # another run created it since we looked
            owner = _settled_owner(storage, _study_id(storage, recipe.name))
            raise in_use_error(recipe.name, shown, owner if owner_is_live(owner) else None) from None
        study.set_user_attr(KEY_ATTR, key)
        created = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(["kl", "j_per_token"])
    return study, storage, created


def _study_id(storage: optuna.storages.BaseStorage, name: str) -> int | None:
    try:
        return storage.get_study_id_from_name(name)
    except KeyError:
        return None


def _settled_owner(storage: optuna.storages.BaseStorage, study_id: int | None) -> dict[str, Any] | None:
    """The study's owner record, waiting once for a creator that is between create_study and its claim."""
    if study_id is None:
        return None
    try:
        owner = read_owner(storage, study_id)
        if owner is None:
            time.sleep(SETTLE_S)
            owner = read_owner(storage, study_id)
    except KeyError:  # deleted meanwhile by its creator
        return None
    return owner


def is_leftover(study: optuna.Study) -> bool:
    """A study that holds no finished and no running trial: what a run that failed early leaves."""
    states = {t.state for t in study.get_trials(deepcopy=False)}
    return not states & {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING}
