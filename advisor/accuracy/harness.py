"""Benchmark accuracy with lm-eval on the in-memory (quantized) model.

The model object that the study holds (a ModelOpt-quantized copy, say) is wrapped in
lm-eval's ``HFLM`` as it is: nothing is written to disk or reloaded. Tasks are either

* local: ``lambada_openai``, ``piqa``, ``arc_easy`` from the YAML files shipped in
  ``advisor/tasks/``, reading JSONL files from a data directory the caller gives
  (``dataset_path: json``; they work with ``HF_DATASETS_OFFLINE=1``), or a path to any
  task YAML (relative ``data_files`` resolve against the data directory, else the
  YAML's folder);
* standard: any other name goes straight to lm-eval's task registry (needs the
  dataset hub, or its cache).

``limit`` scores a seeded random subset of each task (the same items for every plan);
``None`` scores the full set. Scores are cached as JSON files keyed by
(model hash, plan id, task, limit, seed).

lm-eval and torch are imported inside functions, so importing this module is cheap.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import random
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from advisor.accuracy.unscorable import drop_unscorable
from advisor.errors import InputError, SetupError
from advisor.recipe.schema import yaml_problem

log = logging.getLogger(__name__)

LOCAL_TASKS = ("lambada_openai", "piqa", "arc_easy")


@dataclass(frozen=True)
class TaskScore:
    """One task's accuracy for one plan. ``acc`` is a fraction in [0, 1]."""

    task: str
    acc: float
    acc_stderr: float
    n: int  # items scored
    limit: int | None  # None: the full set
    seed: int
    source: str  # "local:<data file>" or "lm-eval"
    acc_norm: float | None = None
    acc_norm_stderr: float | None = None
    time_s: float = 0.0
    unscorable: int = 0  # items left out: their answer has no tokens with this tokenizer (unscorable.py)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskScore:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


# ---------------------------------------------------------------- task configs


