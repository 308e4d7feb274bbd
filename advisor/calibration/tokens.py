"""Calibration and held-out token sets.

Default source: text sampled from the BF16 model itself (seeded), so no dataset is
needed. Or a user's .txt file (chunked) or .jsonl file (a ``text`` field per row,
else the first string field). Held-out windows never share tokens with calibration
windows: for files they are later, non-overlapping windows; for self-sampled text
they are separate sequences.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from advisor.errors import InputError
from advisor.recipe.schema import CalibrationSpec

log = logging.getLogger(__name__)


@dataclass
class TokenSets:
    calibration: torch.Tensor  # [n, seq_len] int64
    heldout: torch.Tensor  # [m, seq_len] int64
    source: str

    def save(self, path: Path) -> None:
        torch.save({"calibration": self.calibration, "heldout": self.heldout, "source": self.source}, path)

    @classmethod
    def load(cls, path: Path) -> TokenSets:
        data = torch.load(path)
        return cls(data["calibration"], data["heldout"], data["source"])


def read_calibration_text(path: Path) -> str:
    """The text of a .txt file, or of the rows of a .jsonl file (their "text" field, else their
    first string); InputError for a file that is missing, not UTF-8 JSON lines, or holds no text."""
    if not path.is_file():
        raise InputError(f"calibration.source: file {path} does not exist; give a .txt or .jsonl file, or 'self'")
    if path.suffix == ".txt":
        return path.read_text(encoding="utf-8", errors="replace")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise InputError(f"calibration.source: {path} is not UTF-8 text (byte {exc.start}); "
                         "give a UTF-8 .jsonl file") from None
    texts: list[str] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"calibration.source: {path} line {lineno} is not JSON ({exc.msg}); "
                             "give one JSON object per line") from None
        if isinstance(row, dict):
            text = row.get("text")
            if not isinstance(text, str):
                text = next((v for v in row.values() if isinstance(v, str)), None)
        else:
            text = row if isinstance(row, str) else None
        if text:
            texts.append(text)
    if not texts:
        raise InputError(f"calibration.source: {path} holds no text (no row has a string field); "
                         'give rows like {"text": "..."}')
    return "\n\n".join(texts)


def from_file(path: Path, tokenizer: Any, spec: CalibrationSpec) -> TokenSets:
    ids = tokenizer(read_calibration_text(path), return_tensors="pt").input_ids[0]
    need = spec.num_samples * spec.seq_len + spec.heldout_samples * spec.heldout_seq_len
    if ids.numel() < need:
        raise InputError(
            f"calibration.source: {path} has {ids.numel()} tokens; "
            f"{need} are needed ({spec.num_samples}x{spec.seq_len} calibration + "
            f"{spec.heldout_samples}x{spec.heldout_seq_len} held-out)"
        )
    cut = spec.num_samples * spec.seq_len
    calib = ids[:cut].reshape(spec.num_samples, spec.seq_len)
    held = ids[cut : cut + spec.heldout_samples * spec.heldout_seq_len]
    return TokenSets(calib, held.reshape(spec.heldout_samples, spec.heldout_seq_len), f"file:{path}")


@torch.no_grad()
def sample_from_model(model: Any, tokenizer: Any, n: int, length: int, seed: int) -> torch.Tensor:
    """``n`` sequences of ``length`` tokens sampled (temperature 1) from the model, from BOS."""
    device = next(model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((n, 1), int(start), dtype=torch.long)
    past = None
    cur = ids.to(device)
    out = [ids]
    for _ in range(length - 1):
        res = model(input_ids=cur, past_key_values=past, use_cache=True)
        past = res.past_key_values
        probs = torch.softmax(res.logits[:, -1, :].float(), dim=-1).cpu()
        nxt = torch.multinomial(probs, 1, generator=gen)
        out.append(nxt)
        cur = nxt.to(device)
    return torch.cat(out, dim=1)


def build_token_sets(model: Any, tokenizer: Any, spec: CalibrationSpec) -> TokenSets:
    if spec.source != "self":
        return from_file(Path(spec.source), tokenizer, spec)
    calib = sample_from_model(model, tokenizer, spec.num_samples, spec.seq_len, spec.seed)
    held = sample_from_model(model, tokenizer, spec.heldout_samples, spec.heldout_seq_len, spec.seed + 1_000_003)
    return TokenSets(calib, held, f"self-sampled (seed {spec.seed})")


def forward_loop(tokens: torch.Tensor, batch_size: int = 8):
    """A ModelOpt calibration loop over ``tokens`` in batches."""

    @torch.no_grad()
    def loop(model: torch.nn.Module) -> None:
        device = next(model.parameters()).device
        for i in range(0, tokens.shape[0], batch_size):
            model(input_ids=tokens[i : i + batch_size].to(device))

    return loop
