"""Which lm-eval tasks a run scores, where their data come from, and which metric decides.

Tasks are either

* local: ``lambada_openai``, ``piqa``, ``arc_easy``, ``gsm8k`` from the YAML files shipped in
  ``advisor/accuracy/tasks/``, reading JSONL files from a data directory the caller gives
  (``dataset_path: json``; they work with ``HF_DATASETS_OFFLINE=1``), or a path to any
  task YAML (relative ``data_files`` resolve against the data directory, else the
  YAML's folder);
* standard: any other name goes to lm-eval's task registry (needs the dataset hub, or
  its cache).

A task's primary metric is the first metric of its ``metric_list`` under its first filter
(lm-eval's result key ``"<metric>,<filter>"``); it must average per-item values
(``aggregation: mean``), because acceptance compares plans item by item.

lm-eval is imported inside functions, so importing this module is cheap.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from advisor.errors import InputError, SetupError
from advisor.files import check_regular_file
from advisor.recipe.schema import yaml_problem

LOCAL_TASKS = ("lambada_openai", "piqa", "arc_easy", "gsm8k")


@dataclass(frozen=True)
class PrimaryMetric:
    name: str  # e.g. "acc", "exact_match"
    filter: str  # lm-eval filter name; "none" without a filter_list
    higher_is_better: bool

    @property
    def key(self) -> str:
        return f"{self.name},{self.filter}"


def local_task_dir() -> Path:
    """The folder of the task YAMLs shipped with the package."""
    return Path(str(resources.files("advisor.accuracy") / "tasks"))


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read task file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"task file {path} is not UTF-8 text (byte {exc.start}); give a task YAML saved as UTF-8"
                         ) from None
    except yaml.YAMLError as exc:
        raise InputError(f"task file {path} is not valid YAML ({yaml_problem(exc)}); fix that line") from None
    if not isinstance(cfg, dict) or "task" not in cfg:
        raise InputError(f"task file {path} must be a mapping with a 'task' key")
    return cfg


def is_task_file(name: str) -> bool:
    return name.endswith((".yaml", ".yml"))


def task_config(name: str, data_dir: Path | str | None) -> dict[str, Any] | None:
    """The inline lm-eval config of a local task, or None for a standard lm-eval name.

    ``name`` is a local task name (needs ``data_dir``) or a path to a task YAML.
    Relative ``data_files`` resolve against ``data_dir``, then (for a YAML path) its folder.
    """
    if is_task_file(name):
        path = Path(name).expanduser()
        check_regular_file(path, "task file", "give the path of a task YAML or a task name")
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


def source_of(cfg: dict[str, Any] | None) -> str:
    if cfg is None:
        return "lm-eval"
    files = (cfg.get("dataset_kwargs") or {}).get("data_files") or {}
    return "local:" + ",".join(str(v) for v in files.values()) if files else "local"


def task_key(task: str) -> str:
    """The task's name in results: the YAML's ``task`` for a file, else the name itself."""
    if is_task_file(task) and Path(task).is_file():
        try:
            return str(yaml.safe_load(Path(task).read_text(encoding="utf-8"))["task"])
        except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError):
            return task
    return task


def _config_metric_problem(cfg: dict[str, Any]) -> str | None:
    """Why a task config's primary metric cannot be compared item by item, or None."""
    metrics = cfg.get("metric_list") or []
    if not metrics:
        return None  # lm-eval's defaults for the output type (acc, exact_match, ...) are means
    first = metrics[0]
    aggregation = first.get("aggregation", "mean") if isinstance(first, dict) else "mean"
    if aggregation != "mean":
        return (f"its primary metric {first.get('metric')!r} aggregates with {aggregation!r}, not a mean "
                "of per-item values; put a per-item metric (acc, exact_match, ...) first in metric_list")
    return None


def _lm_eval_task_manager(include_defaults: bool) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from lm_eval.tasks import TaskManager
        except ImportError as exc:
            raise SetupError(f"lm-eval is not importable ({exc}); pip install lm-eval==0.4.13") from None
        return TaskManager(include_defaults=include_defaults)


