"""Benchmark accuracy with lm-eval on the in-memory (quantized) model, item by item.

The model object that the study holds (a ModelOpt-quantized copy, say) is wrapped in
lm-eval's ``HFLM`` as it is: nothing is written to disk or reloaded. Which tasks and
which metric: :mod:`advisor.accuracy.task_configs`. Every item's value of the primary
metric is kept (lm-eval's ``log_samples``), so plans can be compared with BF16 item by
item (:mod:`advisor.search.stats`).

Items are taken in a seeded order of the task's documents (:func:`item_order`); ``limit``
scores its first ``limit`` items, so a larger limit holds every item of a smaller one (the
nested batches of sequential evaluation). ``None`` scores the full set. Per-item results
are cached by (model hash, plan id, task, seed) and only missing items are scored.

lm-eval and torch are imported inside functions, so importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from advisor.accuracy.score_cache import ScoreCache, TaskScore
from advisor.accuracy.task_configs import (
    LOCAL_TASKS,
    load_tasks,
    local_task_dir,
    primary_metric,
    task_config,
    task_key,
    validate_tasks,
)
from advisor.accuracy.unscorable import drop_unscorable
from advisor.errors import InputError, SetupError

log = logging.getLogger(__name__)

__all__ = [
    "LOCAL_TASKS", "ScoreCache", "TaskScore", "accuracy_table", "default_batch_size", "evaluate", "item_order",
    "load_tasks", "local_task_dir", "make_lm", "model_hash", "score_plan", "select_indices", "task_config",
    "task_key", "task_sizes", "validate_tasks",
]


def item_order(n_docs: int, seed: int) -> list[int]:
    """A seeded permutation of the task's document indices; subsets are its prefixes."""
    order = list(range(n_docs))
    random.Random(seed).shuffle(order)
    return order


def select_indices(n_docs: int, limit: int | None, seed: int) -> list[int] | None:
    """The first ``limit`` items of the seeded order, sorted; None means all items."""
    if limit is None or limit >= n_docs:
        return None
    if limit < 1:
        raise InputError(f"limit must be at least 1, got {limit}")
    return sorted(item_order(n_docs, seed)[:limit])


def _lm_eval_evaluate() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from lm_eval.evaluator import evaluate as lm_evaluate
        except ImportError as exc:
            raise SetupError(f"lm-eval is not importable ({exc}); pip install lm-eval==0.4.13") from None
    return lm_evaluate


@contextlib.contextmanager
def lm_eval_quiet() -> Iterator[None]:
    """lm-eval without its progress bars and notices: the advisor's own stage progress reports
    the benchmark (a line a minute without a terminal), and lm-eval's bars and "already
    initialized model" warnings would fill a CI log. Errors still propagate and still log."""
    import lm_eval.api.model
    import lm_eval.api.task
    import lm_eval.models.huggingface
    from tqdm import tqdm

    class SilentTqdm(tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    modules = (lm_eval.api.model, lm_eval.api.task, lm_eval.models.huggingface)
    saved = [m.tqdm for m in modules]
    logger = logging.getLogger("lm_eval")
    level = logger.level
    logger.setLevel(logging.ERROR)
    for m in modules:
        m.tqdm = SilentTqdm
    try:
        yield
    finally:
        for m, original in zip(modules, saved, strict=True):
            m.tqdm = original
        logger.setLevel(level)


def default_batch_size(model: Any) -> int:
    """lm-eval's batch for ``model``: 16 on a GPU; 8 on a CPU, where a larger batch buys no faster
    products and pads more (requests are batched by length; PIQA at 16: 8% padded tokens, at 8: 4%)."""
    return 8 if next(model.parameters()).device.type == "cpu" else 16


def make_lm(model: Any, tokenizer: Any, batch_size: int | str = 16, max_length: int | None = None) -> Any:
    """Wrap an in-memory HF causal LM (quantized or not) in lm-eval's HFLM."""
    with warnings.catch_warnings(), lm_eval_quiet():
        warnings.simplefilter("ignore")
        from lm_eval.models.huggingface import HFLM

        return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length)


def _seed_everything(seed: int) -> None:
    """The seeds lm-eval's simple_evaluate sets (python, numpy, torch)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _items_from(samples: list[dict[str, Any]], metric: Any, indices: Sequence[int], name: str) -> dict[int, float]:
    """Per-item values of the primary metric from lm-eval's logged samples."""
    items: dict[int, float] = {}
    for s in samples:
        if s.get("filter", "none") != metric.filter:
            continue
        value = s.get(metric.name)
        if not isinstance(value, int | float):
            raise InputError(f"task {name!r}: per-item {metric.name!r} is {type(value).__name__}, not a number")
        items[int(s["doc_id"])] = float(value)
    if sorted(items) != sorted(indices):
        raise RuntimeError(f"task {name!r}: lm-eval returned {len(items)} items for {len(indices)} asked")
    return items


def task_sizes(tasks: Sequence[str], data_dir: Path | str | None) -> dict[str, int]:
    """Documents per task (reads the datasets): {task name in results: count}."""
    return {name: len(task.eval_docs) for name, (task, _) in load_tasks(tasks, data_dir).items()}