def local_task_dir() -> Path:
    """The folder of the task YAMLs shipped with the package."""
    return Path(str(resources.files("advisor.accuracy") / "tasks"))


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        cfg = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InputError(f"cannot read task file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"task file {path} is not valid YAML ({yaml_problem(exc)}); fix that line") from None
    if not isinstance(cfg, dict) or "task" not in cfg:
        raise InputError(f"task file {path} must be a mapping with a 'task' key")
    return cfg


def task_config(name: str, data_dir: Path | str | None) -> dict[str, Any] | None:
    """The inline lm-eval config of a local task, or None for a standard lm-eval name.

    ``name`` is a local task name (needs ``data_dir``) or a path to a task YAML.
    Relative ``data_files`` resolve against ``data_dir``, then (for a YAML path) its folder.
    """
    if name.endswith((".yaml", ".yml")):
        path = Path(name).expanduser()
        if not path.is_file():
            raise InputError(f"task file {name} does not exist; give the path of a task YAML or a task name")
        cfg = _read_yaml(path)
        bases = [Path(data_dir), path.parent] if data_dir is not None else [path.parent]
    elif name in LOCAL_TASKS and data_dir is not None:
        cfg = _read_yaml(local_task_dir() / f"{name}.yaml")
        bases = [Path(data_dir)]
    else:
        return None
    files = (cfg.get("dataset_kwargs") or {}).get("data_files")
    if isinstance(files, str):
        files = {cfg.get("test_split") or "test": files}
    if isinstance(files, dict):
        resolved = {}
        for split, rel in files.items():
            rel_path = Path(rel).expanduser()
            tried = [rel_path] if rel_path.is_absolute() else [b / rel_path for b in bases]
            p = next((c for c in tried if c.is_file()), tried[0])
            if not p.is_file():
                raise InputError(
                    f"task {cfg['task']}: data file {p} does not exist "
                    f"(give the folder holding {rel_path.name} as the data dir)"
                )
            resolved[split] = str(p.resolve())
        cfg["dataset_kwargs"] = {**cfg["dataset_kwargs"], "data_files": resolved}
    return cfg


def _source_of(cfg: dict[str, Any] | None) -> str:
    if cfg is None:
        return "lm-eval"
    files = (cfg.get("dataset_kwargs") or {}).get("data_files") or {}
    return "local:" + ",".join(str(v) for v in files.values()) if files else "local"


def select_indices(n_docs: int, limit: int | None, seed: int) -> list[int] | None:
    """A seeded random subset of ``limit`` item indices (sorted); None means all items."""
    if limit is None or limit >= n_docs:
        return None
    if limit < 1:
        raise InputError(f"limit must be at least 1, got {limit}")
    return sorted(random.Random(seed).sample(range(n_docs), limit))


def _lm_eval():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import lm_eval
            from lm_eval.tasks import TaskManager
        except ImportError as exc:
            raise SetupError(f"lm-eval is not importable ({exc}); pip install lm-eval==0.4.13") from None
    return lm_eval, TaskManager


def load_tasks(tasks: Sequence[str], data_dir: Path | str | None) -> dict[str, tuple[Any, str]]:
    """Build lm-eval Task objects: {task name: (Task, source)}. Datasets are read here."""
    _, TaskManager = _lm_eval()
    configs = {t: task_config(t, data_dir) for t in tasks}
    standard = [t for t, c in configs.items() if c is None]
    manager = TaskManager(include_defaults=bool(standard))
    out: dict[str, tuple[Any, str]] = {}
    for name, cfg in configs.items():
        spec: Any = cfg if cfg is not None else name
        try:
            loaded = manager.load([spec])["tasks"]
        except KeyError:
            hint = f"; local tasks ({', '.join(LOCAL_TASKS)}) need a data dir" if name in LOCAL_TASKS else ""
            raise InputError(f"unknown task {name!r}: not an lm-eval task name or task YAML{hint}") from None
        except (FileNotFoundError, ConnectionError, OSError) as exc:
            raise InputError(f"task {name!r}: cannot read its dataset ({exc})") from None
        if len(loaded) != 1:
            raise InputError(f"task {name!r} is a group of {len(loaded)} tasks; name its tasks one by one")
        (task_name, task), = loaded.items()
        out[task_name] = (task, _source_of(cfg))
    return out


# ---------------------------------------------------------------- scoring


def make_lm(model: Any, tokenizer: Any, batch_size: int | str = 16, max_length: int | None = None) -> Any:
    """Wrap an in-memory HF causal LM (quantized or not) in lm-eval's HFLM."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from lm_eval.models.huggingface import HFLM

        return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length)


def _score_from(results: dict[str, Any], name: str, limit: int | None, seed: int, source: str,
                elapsed: float) -> TaskScore:
    res = results["results"][name]
    n = results.get("n-samples", {}).get(name, {}).get("effective")

    def num(key: str) -> float | None:
        v = res.get(key)
        return float(v) if isinstance(v, int | float) else None

    acc = num("acc,none")
    if acc is None:
        raise InputError(f"task {name!r} reports no 'acc' metric (it has {sorted(res)}); pick an accuracy task")
    return TaskScore(
        task=name, acc=acc, acc_stderr=num("acc_stderr,none") or 0.0, n=int(n), limit=limit, seed=seed,
        source=source, acc_norm=num("acc_norm,none"), acc_norm_stderr=num("acc_norm_stderr,none"),
        time_s=round(elapsed, 3),
    )


def _seed_everything(seed: int) -> None:
    """The seeds lm-eval's simple_evaluate sets (python, numpy, torch)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def evaluate(
    lm: Any,
    tasks: Sequence[str],
    limit: int | None = None,
    seed: int = 0,
    data_dir: Path | str | None = None,
    bootstrap_iters: int = 1000,
) -> dict[str, TaskScore]:
    """Score ``lm`` (an lm-eval LM, e.g. from :func:`make_lm`) on ``tasks``, zero-shot.

    Runs ``lm_eval.evaluator.evaluate`` task by task, set up as ``simple_evaluate``
    does (seeds, ``num_fewshot=0``) minus its environment report (seconds per call).
    """
    lm_eval, _ = _lm_eval()
    from lm_eval.evaluator import evaluate as lm_evaluate

    loaded = load_tasks(tasks, data_dir)
    scores: dict[str, TaskScore] = {}
    for name, (task, source) in loaded.items():
        indices = select_indices(len(task.eval_docs), limit, seed)
        if task.get_config("num_fewshot") is None:
            task.set_config(key="num_fewshot", value=0)
        task.set_fewshot_seed(seed=seed)
        indices, unscorable = drop_unscorable(task, lm, name, indices)
        _seed_everything(seed)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results = lm_evaluate(
                lm=lm, task_dict={"tasks": {name: task}, "groups": {}, "group_map": {}},
                samples={name: indices} if indices is not None else None,
                bootstrap_iters=bootstrap_iters, log_samples=False,
            )
        score = _score_from(results, name, limit, seed, source, time.perf_counter() - t0)
        scores[name] = dataclasses.replace(score, unscorable=unscorable)
        log.info("%s: acc %.4f ± %.4f (n=%d)", name, scores[name].acc, scores[name].acc_stderr, scores[name].n)
    return scores


