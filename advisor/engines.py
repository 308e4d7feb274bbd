"""The serving engines of the measured energy tier (``--engine``, the recipe's ``engine``): one table, one entry
per engine, the only place their names are written.

``builtin`` is the advisor's own runtime (``energy/measure.py``: a decoder built like a serving engine, random
weights of the model's shape). Every other engine serves the plan's *exported checkpoint* (``advisor export``'s
files, written once per plan into ``RUN_DIR/engine_checkpoints``) while the advisor's own NVML meter takes the
steady-state windows. An engine's measured tier is a :class:`~advisor.search.measured._contract.MeasuredTier`
(``advisor/testing_engines.py`` checks it); what it can do beyond that contract is said here, as facts the recipe,
the commands and the compatibility table read. Adding an engine is its entry here and its module.

The builders import their engine's module when called (never when this table is read): the recipe, `--help`
and the compatibility table read the table without torch, vLLM or TensorRT-LLM, and ``tests/test_layout.py``
lets these calls, and only these, reach above the core layer.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from advisor.errors import InputError, SetupError

#: (recipe, loaded model, token sets) -> the engine's measured tier for a search, worker or recheck run
TierBuilder = Callable[[Any, Any, Any], Any]
#: (checkpoint folder, workloads, vocabulary size, GPU label, GPUs) -> the tier serving that one checkpoint
CheckpointTierBuilder = Callable[[Path, list[Any], int, str, int], Any]


@dataclass(frozen=True)
class Engine:
    name: str  # the --engine / recipe value
    title: str  # as reports name it
    runs: str  # what it runs, one clause (recipe reference, --help)
    package: str | None  # the module it imports; None: part of the advisor
    install: str  # how to get the package
    tier: TierBuilder | None  # builds its measured tier; None: the built-in runtime, built by the energy tiers
    note: str = ""  # what a user must know where it is chosen
    serves_checkpoint: bool = True  # serves the plan's exported checkpoint (False: random weights of the shape)
    tensor_parallel: bool = False  # spreads one serving over several GPUs (`gpus`, `--gpus`)
    checkpoint_tier: CheckpointTierBuilder | None = None  # `advisor measure --checkpoint`; None: not offered there
    verifies: bool = False  # `advisor verify` serves through it
    #: the step model the predicted tier prices its plans by (its profiles: advisor/energy/profiles/<it>/); None: the
    #: built-in runtime's profiles, as they are
    step_model: str | None = None

    @property
    def measures_alone(self) -> bool:
        """`advisor measure` runs it on one plan: the built-in runtime, or an engine serving a given checkpoint."""
        return self.tier is None or self.checkpoint_tier is not None


def tensorrt_llm_tier(recipe: Any, loaded: Any, tokens: Any) -> Any:
    from advisor.deploy.trtllm_engine import tensorrt_llm_tier as build

    return build(recipe, loaded, tokens)


def vllm_tier(recipe: Any, loaded: Any, tokens: Any) -> Any:
    from advisor.deploy.vllm import vllm_tier as build

    return build(recipe, loaded, tokens)


def vllm_checkpoint_tier(checkpoint: Path, workloads: list[Any], vocab: int, gpu_label: str, gpus: int) -> Any:
    from advisor.deploy.vllm import checkpoint_tier as build

    return build(checkpoint, workloads, vocab, gpu_label, gpus)


DEFAULT_ENGINE = "builtin"

ENGINE_TABLE: dict[str, Engine] = {e.name: e for e in (
    Engine(DEFAULT_ENGINE, "built-in runtime", "the advisor's runtime, random weights of the model's shape", None, "",
           None, "the advisor's own runtime on random weights of the model's shape", serves_checkpoint=False),
    Engine("tensorrt_llm", "TensorRT-LLM",
           "the exported checkpoint through TensorRT-LLM's LLM API; needs the package", "tensorrt_llm",
           "pip install tensorrt_llm, on a machine with an NVIDIA GPU", tensorrt_llm_tier,
           "tested only against a fake module: TensorRT-LLM cannot be installed on the GPU machines this project "
           "was measured on"),
    Engine("vllm", "vLLM",
           "the exported checkpoint through vLLM's offline LLM API, one engine per process; needs the package",
           "vllm", "pip install vllm==0.26.0 (its wheel pins torch 2.11; on the lent GPU machines, pack it with "
           "../shared/tools/device-vllm.sh)", vllm_tier,
           "the exported checkpoint served by vLLM's offline LLM API, one engine per process",
           tensor_parallel=True, checkpoint_tier=vllm_checkpoint_tier, verifies=True, step_model="vllm"),
)}


def engine_names() -> tuple[str, ...]:
    """Every engine's name, in table order (read when asked: a test may add one)."""
    return tuple(ENGINE_TABLE)


def listed(names: tuple[str, ...] | list[str], flag: str = "", last: str = "or") -> str:
    """``a, b or c`` (each prefixed with ``flag``, e.g. ``--engine ``; ``last``: the word before the last one)."""
    shown = [f"{flag}{n}" for n in names]
    return ", ".join(shown[:-1]) + f" {last} {shown[-1]}" if len(shown) > 1 else "".join(shown)


def engine(name: str) -> Engine:
    try:
        return ENGINE_TABLE[name]
    except KeyError:
        raise InputError(f"--engine: got {name!r}; allowed: {', '.join(engine_names())}") from None


def engines_that(fact: Callable[[Engine], bool]) -> tuple[str, ...]:
    """The names of the engines ``fact`` holds for (``lambda e: e.tensor_parallel``, ...)."""
    return tuple(e.name for e in ENGINE_TABLE.values() if fact(e))


def export_served_by() -> Engine:
    """The engine an exported plan is served through unless told otherwise: the first that `advisor verify` serves
    through (its default)."""
    return next(e for e in ENGINE_TABLE.values() if e.verifies)


def import_engine(name: str) -> ModuleType | None:
    """The engine's package (None for one that is part of the advisor), or a SetupError (exit 3) saying how to
    install it."""
    e = engine(name)
    if e.package is None:
        return None
    try:
        return importlib.import_module(e.package)
    except ImportError as exc:
        raise SetupError(f"--engine {name}: {e.package} is not importable ({exc}); {e.install}, "
                         f"or use --engine {DEFAULT_ENGINE}") from None


__all__ = ["DEFAULT_ENGINE", "ENGINE_TABLE", "CheckpointTierBuilder", "Engine", "TierBuilder", "engine",
           "engine_names", "engines_that", "export_served_by", "import_engine", "listed"]
