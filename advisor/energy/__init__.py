"""Energy per token of a plan on a workload: predicted from a profile (``prediction``) or measured under
NVML (``measure``), in wings: ``runtime`` (the serving runtime and its kernels), ``meter`` (NVML),
``profiling`` (measuring, reading and storing profiles), ``prediction`` (the cost models and the registry
of predicted tiers). Each wing's ``__init__`` is its public face; the rest is private.

Import order inside: ``meter`` and ``runtime`` < ``measure`` < ``profiling`` < ``prediction``.
"""

from advisor.energy.measure import MeasuredEnergyModel
from advisor.energy.meter import EnergyMeter, Measurement, MeterConfig, open_meter
from advisor.energy.prediction import (
    ENERGY_MODES,
    PREDICTED_TIERS,
    GpuProfileCostModel,
    ModelProfileCostModel,
    ProfileCostModel,
    RooflineEnergyModel,
    make_energy_model,
    make_energy_tiers,
    make_predicted_model,
)
from advisor.energy.profiling import load_profile, shipped_profile
from advisor.estimate import EnergyEstimate, EnergyModel

__all__ = [
    "ENERGY_MODES",
    "PREDICTED_TIERS",
    "EnergyEstimate",
    "EnergyMeter",
    "EnergyModel",
    "GpuProfileCostModel",
    "MeasuredEnergyModel",
    "Measurement",
    "MeterConfig",
    "ModelProfileCostModel",
    "ProfileCostModel",
    "RooflineEnergyModel",
    "load_profile",
    "make_energy_model",
    "make_energy_tiers",
    "make_predicted_model",
    "open_meter",
    "shipped_profile",
]
