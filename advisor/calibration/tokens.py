"""Calibration and held-out token sets.

Default source: text sampled from the BF16 model itself (seeded), so no dataset is
needed. Or a user's .txt file (chunked), a .jsonl file (a ``text`` field per row, else
the first string field), or chat conversations: ``chat:PATH.jsonl``, or any .jsonl whose
rows have a ``messages`` field (``[{"role": ..., "content": ...}, ...]``), each rendered
with the model's own chat template (``tokenizer.apply_chat_template``), which is what an
instruct model serves. Or a named dataset, ``set:NAME`` (:mod:`advisor.calibration.hub_dataset`), whose text
is cut into windows as a file's is. Held-out windows never share tokens with calibration windows: for
files they are later, non-overlapping windows; for self-sampled text they are separate
sequences.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from advisor.errors import InputError
from advisor.files import check_regular_file, replace_atomically
from advisor.recipe.calibration_sets import is_set_source
from advisor.recipe.schema import CalibrationSpec

log = logging.getLogger(__name__)


@dataclass
class TokenSets:
    calibration: torch.Tensor  # [n, seq_len] int64
    heldout: torch.Tensor  # [m, seq_len] int64
    source: str

    def save(self, path: Path) -> None:
        data = {"calibration": self.calibration, "heldout": self.heldout, "source": self.source}
        replace_atomically(Path(path), lambda tmp: torch.save(data, tmp))

    @classmethod
    def load(cls, path: Path) -> TokenSets:
        """The token sets :meth:`save` wrote to ``path``; ValueError where it holds none (corrupt, truncated,
        another file)."""
        try:
            data = torch.load(path, weights_only=True)
            return cls(data["calibration"], data["heldout"], data["source"])
        except Exception as e:  # a damaged pickle fails in any of a dozen ways (IndexError, EOFError, ...)
            raise ValueError(f"{path} holds no token sets ({type(e).__name__})") from e


def _read_rows(path: Path) -> list[Any]:
    check_regular_file(path, "calibration.source:", "give a .txt or .jsonl file, or 'self'")
    if not path.is_file():
        raise InputError(f"calibration.source: file {path} does not exist")
    rows: list[Any] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise InputError(f"calibration.source: {path} line {lineno} is not JSON ({exc.msg}); "
                             "give one JSON object per line") from None
    return rows


def _read_text(path: Path) -> str:
    check_regular_file(path, "calibration.source:", "give a .txt or .jsonl file, or 'self'")
    if not path.is_file():
        raise InputError(f"calibration.source: file {path} does not exist; give a .txt or .jsonl file, or 'self'")
    if path.suffix == ".txt":
        return path.read_text(encoding="utf-8", errors="replace")
    try:
        path.read_text(encoding="utf-8")  # refuse what is not UTF-8 before parsing rows
    except UnicodeDecodeError as exc:
        raise InputError(f"calibration.source: {path} is not UTF-8 text (byte {exc.start}); "
                         "give a UTF-8 .jsonl file") from None
    texts: list[str] = []
    for row in _read_rows(path):
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


def _conversations(rows: list[Any], path: Path) -> list[list[dict[str, str]]]:
    out = []
    for i, row in enumerate(rows, 1):
        messages = row.get("messages") if isinstance(row, dict) else row
        ok = isinstance(messages, list) and messages and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages)
        if not ok:
            raise InputError(f"calibration.source: {path} row {i} has no 'messages' list of "
                             "{\"role\": ..., \"content\": ...} objects")
        out.append(messages)
    return out


def chat_token_ids(path: Path, tokenizer: Any) -> torch.Tensor:
    """Every conversation of a chat JSONL rendered with the tokenizer's chat template, one after another."""
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(f"calibration.source: chat data ({path}) needs a model whose tokenizer has a chat "
                         "template; this one has none (give a .txt or .jsonl of plain text instead)")
    ids: list[int] = []
    for messages in _conversations(_read_rows(path), path):
        rendered = tokenizer.apply_chat_template(messages, tokenize=True)
        if not isinstance(rendered, list):  # a BatchEncoding (return_dict)
            rendered = rendered["input_ids"]
        ids.extend(int(t) for t in rendered)
    return torch.tensor(ids, dtype=torch.long)


def is_chat_source(source: str) -> bool:
    """``chat:PATH``, or a .jsonl whose first row has a ``messages`` field."""
    if source.startswith("chat:"):
        return True
    path = Path(source)
    if path.suffix not in (".jsonl", ".json") or not path.is_file():
        return False
    try:
        with path.open(encoding="utf-8") as f:
            first = next((line for line in f if line.strip()), "")
        row = json.loads(first)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False  # not chat data; reading it as text says what is wrong
    return isinstance(row, dict) and "messages" in row


def read_calibration_text(path: Path) -> str:
    """Judge a calibration file before any work (pre-flight): ``chat:PATH`` (or a JSONL of
    ``messages``) must hold conversations, other files text; returns what was read."""
    source = str(path)
    if is_chat_source(source):
        chat_path = Path(source.removeprefix("chat:")).expanduser()
        return "\n".join(m["content"] for c in _conversations(_read_rows(chat_path), chat_path) for m in c)
    return _read_text(path)