# ---------------------------------------------------------------- cache


def model_hash(model: Any) -> str:
    """The model's content fingerprint (advisor.models.loading.model_fingerprint); meant for the BF16
    base model, a quantized plan is told apart by its plan id."""
    from advisor.models.loading import model_fingerprint

    return model_fingerprint(model)


class ScoreCache:
    """TaskScores as one JSON file per (model hash, plan id, task, limit, seed) in ``directory``."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)

    @staticmethod
    def key(model_hash: str, plan_id: str, task: str, limit: int | None, seed: int) -> dict[str, Any]:
        return {"model_hash": model_hash, "plan_id": plan_id, "task": task, "limit": limit, "seed": seed}

    def _path(self, key: dict[str, Any]) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
        safe_task = "".join(c if c.isalnum() or c in "-_." else "_" for c in key["task"])[-40:]
        return self.directory / f"{key['plan_id']}-{safe_task}-{digest}.json"

    def get(self, model_hash: str, plan_id: str, task: str, limit: int | None, seed: int) -> TaskScore | None:
        key = self.key(model_hash, plan_id, task, limit, seed)
        path = self._path(key)
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            log.warning("ignoring unreadable cache file %s", path)
            return None
        if data.get("key") != key:
            return None
        return TaskScore.from_dict(data["score"])

    def put(self, model_hash: str, plan_id: str, score: TaskScore) -> Path:
        key = self.key(model_hash, plan_id, score.task, score.limit, score.seed)
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": key, "score": score.to_dict()}, indent=2))
        tmp.replace(path)
        return path


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
    batch_size: int | str = 16,
) -> dict[str, TaskScore]:
    """Scores of the in-memory ``model`` (already assembled for ``plan_id``) on ``tasks``.

    Cached scores are returned without running the model; new ones are stored.
    """
    if not tasks:
        raise InputError("no accuracy tasks given")
    cache = ScoreCache(cache_dir) if cache_dir is not None else None
    scores: dict[str, TaskScore] = {}
    todo: list[str] = []
    for t in tasks:
        task_key = _task_key(t)
        hit = cache.get(model_hash, plan_id, task_key, limit, seed) if cache else None
        if hit is not None:
            scores[task_key] = hit
        else:
            todo.append(t)
    if todo:
        lm = make_lm(model, tokenizer, batch_size=batch_size)
        fresh = evaluate(lm, todo, limit=limit, seed=seed, data_dir=data_dir)
        for t in todo:
            score = fresh[_task_key(t)]
            scores[_task_key(t)] = score
            if cache:
                cache.put(model_hash, plan_id, score)
    return {_task_key(t): scores[_task_key(t)] for t in tasks}


def _task_key(task: str) -> str:
    """The task's name in results: the YAML's ``task`` for a file, else the name itself."""
    if task.endswith((".yaml", ".yml")) and Path(task).is_file():
        try:
            return str(yaml.safe_load(Path(task).read_text())["task"])
        except (OSError, yaml.YAMLError, KeyError, TypeError):
            return task
    return task


# ---------------------------------------------------------------- report helpers


def accuracy_table(rows: Mapping[str, Mapping[str, TaskScore]], tasks: Iterable[str] | None = None) -> str:
    """Markdown table: one row per plan label, one column per task, 'acc ± stderr (n)' in %."""
    tasks = list(tasks) if tasks is not None else sorted({t for r in rows.values() for t in r})
    lines = ["| plan | " + " | ".join(tasks) + " |", "|---|" + "---:|" * len(tasks)]
    for label, scores in rows.items():
        cells = []
        for t in tasks:
            s = scores.get(t)
            cells.append(f"{100 * s.acc:.2f} ± {100 * s.acc_stderr:.2f} (n={s.n})" if s else "–")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
