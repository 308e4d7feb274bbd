"""Is a model a new version of a run's model? `advisor recheck` answers from the config and the
tokenizer before any weight is loaded: new weights of the same architecture and tokenizer are
what a re-check is for; another model (another vocabulary, depth or width) is refused, not scored
as "new weights" against budgets that were set for a different model."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from advisor.errors import InputError
from advisor.recipe.schema import ModelSpec

# The fields of summary.json's `shape` that a new version of a model keeps (its weights change).
ARCHITECTURE_FIELDS = ("model_type", "outer_model_type", "num_layers", "hidden_size", "num_attention_heads",
                       "num_kv_heads", "head_dim", "vocab_size")


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A hash of the tokenizer's vocabulary (token -> id) and its special tokens."""
    vocab = sorted(tokenizer.get_vocab().items())
    special = sorted(str(t) for t in getattr(tokenizer, "all_special_tokens", []))
    return hashlib.sha256(json.dumps([vocab, special]).encode()).hexdigest()[:16]


def architecture(config: Any) -> dict[str, Any]:
    """The :data:`ARCHITECTURE_FIELDS` of a transformers config, as a run's shape records them."""
    from advisor.models.adapters.geometry import text_geometry

    geo = text_geometry(config)
    first = geo.layers[0]
    return {"model_type": geo.model_type, "outer_model_type": geo.outer_model_type, "num_layers": geo.num_layers,
            "hidden_size": geo.hidden, "num_attention_heads": first.heads, "num_kv_heads": first.kv_heads,
            "head_dim": first.head_dim, "vocab_size": geo.vocab}


def differences(stored: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """'vocab_size 32000 (the run's: 2048)' for each recorded field that differs."""
    return [f"{k} {new[k]} (the run's: {stored[k]})" for k in ARCHITECTURE_FIELDS
            if k in stored and k in new and stored[k] not in (None, "") and stored[k] != new[k]]


def check_new_version(summary: dict[str, Any], spec: ModelSpec) -> None:
    """InputError (exit 2) when ``spec`` names another model than the run's: its architecture (from the
    config) or its tokenizer differs. Reads the config and the tokenizer, never the weights."""
    from transformers import AutoConfig, AutoTokenizer

    from advisor.models.loading import resolve_source

    where, gguf_file = resolve_source(spec)
    kwargs = {k: v for k, v in (("gguf_file", gguf_file), ("revision", spec.revision)) if v}
    run_model = (summary.get("model") or {}).get("name") or "the run's model"
    found = differences(summary.get("shape") or {}, architecture(AutoConfig.from_pretrained(where, **kwargs)))
    stored_tokenizer = (summary.get("model") or {}).get("tokenizer")
    if not found and stored_tokenizer:
        try:
            tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
        except (OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InputError(f"--model {spec.source}: cannot load its tokenizer ({first}); give the complete "
                             "model folder") from None
        new_tokenizer = tokenizer_fingerprint(tokenizer)
        if new_tokenizer != stored_tokenizer:
            found.append(f"tokenizer fingerprint {new_tokenizer} (the run's: {stored_tokenizer})")
    if found:
        raise InputError(f"--model {spec.source} is not a new version of this run's model ({run_model}): "
                         f"{'; '.join(found)}; recheck scores new weights of the same model, so run "
                         f"`advisor search` on {spec.source} instead")