def windows(ids: torch.Tensor, spec: CalibrationSpec, label: str, where: str) -> TokenSets:
    """``ids`` cut into calibration windows, then later, non-overlapping held-out windows."""
    need = spec.num_samples * spec.seq_len + spec.heldout_samples * spec.heldout_seq_len
    if ids.numel() < need:
        raise InputError(
            f"calibration.source: {where} has {ids.numel()} tokens; "
            f"{need} are needed ({spec.num_samples}x{spec.seq_len} calibration + "
            f"{spec.heldout_samples}x{spec.heldout_seq_len} held-out)"
        )
    cut = spec.num_samples * spec.seq_len
    calib = ids[:cut].reshape(spec.num_samples, spec.seq_len)
    held = ids[cut : cut + spec.heldout_samples * spec.heldout_seq_len]
    return TokenSets(calib, held.reshape(spec.heldout_samples, spec.heldout_seq_len), label)


def from_file(path: Path, tokenizer: Any, spec: CalibrationSpec, chat: bool = False) -> TokenSets:
    if chat:
        ids, label = chat_token_ids(path, tokenizer), f"chat:{path} (rendered with the model's chat template)"
    else:
        ids, label = tokenizer(_read_text(path), return_tensors="pt").input_ids[0], f"file:{path}"
    return windows(ids, spec, label, str(path))


def from_set(source: str, tokenizer: Any, spec: CalibrationSpec) -> TokenSets:
    """``set:NAME`` / ``set:PATH.yaml``: a dataset's first rows, tokenized and cut as a .jsonl file's text is."""
    from advisor.calibration.hub_dataset import set_text

    need = spec.num_samples * spec.seq_len + spec.heldout_samples * spec.heldout_seq_len
    text, label = set_text(source, tokenizer, need)
    return windows(tokenizer(text, return_tensors="pt").input_ids[0], spec, label, source)


@torch.no_grad()
def sample_from_model(model: Any, tokenizer: Any, n: int, length: int, seed: int) -> torch.Tensor:
    """``n`` sequences of ``length`` tokens sampled (temperature 1) from the model, from BOS."""
    (out,) = sample_sets_from_model(model, tokenizer, [(n, length, seed)])
    return out


@torch.no_grad()
def sample_sets_from_model(model: Any, tokenizer: Any, sets: list[tuple[int, int, int]]) -> list[torch.Tensor]:
    """One tensor of sampled sequences per ``(n, length, seed)``, all decoded in one batch (one pass of
    the weights per step: on a CPU a decode step costs about the same at batch 8 as at 24). Each set
    draws from its own seeded generator, so its tokens are what sampling it alone gives, up to the
    batch's rounding of the logits (on the quickstart's CPU, bit for bit)."""
    device = next(model.parameters()).device
    gens = [torch.Generator(device="cpu").manual_seed(seed) for _, _, seed in sets]
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    rows = [0]
    for n, _, _ in sets:
        rows.append(rows[-1] + n)
    ids = torch.full((rows[-1], 1), int(start), dtype=torch.long)
    past = None
    cur = ids.to(device)
    out = [ids]
    for step in range(1, max(length for _, length, _ in sets)):
        res = model(input_ids=cur, past_key_values=past, use_cache=True)
        past = res.past_key_values
        probs = torch.softmax(res.logits[:, -1, :].float(), dim=-1).cpu()
        nxt = torch.zeros((rows[-1], 1), dtype=torch.long)  # a set past its length keeps decoding, unread
        for i, (_, length, _) in enumerate(sets):
            if step < length:
                nxt[rows[i]:rows[i + 1]] = torch.multinomial(probs[rows[i]:rows[i + 1]], 1, generator=gens[i])
        out.append(nxt)
        cur = nxt.to(device)
    tokens = torch.cat(out, dim=1)
    return [tokens[rows[i]:rows[i + 1], :length].clone() for i, (_, length, _) in enumerate(sets)]


def build_token_sets(model: Any, tokenizer: Any, spec: CalibrationSpec) -> TokenSets:
    if is_set_source(spec.source):
        return from_set(spec.source, tokenizer, spec)
    if spec.source != "self":
        return from_file(Path(spec.source.removeprefix("chat:")), tokenizer, spec, chat=is_chat_source(spec.source))
    calib, held = sample_sets_from_model(model, tokenizer, [(spec.num_samples, spec.seq_len, spec.seed),
                                                            (spec.heldout_samples, spec.heldout_seq_len,
                                                             spec.seed + 1_000_003)])
    return TokenSets(calib, held, f"self-sampled (seed {spec.seed})")


def batch_count(tokens: torch.Tensor, batch_size: int = 8) -> int:
    return -(-tokens.shape[0] // batch_size)


def forward_loop(tokens: torch.Tensor, batch_size: int = 8, batches: Sequence[int] | None = None):
    """A ModelOpt calibration loop over ``tokens`` in batches; with ``batches``, only those (by index: the share
    of one rank of a node, whose ranges are then combined with the others', ``quantize.modelopt_config``)."""
    starts = range(0, tokens.shape[0], batch_size)
    if batches is not None:
        starts = [starts[b] for b in batches]

    @torch.no_grad()
    def loop(model: torch.nn.Module) -> None:
        device = next(model.parameters()).device
        for i in starts:
            model(input_ids=tokens[i : i + batch_size].to(device))

    return loop
