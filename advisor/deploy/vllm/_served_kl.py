"""KL(advisor's BF16 reference || the plan as served) over the whole vocabulary, the quantity the search's proxy
scores, on the run's held-out tokens.

vLLM returns every token's log-probability at every prompt position when asked for ``prompt_logprobs=-1``
(with the engine's ``max_logprobs=-1``); a sequence's answer is [positions x vocabulary] entries, so each
sequence is asked for alone and folded into its KL at once (``flat_logprobs``: lists, not a dict per position).
The reference's log-softmax travels to the engine's process as a file (:func:`write_reference`), since what vLLM
answers is too large to send back whole.

vLLM's engine hands the output side each prompt's log-probabilities as tensors, and its output side turns them
into Python lists a token at a time (``LogprobsProcessor._update_prompt_logprobs``: four list appends per entry,
16M entries a sequence of 128 tokens at a 128k vocabulary). vLLM has no public way to have the tensors, so
:func:`prompt_logprob_tensors` takes them at that method while the KL is scored and lets vLLM build its lists for
each chunk's first position only; every sequence's tensors are checked against those lists. Where a vLLM has no
such method, the lists are read as before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from advisor.errors import AdvisorError

# vLLM's answer holds every token's log-probability at every position: at most this many entries a plan (2 GiB of
# float32 in the reference file; read from vLLM's lists, 16 sequences of 256 tokens at a 128k vocabulary took 3.7 min
# on an H200, reports/benchmarks/vllm_verify.md)
MAX_ENTRIES = 2**29


def within_budget(sequences: Sequence[Sequence[int]], vocab: int, max_entries: int = MAX_ENTRIES
                  ) -> list[Sequence[int]]:
    """The first of ``sequences`` whose positions x ``vocab`` stay within ``max_entries`` (at least one)."""
    out: list[Sequence[int]] = []
    total = 0
    for seq in sequences:
        total += max(len(seq) - 1, 0) * vocab
        if out and total > max_entries:
            break
        out.append(seq)
    return out


def logprobs_per_sequence(model: Any, sequences: Sequence[Sequence[int]]) -> list[Any]:
    """Per sequence, ``model``'s log-softmax (float32, on the CPU) at every position that has a next token in it:
    [len(sequence) - 1, vocabulary]."""
    import torch

    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for seq in sequences:
            logits = model(torch.tensor([list(seq)], device=device)).logits[0, :-1]
            out.append(torch.log_softmax(logits.float(), dim=-1).cpu())
    return out


def write_reference(path: Path, logprobs: Sequence[Any]) -> Path:
    """``logprobs`` saved at ``path``; a write cut off (a full disk: gigabytes at a large vocabulary) leaves nothing."""
    import torch

    part = Path(path).with_name(Path(path).name + ".part")
    try:
        torch.save(list(logprobs), part)
        part.replace(path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return Path(path)


def kl_sum(reference: Any, other: Any) -> float:
    """Sum over positions of KL(reference || other), both log-probabilities [positions, vocabulary]."""
    ref = reference.double()
    return float((ref.exp() * (ref - other.double())).sum())


def dense_logprobs(positions: Any, vocab: int) -> Any:
    """vLLM's prompt log-probabilities of one sequence (every token at every position; the first position, which
    has none, dropped) as a [positions, vocabulary] float32 tensor. Takes vLLM's ``FlatLogprobs`` or its list of
    {token: Logprob} per position."""
    import numpy as np
    import torch

    if hasattr(positions, "start_indices"):  # FlatLogprobs: parallel lists, [start, end) per position
        starts = np.asarray(positions.start_indices[1:], dtype=np.int64)
        ends = np.asarray(positions.end_indices[1:], dtype=np.int64)
        tokens = np.asarray(positions.token_ids, dtype=np.int64)
        values = np.asarray(positions.logprobs, dtype=np.float32)
        rows = np.repeat(np.arange(len(starts)), ends - starts)
        picks = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends, strict=True)]) if len(starts) else []
        tokens, values, count = tokens[picks], values[picks], len(starts)
    else:
        entries = [(i, t, lp.logprob) for i, pos in enumerate(list(positions)[1:]) for t, lp in (pos or {}).items()]
        rows = np.asarray([e[0] for e in entries], dtype=np.int64)
        tokens = np.asarray([e[1] for e in entries], dtype=np.int64)
        values = np.asarray([e[2] for e in entries], dtype=np.float32)
        count = max(len(positions) - 1, 0)
    dense = np.full((count, vocab), np.nan, dtype=np.float32)
    dense[rows, tokens] = values
    missing = int(np.isnan(dense).any(axis=1).sum())
    if missing:
        raise AdvisorError(f"vLLM returned fewer than all {vocab} log-probabilities at {missing} of {count} "
                           "positions; the served KL needs every token's")
    return torch.from_numpy(dense)


def dense_from_tensors(chunks: Sequence[Any], vocab: int) -> tuple[Any, list[int]]:
    """One sequence's prompt log-probability tensors as vLLM's engine sent them (a ``LogprobsTensors`` per prefill
    chunk: per position, the prompt's token, then the top k) as a [positions, vocabulary] float32 tensor, and the
    row each chunk starts at."""
    import torch

    ids = torch.cat([c[0] for c in chunks]).long()
    values = torch.cat([c[1] for c in chunks]).float()
    if ids.numel() and int(ids.max()) >= vocab:
        raise AdvisorError(f"vLLM returned log-probabilities of token {int(ids.max())}, past the run's vocabulary "
                           f"of {vocab}: the served model's vocabulary is not the run's model's")
    dense = torch.full((ids.shape[0], vocab), float("nan")).scatter_(1, ids, values)
    missing = int(dense.isnan().any(dim=1).sum())
    if missing:
        raise AdvisorError(f"vLLM returned fewer than all {vocab} log-probabilities at {missing} of "
                           f"{ids.shape[0]} positions; the served KL needs every token's")
    starts = [0]
    for c in chunks[:-1]:
        starts.append(starts[-1] + int(c[0].shape[0]))
    return dense, starts


# the hook on each LogprobsProcessor class: its own method and how many scorings hold it; what a thread scores into
_hooks: dict[Any, list[Any]] = {}
_hooks_lock = threading.Lock()
_scoring = threading.local()


def _hook(processor: Any) -> None:
    """``processor``'s method wrapped (once, however many threads score): a call in a thread that scores takes the
    tensors and lets vLLM list each chunk's first position only; any other call is vLLM's own."""
    with _hooks_lock:
        if processor not in _hooks:
            original = processor._update_prompt_logprobs

            def update(self: Any, tensors: Any) -> None:
                chunks = getattr(_scoring, "chunks", None)
                if chunks is None:
                    return original(self, tensors)
                chunks.append(tensors)
                first_rows = [t[:1] for t in tensors[:3]] + list(tensors[3:])
                return original(self, tensors._make(first_rows) if hasattr(tensors, "_make") else tuple(first_rows))

            processor._update_prompt_logprobs = update
            _hooks[processor] = [original, 0]
        _hooks[processor][1] += 1


def _unhook(processor: Any) -> None:
    with _hooks_lock:
        entry = _hooks[processor]
        entry[1] -= 1
        if entry[1] == 0:
            processor._update_prompt_logprobs = entry[0]
            del _hooks[processor]


@contextmanager
def prompt_logprob_tensors(vllm: Any) -> Iterator[list[Any] | None]:
    """While open, each prompt's log-probability tensors as vLLM's output side receives them in this thread (vLLM's
    offline engine runs its output side in the thread that calls ``generate``), one entry a prefill chunk, in the
    list this yields (emptied by the caller between sequences); vLLM makes its Python lists of each chunk's first
    position only. Other threads' calls are vLLM's own. Yields None where this vLLM's output side has no such
    method (module docstring)."""
    try:
        processor = vllm.v1.engine.logprobs.LogprobsProcessor
        processor._update_prompt_logprobs  # noqa: B018 (a vLLM without it is read from its lists)
    except AttributeError:
        yield None
        return
    _hook(processor)
    before, _scoring.chunks = getattr(_scoring, "chunks", None), []
    try:
        yield _scoring.chunks
    finally:
        _scoring.chunks = before
        _unhook(processor)


def _served_rows(out: Any, chunks: list[Any] | None, vocab: int, version: str) -> Any:
    """One sequence's served log-probabilities: from the tensors where they were taken, checked against vLLM's
    own lists of each chunk's first position; else from vLLM's lists."""
    import torch

    listed = dense_logprobs(out.prompt_logprobs, vocab)
    if not chunks:
        return listed
    dense, starts = dense_from_tensors(chunks, vocab)
    if not torch.equal(dense[starts], listed):
        raise AdvisorError("vLLM's prompt log-probability tensors disagree with the lists vLLM made of them: this "
                           f"vLLM ({version}) hands them over otherwise "
                           "than 0.26 did; the served KL cannot be read from them")
    return dense


def served_kl(vllm: Any, llm: Any, sequences: Sequence[Sequence[int]], reference_path: str, vocab: int,
              say: Callable[[str], None] = lambda _m: None, every_s: float = 30.0) -> dict[str, Any]:
    """Full-vocabulary KL of the served model against the reference file's, per sequence (sum and positions) and
    in all (the mean per position, as the proxy's); ``read`` says whether vLLM's tensors or its lists were read.
    ``say`` hears how far it got every ``every_s`` seconds (read from the lists, a sequence took about 5 s at a
    128k vocabulary)."""
    import torch

    reference = torch.load(reference_path, mmap=True)
    t0 = last = time.monotonic()
    params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=-1, temperature=0.0, detokenize=False,
                                 flat_logprobs=True)
    sums, counts, read = [], [], "lists"
    with prompt_logprob_tensors(vllm) as chunks:
        for seq, ref in zip(sequences, reference, strict=True):
            if chunks is not None:
                chunks.clear()
            out = llm.generate([{"prompt_token_ids": list(seq)}], params, use_tqdm=False)[0]
            served = _served_rows(out, chunks, vocab, vllm.__version__)
            read = "tensors" if chunks else read
            if served.shape != ref.shape:
                raise AdvisorError(f"vLLM's log-probabilities are {tuple(served.shape)}, the reference's "
                                   f"{tuple(ref.shape)}: the served model's vocabulary is not the run's model's")
            sums.append(kl_sum(ref, served))
            counts.append(int(ref.shape[0]))
            if time.monotonic() - last >= every_s:
                last = time.monotonic()
                say(f"served KL: {len(sums)} of {len(sequences)} held-out sequences scored ({last - t0:.0f} s)")
    return {"kl": sum(sums) / sum(counts) if counts else None, "kl_sums": sums, "positions": counts, "read": read}
