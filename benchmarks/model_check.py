"""Evidence that two machines ran the same model: file and weight hashes, and logits on a fixed prompt.

``model_fingerprint`` hashes the config too, whose JSON carries the transformers version, so it
differs between machines with different transformers even for identical weights;
``weights_sha256`` hashes the tensors alone (names, shapes, dtypes, bytes).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

PROBE_TEXT = "The capital of France is Paris. The capital of Italy is"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def weights_sha256(model: Any) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        flat = t.detach().contiguous().cpu().reshape(-1)
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
        h.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return h.hexdigest()


@torch.no_grad()
def logits_probe(model: Any, tokenizer: Any) -> dict[str, Any]:
    """Per position of PROBE_TEXT: the arg-max token, the log-probability of the next true token and the
    first 8 raw logits (float32 of the BF16 model's output)."""
    ids = tokenizer(PROBE_TEXT, return_tensors="pt").input_ids
    device = next(model.parameters()).device
    logits = model(input_ids=ids.to(device)).logits[0].float().cpu()
    logprobs = torch.log_softmax(logits, dim=-1)
    return {
        "text": PROBE_TEXT, "token_ids": ids[0].tolist(),
        "argmax": logits.argmax(-1).tolist(),
        "next_token_logprob": [round(float(logprobs[i, ids[0, i + 1]]), 5) for i in range(ids.shape[1] - 1)],
        "first_logits": [[round(float(x), 4) for x in row[:8]] for row in logits],
    }


def model_check(model: Any, tokenizer: Any, gguf: Path | None) -> dict[str, Any]:
    return {"gguf_file": gguf.name if gguf else None, "gguf_sha256": file_sha256(gguf) if gguf else None,
            "weights_sha256": weights_sha256(model), "probe": logits_probe(model, tokenizer)}


def compare_probes(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """How far two machines' probes are apart (same tokens assumed; checked)."""
    if a["token_ids"] != b["token_ids"]:
        return {"same_tokens": False}
    lp = [abs(x - y) for x, y in zip(a["next_token_logprob"], b["next_token_logprob"], strict=True)]
    raw = [abs(x - y) for ra, rb in zip(a["first_logits"], b["first_logits"], strict=True)
           for x, y in zip(ra, rb, strict=True)]
    return {"same_tokens": True, "positions": len(a["argmax"]),
            "same_argmax": sum(x == y for x, y in zip(a["argmax"], b["argmax"], strict=True)),
            "max_abs_logprob_diff": round(max(lp), 5), "max_abs_logit_diff": round(max(raw), 4)}
