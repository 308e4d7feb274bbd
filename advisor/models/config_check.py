"""What can be judged about a model from its config alone, in seconds and without its weights:
that the files are there, that it is a causal (decoder-only) LM, and how long a context it
takes. `advisor search` checks this before it creates a study; `eval` and `measure` before
they load anything."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.errors import InputError
from advisor.models.config_fields import UNREADABLE, check_config_fields, raw_config
from advisor.models.gguf_header import read_gguf_header
from advisor.models.hub_access import with_hub_note
from advisor.models.loading import resolve_source
from advisor.models.safetensors_header import check_weight_files
from advisor.models.weights_match import check_weights_agree
from advisor.recipe.schema import ModelSpec, Recipe

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
# llama.cpp architectures that are encoders (or encoder-decoders), named as transformers maps them.
GGUF_ENCODERS = ("t5", "t5encoder", "umt5", "bert", "nomic-bert", "jina-bert-v2")
# llama.cpp names that transformers renames (transformers' load_gguf_checkpoint does the same).
GGUF_RENAMES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "minimax-m2": "minimax_m2"}


@dataclass(frozen=True)
class ModelFacts:
    source: str
    kind: str  # "LlamaForCausalLM (llama)" or "GGUF llama"
    context_tokens: int | None  # the longest sequence its position embeddings cover
    context_field: str  # where that number comes from


def model_facts(spec: ModelSpec, *, need_weights: bool = True) -> ModelFacts | None:
    """The model's kind and context, or None where only a download could tell (a GGUF file in a
    hub repository). InputError for a model that is missing, unreadable or not a causal LM, or whose
    config does not describe its weights; without ``need_weights`` (a plan from the config alone) a
    folder may hold no weights yet."""
    where, gguf_file = resolve_source(spec)
    if gguf_file:
        path = Path(where) / gguf_file
        return _gguf_facts(path, spec.source) if path.is_file() else None
    folder = Path(where)
    if folder.is_dir():
        _check_config_file(folder, spec.source)
        check_config_fields(raw_config(where), spec.source)  # before transformers puts defaults in their place
    try:
        config = _read_config(where, spec)
    except InputError:
        if folder.is_dir():
            _check_family(where, spec)  # a model_type transformers does not know: unsupported, exit 2
        raise
    check_causal_lm(config, spec.source)  # an encoder: says so (exit 2)
    if folder.is_dir():
        _check_family(where, spec)  # a causal LM without an adapter: exit 2, before other complaints
        if need_weights or _has_weights(folder):
            _check_weight_files(folder, spec.source)
        check_weights_agree(folder, config, spec.source)  # the config's model is the weights' model
    else:
        check_config_fields(raw_config(where, spec.revision), spec.source)
    arch = ", ".join(getattr(config, "architectures", None) or []) or "no architectures listed"
    return ModelFacts(spec.source, f"{arch} ({config.model_type})",
                      getattr(config, "max_position_embeddings", None), "max_position_embeddings")


def _check_family(where: str, spec: ModelSpec) -> None:
    from transformers import AutoConfig

    from advisor.models.loading import check_supported

    kwargs = {"revision": spec.revision} if spec.revision else {}
    with contextlib.suppress(*UNREADABLE):  # unreadable: _read_config says so
        check_supported(where, AutoConfig, kwargs)


def _check_config_file(folder: Path, source: str) -> None:
    if not (folder / "config.json").is_file():
        ggufs = sorted(p.name for p in folder.glob("*.gguf"))
        if ggufs:
            raise InputError(f"model.source: {source} holds GGUF files ({', '.join(ggufs[:3])}) but no config.json; "
                             f"name one with --gguf-file, or give the .gguf file's path")
        raise InputError(f"model.source: {source} has no config.json, so it is not a Hugging Face model folder; "
                         "give the folder that holds config.json and the weights, a hub id or a .gguf file")


def _has_weights(folder: Path) -> bool:
    return any(next(folder.glob(pattern), None) for pattern in WEIGHT_PATTERNS)


def _check_weight_files(folder: Path, source: str) -> None:
    if not _has_weights(folder):
        raise InputError(f"model.source: {source} has a config.json but no weights (*.safetensors or *.bin); "
                         "give the complete model folder")
    check_weight_files(folder, source)


def _read_config(where: str, spec: ModelSpec) -> Any:
    from transformers import AutoConfig

    kwargs = {"revision": spec.revision} if spec.revision else {}
    try:
        return AutoConfig.from_pretrained(where, **kwargs)
    except UNREADABLE as exc:  # transformers' ways of saying "cannot read it"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"model.source: cannot read the model config of {spec.source!r} "
                         f"({with_hub_note(first, where)}); "
                         "give a folder with a valid config.json, a hub id or a .gguf file") from None


def check_causal_lm(config: Any, source: str) -> None:
    """Refuse encoders and encoder-decoders: the advisor searches causal (decoder-only) LMs.

    The architectures a config lists decide (a causal LM class of transformers, or a
    ``*ForCausalLM`` / ``*LMHeadModel`` name of remote code); without any, its model type
    must have a causal LM class and be no masked-LM encoder.
    """
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    model_type = getattr(config, "model_type", None)
    architectures = list(getattr(config, "architectures", None) or [])
    causal_classes = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    if getattr(config, "is_encoder_decoder", False):
        causal = False
    elif architectures:
        causal = any(a in causal_classes or a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures)
    else:
        causal = model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not (
            model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False))
    if not causal:
        what = ", ".join(architectures) or "a model"
        raise InputError(f"model.source: {source} is {what} (model type {model_type}), not a causal "
                         "(decoder-only) language model; the advisor searches causal LMs such as Llama, "
                         "Qwen or Mistral (a *ForCausalLM architecture)")


def _gguf_facts(path: Path, source: str) -> ModelFacts:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    header = read_gguf_header(path)
    arch = header.architecture
    if arch is None:
        raise InputError(f"model.source: {path} names no general.architecture; it is not a model GGUF file")
    if arch in GGUF_ENCODERS:
        raise InputError(f"model.source: {path} holds a {arch} model, an encoder, not a causal (decoder-only) "
                         "language model; the advisor searches causal LMs such as Llama, Qwen or Mistral")
    supported = [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer", *GGUF_ENCODERS)]
    if GGUF_RENAMES.get(arch, arch) not in supported:
        raise InputError(f"model.source: {path} holds a {arch} model, which transformers cannot load from GGUF "
                         f"(it loads {', '.join(sorted(supported))}); convert it to a Hugging Face folder")
    return ModelFacts(source, f"GGUF {arch}", header.context_length, f"{arch}.context_length")


def check_context(facts: ModelFacts, recipe: Recipe, *, workloads: bool = True) -> None:
    """Refuse token lengths beyond the model's context: calibration windows and (``workloads``)
    every workload's input + output."""
    limit = facts.context_tokens
    if not limit:
        return
    cal = recipe.calibration
    asked = {"calibration.seq_len": cal.seq_len, "calibration.heldout_seq_len": cal.heldout_seq_len}
    for i, w in enumerate(recipe.workloads if workloads else []):
        asked[f"workloads[{i}] ({w.name}) input_tokens + output_tokens"] = w.input_tokens + w.output_tokens
    too_long = [f"{name} {n}" for name, n in asked.items() if n > limit]
    if too_long:
        raise InputError(f"{'; '.join(too_long)}: longer than the model's context of {limit} tokens "
                         f"({facts.context_field} of {facts.source}); shorten to at most {limit} tokens "
                         "or choose a model with a longer context")
