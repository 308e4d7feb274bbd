"""The engines' runtime side: whether an engine can meter on this machine, and the builder of its measured tier.
The engines themselves, their names and what each can do, are one table: :mod:`advisor.engines`."""

from __future__ import annotations

from advisor.engines import TierBuilder, engine, import_engine
from advisor.errors import SetupError


def require_engine_here(name: str, command: str) -> None:
    """Before any model is read: ``name``'s package importable and a GPU visible to NVML, else a SetupError
    (exit 3) saying what to install or where to run ``command``."""
    import_engine(name)
    from advisor.energy.prediction import gpu_here

    if gpu_here()[1] is None:
        raise SetupError(f"{command} --engine {name} meters on the GPU here and NVML sees none; run it on an NVIDIA "
                         "GPU machine, or leave --engine out to price energy from the predicted tier")


def measured_tier(name: str) -> TierBuilder | None:
    """The function building ``name``'s measured tier from (recipe, loaded model, tokens); None for the built-in
    runtime, which the energy tiers build."""
    return engine(name).tier


__all__ = ["measured_tier", "require_engine_here"]
