"""Energy per token of a plan on a workload: predicted (roofline, profile) or measured (NVML)."""

from advisor.energy.costmodel import ProfileCostModel
from advisor.energy.measure import MeasuredEnergyModel
from advisor.energy.meter import EnergyMeter, Measurement, MeterConfig, open_meter
from advisor.energy.profile import load_profile, shipped_profile
from advisor.energy.roofline import RooflineEnergyModel
from advisor.estimate import EnergyEstimate, EnergyModel

__all__ = [
    "EnergyEstimate",
    "EnergyMeter",
    "EnergyModel",
    "MeasuredEnergyModel",
    "Measurement",
    "MeterConfig",
    "ProfileCostModel",
    "RooflineEnergyModel",
    "load_profile",
    "open_meter",
    "shipped_profile",
]