def validate_tasks(tasks: Sequence[str], data_dir: Path | str | None) -> list[str]:
    """Check task names before anything is loaded; return their names in results.

    Local names and YAML files: the YAML parses, its data files exist, its primary metric
    is a per-item mean. Other names: lm-eval's registry knows them as single tasks (groups
    and tags are refused: name their tasks). Datasets are not read. One InputError lists
    every problem.
    """
    if not tasks:
        raise InputError("benchmark.tasks: give at least one task")
    problems: list[str] = []
    keys: list[str] = []
    standard: list[str] = []
    for name in tasks:
        try:
            cfg = task_config(name, data_dir)
        except InputError as exc:
            problems.append(str(exc))
            continue
        if cfg is None:
            standard.append(name)
            keys.append(name)
            continue
        keys.append(str(cfg["task"]))
        if (why := _config_metric_problem(cfg)) is not None:
            problems.append(f"task {cfg['task']}: {why}")
    if standard:
        manager = _lm_eval_task_manager(include_defaults=True)
        groups = set(manager.all_groups) | set(manager.all_tags)
        for name in standard:
            if name in groups:
                problems.append(f"task {name!r} is a group of tasks in lm-eval; name its tasks one by one")
            elif name not in manager.task_index:
                close = difflib.get_close_matches(name, manager.all_subtasks, n=3)
                local = f"; local tasks ({', '.join(LOCAL_TASKS)}) need benchmark.data_dir" \
                    if name in LOCAL_TASKS else ""
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                problems.append(f"unknown task {name!r}: not an lm-eval task name or task YAML{local}{hint}")
    if len(set(keys)) != len(keys):
        problems.append(f"tasks {keys} name one task twice")
    if problems:
        raise InputError("benchmark.tasks: " + "; ".join(problems))
    return keys


def load_tasks(tasks: Sequence[str], data_dir: Path | str | None) -> dict[str, tuple[Any, str]]:
    """Build lm-eval Task objects: {task name: (Task, source)}. Datasets are read here."""
    configs = {t: task_config(t, data_dir) for t in tasks}
    standard = [t for t, c in configs.items() if c is None]
    manager = _lm_eval_task_manager(include_defaults=bool(standard))
    out: dict[str, tuple[Any, str]] = {}
    for name, cfg in configs.items():
        spec: Any = cfg if cfg is not None else name
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                loaded = manager.load([spec])["tasks"]
        except KeyError:
            hint = f"; local tasks ({', '.join(LOCAL_TASKS)}) need a data dir" if name in LOCAL_TASKS else ""
            raise InputError(f"unknown task {name!r}: not an lm-eval task name or task YAML{hint}") from None
        except (FileNotFoundError, ConnectionError, OSError) as exc:
            raise InputError(f"task {name!r}: cannot read its dataset ({exc})") from None
        if len(loaded) != 1:
            raise InputError(f"task {name!r} is a group of {len(loaded)} tasks; name its tasks one by one")
        (task_name, task), = loaded.items()
        out[task_name] = (task, source_of(cfg))
    return out


def primary_metric(task: Any) -> PrimaryMetric:
    """The metric that decides: first in the task's metric list, under its first filter."""
    name = task.task_name if hasattr(task, "task_name") else "task"
    aggregations = task.aggregation()
    if not aggregations:
        raise InputError(f"task {name!r} defines no metric")
    metric = next(iter(aggregations))
    aggregate = aggregations[metric]
    if getattr(aggregate, "__name__", "") != "mean":
        raise InputError(f"task {name!r}: its primary metric {metric!r} aggregates with "
                         f"{getattr(aggregate, '__name__', aggregate)!r}, not a mean of per-item values; put a "
                         "per-item metric (acc, exact_match, ...) first in metric_list")
    filters = task.get_config("filter_list") or []
    first = filters[0] if filters else None
    filter_name = (first.get("name") if isinstance(first, dict) else getattr(first, "name", None)) or "none"
    return PrimaryMetric(metric, str(filter_name), bool(task.higher_is_better().get(metric, True)))
