"""What a run resolves once, at its start, and keeps: local paths made absolute, and the energy tier that
``energy: auto`` stands for on this host. The study, recipe.json and every worker then read the same
files from any folder, and a resume compares what was resolved, not how it was written."""

from __future__ import annotations

from advisor.recipe.schema import Recipe
from advisor.search.storage import absolute_url
from advisor.search.study import absolute_local_path


def resolved(recipe: Recipe) -> Recipe:
    """``recipe`` with its storage file, model, calibration file and energy profile as absolute paths."""
    model = recipe.model.model_copy(update={"source": absolute_local_path(recipe.model.source)})
    calibration = recipe.calibration
    if calibration.source != "self":
        calibration = calibration.model_copy(update={"source": absolute_local_path(calibration.source)})
    update = {"model": model, "calibration": calibration}
    if recipe.storage:
        update["storage"] = absolute_url(recipe.storage)
    if recipe.energy_profile:
        update["energy_profile"] = absolute_local_path(recipe.energy_profile)
    return recipe.model_copy(update=update)


def energy_tier(recipe: Recipe) -> str:
    """``measured`` or ``predicted``: ``auto`` measures when a GPU of the target kind is here (as
    :func:`advisor.energy.prediction.make_energy_tiers` decides)."""
    if recipe.energy != "auto":
        return recipe.energy
    from advisor.energy.prediction import gpu_here

    here, _ = gpu_here()
    return "measured" if here == recipe.target else "predicted"


def priced_engine(recipe: Recipe) -> str | None:
    """The step model the predicted tier prices plans by (:func:`advisor.energy.prediction.priced_engine`): None
    (the built-in runtime's profiles) where the runtime measures this run's plans (``energy`` resolving to measured,
    the built-in engine), else the serving engine's (the export's default one where no engine measures)."""
    from advisor.energy.prediction import priced_engine as rule

    return rule(recipe.engine, energy_tier(recipe) == "measured")
