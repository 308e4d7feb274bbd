"""Accuracy as served, for `advisor verify`: the full-vocabulary KL of vLLM and of the advisor's own model of
each export against the BF16 reference on the run's held-out tokens, and LAMBADA-style items (context, last word)
scored greedily by both.

The advisor's own model is scored where it is already in memory: as the export reloads it for its round trip
(:func:`own_model_scorer`), else after the serving from the export's folder (all-BF16 served as it is: the loaded
model itself), so verify reads no export from disk twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.deploy.vllm import kl_sum, logprobs_per_sequence
from advisor.errors import InputError
from advisor.files import check_regular_file
from advisor.plan import Plan
from advisor.report.verify_record import ServedAccuracy


def read_lambada(path: Path, count: int) -> list[tuple[str, str]]:
    """The first ``count`` items of a LAMBADA JSONL file ({"text": ...}, or {"context": ..., "continuation":
    last word}) as (context, last word): read before anything is served, so a bad file is named first."""
    check_regular_file(path, "--lambada:", "give a LAMBADA JSONL file")
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise InputError(f"--lambada: cannot read {path} ({exc.strerror or exc}); give a LAMBADA JSONL file") from None
    except UnicodeDecodeError:
        raise InputError(f"--lambada: {path} is not UTF-8 text; give a LAMBADA JSONL file") from None
    docs = []
    for line in lines[:count]:
        try:
            doc = json.loads(line)
            docs.append(doc["text"].rpartition(" ")[::2] if "text" in doc
                        else (doc["context"].rstrip(" "), doc["continuation"].strip()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise InputError(f"--lambada: {path} has a line that is not JSON with a \"text\" field "
                             "(or \"context\" and \"continuation\"); give a LAMBADA JSONL file") from None
    return docs


def lambada_items(docs: Sequence[tuple[str, str]], tokenizer: Any) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """LAMBADA items (:func:`read_lambada`) as (context, target) token ids: the target is the last word with its
    leading space, as lm-eval's lambada_openai splits it."""
    items = []
    for context, word in docs:
        ctx = tokenizer(context, add_special_tokens=False)["input_ids"]
        whole = tokenizer(context + " " + word, add_special_tokens=False)["input_ids"]
        # lm-eval's split (what follows the context's tokens); a tokenizer that merges across the boundary
        # gets the word encoded on its own
        cont = (whole[len(ctx):] if whole[:len(ctx)] == ctx
                else tokenizer(" " + word, add_special_tokens=False)["input_ids"])
        if ctx and cont:
            items.append((tuple(ctx), tuple(cont)))
    return items


def greedy_hits(model: Any, items: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[bool]:
    """The advisor's model on the same items and rule as :func:`advisor.deploy.vllm._serve.greedy_hits`."""
    hits = []
    for context, target in items:
        (lp,) = logprobs_per_sequence(model, [tuple(context) + tuple(target)])
        start = len(context) - 1  # lp[i] predicts token i + 1
        hits.append(all(int(lp[start + j].argmax()) == int(t) for j, t in enumerate(target)))
    return hits


@dataclass(frozen=True)
class OwnModelScore:
    """The advisor's own model of an export on verify's tokens: its KL against the reference (the mean per
    position; None on no position) and its greedy hits on the items."""

    kl: float | None
    hits: list[bool] = field(default_factory=list)


def accuracy_as_served(reference: Sequence[Any], own: OwnModelScore, served: dict[str, Any], sequences: int,
                       items: int, heldout_count: int = 0) -> ServedAccuracy:
    """The served model's full-vocabulary KL against ``reference`` (the reference's log-probabilities on the first
    ``sequences`` of the run's ``heldout_count`` held-out sequences) beside the advisor's own model's (``own``) on
    the same positions; the accuracy of both on the ``items``."""
    positions = sum(int(r.shape[0]) for r in reference)
    kl = served.get("served_kl") or {}
    out: dict[str, Any] = {"served_kl": kl.get("kl"), "advisor_kl": own.kl, "sequences": sequences,
                           "positions": positions, "heldout_sequences": heldout_count or sequences}
    if items:
        vllm_hits = served.get("items", [])
        out["items"] = {"n": items, "vllm_accuracy": sum(vllm_hits) / items,
                        "advisor_accuracy": sum(own.hits) / items,
                        "disagree": sum(a != b for a, b in zip(vllm_hits, own.hits, strict=False))}
    return ServedAccuracy.model_validate(out)


def score_own_model(reference: Sequence[Any], model: Any, heldout: Sequence[Sequence[int]],
                    items: Sequence[tuple[Sequence[int], Sequence[int]]]) -> OwnModelScore:
    """``model`` (the advisor's own model of an export) on the held-out sequences ``reference`` was scored on, and
    on ``items``."""
    mine = logprobs_per_sequence(model, heldout)
    positions = sum(int(r.shape[0]) for r in reference)
    kl = sum(kl_sum(r, m) for r, m in zip(reference, mine, strict=True)) / positions if positions else None
    return OwnModelScore(kl, greedy_hits(model, items) if items else [])


def own_model_scorer(reference: Sequence[Any], heldout: Sequence[Sequence[int]],
                     items: Sequence[tuple[Sequence[int], Sequence[int]]], scores: dict[str, OwnModelScore]
                     ) -> Callable[[Plan, Any], None]:
    """For an export's round trip (``on_reloaded``): each reloaded model scored into ``scores`` by plan id."""

    def score(plan: Plan, reloaded: Any) -> None:
        scores[plan.id] = score_own_model(reference, reloaded.eval(), heldout, items)

    return score
