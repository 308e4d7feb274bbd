"""Items lm-eval cannot score with a given tokenizer, found before lm-eval sees them.

lm-eval's HFLM scores a loglikelihood request (LAMBADA's answer, each choice of PIQA or
ARC) as the log-probability of the continuation's tokens after the context's. When the
tokenizer gives the continuation no tokens of its own (it merges it into the context's
last tokens: 220 of LAMBADA's 5,153 answers with the TinyStories tokenizer, 1 of a 10-item
sample), HFLM stops on ``assert len(continuation_enc) > 0`` and the whole evaluation is lost. Such
items are left out and counted instead. The tokenizer is the model's, the same for every
plan, so every plan leaves out the same items and comparisons stay paired.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from advisor.errors import InputError

log = logging.getLogger(__name__)
_FOUND: weakref.WeakKeyDictionary[Any, dict[tuple, frozenset[int]]] = weakref.WeakKeyDictionary()


def drop_unscorable(task: Any, lm: Any, name: str, doc_ids: list[int] | None) -> tuple[list[int] | None, int]:
    """``doc_ids`` (None: all) without the items lm-eval cannot score, and how many were left out
    (with a warning)."""
    bad = unscorable_doc_ids(task, lm, doc_ids)
    if not bad:
        return doc_ids, 0
    kept = [i for i in (doc_ids if doc_ids is not None else range(len(task.eval_docs))) if i not in bad]
    if not kept:
        raise InputError(f"task {name!r}: none of its {len(bad)} items can be scored with this model's tokenizer "
                         "(every answer tokenizes to nothing); choose another task")
    log.warning("%s: %d of %d items left out as unscorable (the answer has no tokens of its own with this "
                "tokenizer)", name, len(bad), len(bad) + len(kept))
    return kept, len(bad)


def unscorable_doc_ids(task: Any, lm: Any, doc_ids: list[int] | None) -> set[int]:
    """Indices (into ``task.eval_docs``) among ``doc_ids`` (None: all) whose requests cannot be
    scored by ``lm``; empty when ``lm`` is not an HFLM-like model with lm-eval's encoders.

    Remembered per tokenizer: a search scores several plans with one tokenizer, and building
    a full task's requests takes seconds.
    """
    if not hasattr(lm, "_encode_pair") or not hasattr(lm, "tok_encode"):
        return set()
    key = (task.config.task, repr(task.config.dataset_kwargs), task.get_config("num_fewshot"),
           len(task.eval_docs), tuple(doc_ids) if doc_ids is not None else None)
    try:
        known = _FOUND.setdefault(lm.tokenizer, {})
    except TypeError:  # a tokenizer that cannot be weakly referenced: no memory
        known = {}
    if key not in known:
        known[key] = _find_unscorable(task, lm, doc_ids)
    return set(known[key])


def _find_unscorable(task: Any, lm: Any, doc_ids: list[int] | None) -> frozenset[int]:
    # The requests exactly as the evaluator builds them (num_fewshot and seeds already set).
    task.build_all_requests(samples=doc_ids)
    # With ``samples``, lm-eval numbers the selected documents 0..k-1 in document order.
    original = sorted(doc_ids) if doc_ids else None
    bad = set()
    for inst in task.instances:
        if inst.request_type != "loglikelihood":
            continue
        context, continuation = inst.args[:2]
        if continuation_tokens(lm, context, continuation) == 0:
            bad.add(original[inst.doc_id] if original else inst.doc_id)
    return frozenset(bad)


def continuation_tokens(lm: Any, context: str, continuation: str) -> int:
    """How many tokens lm-eval's ``loglikelihood`` gives ``continuation`` (its own split rule)."""
    if context == "":
        enc = lm.tok_encode(continuation, add_special_tokens=False)
        if not enc:
            return 0
        return len(enc) - 1 if enc[0] == lm.prefix_token_id else len(enc)
    _, continuation_enc = lm._encode_pair(context, continuation)
    return len(continuation_enc)
