"""Serving engines for the measured energy tier (``--engine``): one table, one entry per engine.

``builtin`` is the advisor's own runtime (``energy/measure.py``: a decoder built like a serving
engine, random weights of the model's shape). Every other engine serves the plan's *exported
checkpoint* (``advisor export``'s files, written once per plan into ``RUN_DIR/engine_checkpoints``)
while the advisor's own NVML meter takes the steady-state windows. A new engine is one
:class:`Engine` entry: its package, how to install it, and the function that builds its measured
tier from ``(recipe, loaded model, token sets)``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from advisor.errors import InputError, SetupError


@dataclass(frozen=True)
class Engine:
    name: str  # the --engine / recipe value
    title: str  # as reports name it
    package: str | None  # the module it imports; None: part of the advisor
    install: str  # how to get the package
    tier: str | None  # "module:function" building its measured tier; None: the built-in runtime
    note: str = ""  # what a user must know where it is chosen


ENGINE_TABLE: dict[str, Engine] = {e.name: e for e in (
    Engine("builtin", "built-in runtime", None, "", None,
           "the advisor's own runtime on random weights of the model's shape"),
    Engine("tensorrt_llm", "TensorRT-LLM", "tensorrt_llm",
           "pip install tensorrt_llm, on a machine with an NVIDIA GPU",
           "advisor.deploy.trtllm_engine:tensorrt_llm_tier",
           "tested only against a fake module: TensorRT-LLM cannot be installed on the GPU machines this project "
           "was measured on"),
    Engine("vllm", "vLLM", "vllm",
           "pip install vllm==0.26.0 (its wheel pins torch 2.11; on the lent GPU machines, pack it with "
           "../shared/tools/device-vllm.sh)",
           "advisor.deploy.vllm_engine:vllm_tier",
           "the exported checkpoint served by vLLM's offline LLM API, one engine per process"),
)}
ENGINES = tuple(ENGINE_TABLE)


def engine(name: str) -> Engine:
    try:
        return ENGINE_TABLE[name]
    except KeyError:
        raise InputError(f"--engine: got {name!r}; allowed: {', '.join(ENGINES)}") from None


def import_engine(name: str) -> ModuleType | None:
    """The engine's package (None for builtin), or a SetupError (exit 3) saying how to install it."""
    e = engine(name)
    if e.package is None:
        return None
    try:
        return importlib.import_module(e.package)
    except ImportError as exc:
        raise SetupError(f"--engine {name}: {e.package} is not importable ({exc}); {e.install}, "
                         "or use --engine builtin") from None


def require_engine_here(name: str, command: str) -> None:
    """Before any model is read: ``name``'s package importable and a GPU visible to NVML, else a SetupError
    (exit 3) saying what to install or where to run ``command``."""
    import_engine(name)
    from advisor.energy.prediction import gpu_here

    if gpu_here()[1] is None:
        raise SetupError(f"{command} --engine {name} meters on the GPU here and NVML sees none; run it on an NVIDIA "
                         "GPU machine, or leave --engine out to price energy from the predicted tier")


def measured_tier(name: str) -> Callable[[Any, Any, Any], Any] | None:
    """The function building ``name``'s measured tier from (recipe, loaded model, tokens); None for builtin."""
    e = engine(name)
    if e.tier is None:
        return None
    module, _, function = e.tier.partition(":")
    return getattr(importlib.import_module(module), function)


__all__ = ["ENGINES", "ENGINE_TABLE", "Engine", "engine", "import_engine", "measured_tier", "require_engine_here"]
