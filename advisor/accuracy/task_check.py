"""lm-eval tasks judged before any model work, in seconds: a search must not run every trial to
learn at the end that a task name is misspelt or its YAML is broken.

* Local tasks and task YAMLs are built for real (lm-eval reads their JSONL data in well
  under a second) and one request is rendered, so a malformed config, a missing field or a
  template error fails here; its primary metric must be a mean of per-item values (``acc``,
  ``exact_match``: :func:`~advisor.accuracy.task_configs.primary_metric`), as the scoring needs.
* Registry names are looked up in the text of lm-eval's task YAMLs. Building lm-eval's own
  index parses every task YAML it ships (seconds; reports/README.md) and loading a task downloads its
  dataset, so neither happens here. Every task lm-eval registers is defined by a
  ``task: NAME`` line in one of those files, so a name that appears nowhere is unknown for
  certain; a ``group:`` name is refused as lm-eval's loader would refuse it later.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from advisor.accuracy.harness import LOCAL_TASKS, load_tasks, task_config
from advisor.accuracy.task_configs import primary_metric
from advisor.errors import AdvisorError, InputError

_TOP_LEVEL_VALUE = r'^["\']?{key}["\']?[ \t]*:[ \t]*["\']?([^\s"\'#\[\]{{}},]+)'


@dataclass(frozen=True)
class RegistryIndex:
    """Names found in lm-eval's task YAMLs: defined tasks, groups, and every word of the text."""

    tasks: frozenset[str]
    groups: frozenset[str]
    words: frozenset[str]


def check_tasks(tasks: Sequence[str], data_dir: Path | str | None) -> None:
    """Raise InputError for the first task that cannot run; return quietly when all can."""
    for name in tasks:
        cfg = task_config(name, data_dir)  # missing YAML or data files, invalid YAML
        if cfg is None:
            check_registry_name(name)
        else:
            _check_buildable(name, data_dir)


def check_registry_name(name: str) -> None:
    index = registry_index()
    if name in index.tasks:
        return
    local_hint = f"; the local task {name} needs a data dir (--data-dir)" if name in LOCAL_TASKS else ""
    if name in index.groups:
        raise InputError(f"task {name!r} is a group of lm-eval tasks; name its tasks one by one{local_hint}")
    if name not in index.words:
        raise InputError(f"unknown task {name!r}: not an lm-eval task name, a local task "
                         f"({', '.join(LOCAL_TASKS)}) or a task YAML path; check the spelling")


@functools.cache
def registry_index() -> RegistryIndex:
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.origin:
        from advisor.errors import SetupError

        raise SetupError("lm-eval is not installed; pip install lm-eval==0.4.13")
    root = Path(spec.origin).parent / "tasks"
    text = "\n".join(p.read_text(errors="ignore") for p in root.rglob("*.yaml"))

    def values(key: str) -> frozenset[str]:
        return frozenset(re.findall(_TOP_LEVEL_VALUE.format(key=key), text, flags=re.MULTILINE))

    return RegistryIndex(values("task"), values("group"), frozenset(re.findall(r"[\w.\-]+", text)))


def _check_buildable(name: str, data_dir: Path | str | None) -> None:
    """Build the task from its config and render one request, as the scoring will."""
    try:
        with contextlib.redirect_stdout(sys.stderr):  # lm-eval prints; stdout is for results
            (task_name, (task, _)), = load_tasks([name], data_dir).items()
            if len(task.eval_docs) == 0:
                raise InputError(f"task {task_name!r} has no items in its test split; check its data file")
            task.build_all_requests(samples=[0])
        primary_metric(task)
    except AdvisorError:
        raise
    except Exception as exc:  # noqa: BLE001 (lm-eval, datasets and jinja raise any kind)
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise InputError(f"task {name!r}: lm-eval cannot build it from its config "
                         f"({type(exc).__name__}{': ' + detail if detail else ''}); fix the task YAML") from None
