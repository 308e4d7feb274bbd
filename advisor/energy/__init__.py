"""Energy per token of a plan on a workload: predicted (roofline, profile) or measured (NVML)."""

from .base import EnergyEstimate, EnergyModel
from .costmodel import ProfileCostModel
from .measure import MeasuredEnergyModel
from .meter import EnergyMeter, Measurement, MeterConfig, open_meter
from .profile import load_profile, shipped_profile
from .roofline import RooflineEnergyModel

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