def evaluate(
    lm: Any,
    tasks: Sequence[str],
    limit: int | None = None,
    seed: int = 0,
    data_dir: Path | str | None = None,
    bootstrap_iters: int = 1000,
    indices: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, TaskScore]:
    """Score ``lm`` (an lm-eval LM, e.g. from :func:`make_lm`) on ``tasks``, zero-shot unless a
    task sets ``num_fewshot``, keeping each item's value of the task's primary metric.

    Items: ``indices[task]`` (document indices) when given, else the first ``limit`` of the
    seeded order. Runs ``lm_eval.evaluator.evaluate`` task by task, set up as
    ``simple_evaluate`` does (seeds, ``num_fewshot``) minus its environment report.
    """
    lm_evaluate = _lm_eval_evaluate()
    scores: dict[str, TaskScore] = {}
    for name, (task, source) in load_tasks(tasks, data_dir).items():
        n_docs = len(task.eval_docs)
        chosen = sorted(indices[name]) if indices is not None and name in indices else (
            select_indices(n_docs, limit, seed) or list(range(n_docs)))
        metric = primary_metric(task)
        if task.get_config("num_fewshot") is None:
            task.set_config(key="num_fewshot", value=0)
        task.set_fewshot_seed(seed=seed)
        kept, unscorable = drop_unscorable(task, lm, name, chosen)
        chosen = kept if kept is not None else chosen
        _seed_everything(seed)
        t0 = time.perf_counter()
        with warnings.catch_warnings(), lm_eval_quiet():
            warnings.simplefilter("ignore")
            results = lm_evaluate(
                lm=lm, task_dict={"tasks": {name: task}, "groups": {}, "group_map": {}},
                samples={name: chosen} if len(chosen) < n_docs else None,
                bootstrap_iters=bootstrap_iters, log_samples=True,
            )
        items = _items_from(results["samples"][name], metric, chosen, name)
        scores[name] = TaskScore.from_items(
            name, metric.key, items, limit=limit, seed=seed, source=source,
            higher_is_better=metric.higher_is_better, n_docs=n_docs, time_s=round(time.perf_counter() - t0, 3),
            unscorable=unscorable,
        )
        log.info("%s: %s %.4f ± %.4f (n=%d)", name, metric.key, scores[name].value, scores[name].stderr,
                 scores[name].n)
    return scores


def model_hash(model: Any) -> str:
    """The model's content fingerprint (advisor.models.loading.model_fingerprint); meant for the BF16
    base model, a quantized plan is told apart by its plan id."""
    from advisor.models.loading import model_fingerprint

    return model_fingerprint(model)


def score_plan(
    model: Any,
    tokenizer: Any,
    plan_id: str,
    model_hash: str,
    tasks: Sequence[str],
    limit: int | None = None,
    seed: int = 0,
    data_dir: Path | str | None = None,
    cache_dir: Path | str | None = None,
    batch_size: int | None = None,
    n_docs: Mapping[str, int] | None = None,
) -> dict[str, TaskScore]:
    """Scores of the in-memory ``model`` (already assembled for ``plan_id``) on the first
    ``limit`` items of each task's seeded order.

    Cached items are not scored again; only the missing ones run. ``batch_size``: lm-eval's batch,
    else :func:`default_batch_size` (a batch changes no item's score beyond rounding). ``n_docs`` (documents per
    task, from :func:`task_sizes`) saves reading a dataset to learn which items a limit means.
    """
    if not tasks:
        raise InputError("no accuracy tasks given")
    cache = ScoreCache(cache_dir) if cache_dir is not None else None
    keys = {t: task_key(t) for t in tasks}
    scores: dict[str, TaskScore] = {}
    todo: dict[str, list[int] | None] = {}  # task -> missing indices (None: all of the subset)
    for t, key in keys.items():
        cached = cache.load(model_hash, plan_id, key, seed) if cache else None
        size = (n_docs or {}).get(key) or (cached.n_docs if cached else 0)
        if cached is None or not size:
            todo[t] = None
            continue
        wanted = select_indices(size, limit, seed) or list(range(size))
        missing = [i for i in wanted if i not in cached.items]
        if missing:
            todo[t] = missing
        else:
            scores[key] = cached.subset(wanted, limit)
    if todo:
        lm = make_lm(model, tokenizer, batch_size=batch_size or default_batch_size(model))
        explicit = {keys[t]: idx for t, idx in todo.items() if idx is not None}
        fresh = evaluate(lm, list(todo), limit=limit, seed=seed, data_dir=data_dir, indices=explicit)
        for t in todo:
            key = keys[t]
            score = fresh[key]
            if cache:
                cache.put(model_hash, plan_id, score)
                whole = cache.load(model_hash, plan_id, key, seed)
                if whole is not None:
                    wanted = select_indices(score.n_docs, limit, seed) or list(range(score.n_docs))
                    score = whole.subset(wanted, limit)
            scores[key] = score
    return {keys[t]: scores[keys[t]] for t in tasks}


def accuracy_table(rows: Mapping[str, Mapping[str, TaskScore]], tasks: Iterable[str] | None = None) -> str:
    """Markdown table: one row per plan label, one column per task, 'value ± stderr (n)' in %."""
    tasks = list(tasks) if tasks is not None else sorted({t for r in rows.values() for t in r})
    lines = ["| plan | " + " | ".join(tasks) + " |", "|---|" + "---:|" * len(tasks)]
    for label, scores in rows.items():
        cells = []
        for t in tasks:
            s = scores.get(t)
            cells.append(f"{100 * s.value:.2f} ± {100 * s.stderr:.2f} (n={s.n}, {s.metric_name})" if s else "–")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
