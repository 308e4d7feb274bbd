"""What a per-model profile's predictions say about it: whose profile it is, where and when it was metered, which
of its points the meter could not steady, and which points a profile stored before them lacks. torch-free."""

from __future__ import annotations

from typing import Any

from advisor.energy.meter import MeterConfig
from advisor.energy.profiling import ALT_FP8, LAST_QUARTER_FP8, MLP_FP8, POINTS


def _per_point(profile: dict[str, Any], key: str) -> list[float]:
    """A per-point record (``cv``, ``temperature_c``) of every metered point (the kind corner's too); none in
    profiles stored before it."""
    out: list[float] = []
    for phase in ("decode", "prefill"):
        plans = [*profile[phase].get(key, {}).values()]
        plans += [profile[phase][c][key] for c in POINTS if key in profile[phase].get(c, {})]
        for per_plan in plans:
            for v in per_plan.values() if isinstance(per_plan, dict) else [per_plan]:
                out += v
    return out


def unstable_points(profile: dict[str, Any], max_cv: float = MeterConfig.max_cv) -> tuple[int, int]:
    """(unstable, all) of a profile's metered points: those whose windows' CV stayed above ``max_cv``
    through the meter's attempts. Profiles stored before CVs were recorded count none."""
    cvs = _per_point(profile, "cv")
    return sum(1 for c in cvs if c > max_cv), len(cvs)


def metered_temperatures(profile: dict[str, Any]) -> str:
    """The GPU temperatures the profile's points were metered at, for its label: a small model's J/step follows
    the temperature (:meth:`advisor.energy.meter.EnergyMeter.soak`)."""
    temps = _per_point(profile, "temperature_c")
    return f"; metered at {min(temps):.0f}-{max(temps):.0f} C" if temps else ""


def profile_origin(profile: dict[str, Any]) -> str:
    """Whose profile prices the model: its own, or one of the same geometry (another model's, or the
    random-weight shape a shipped profile measured), and whether it was shipped or averaged over GPU units."""
    origin = "per-model profile"
    if profile.get("same_geometry"):
        origin = f"per-model profile of the same layer geometry ({profile['model'].get('family', '?')})"
    if profile.get("shipped"):
        origin += " shipped with precision-advisor"
    units = profile.get("units")
    if units and len(units) > 1:
        origin += f", the mean of {len(units)} GPU units"
    return origin


def profile_label(profile: dict[str, Any], digest: str, routing: str = "") -> str:
    """The label of every estimate the profile prices: "predicted (...)", with its origin, GPU, driver, date, model
    digest, ``routing`` (a MoE model's), metered temperatures, unstable points, missing points and caveat."""
    unstable, points = unstable_points(profile)
    shaky = f"; {unstable} of its {points} metered points unstable (window CV > 1%)" if unstable else ""
    if MLP_FP8 not in profile["decode"]:
        shaky += "; no kind corner (stored before it): FP8 savings shared by weight alone"
    elif ALT_FP8 not in profile["prefill"]:
        shaky += "; no mixing point (stored before it): mixed plans' prefill on the straight line"
    elif LAST_QUARTER_FP8 not in profile["decode"]:
        shaky += "; no position point (stored before it): decode savings shared over the layers by weight"
    caveat = f"; {profile['caveat']}" if profile.get("caveat") else ""
    return (f"predicted ({profile_origin(profile)}, {profile['gpu']}, driver {profile['driver']}, "
            f"{profile['date']}, model {digest}{routing}{metered_temperatures(profile)}{shaky}{caveat})")
