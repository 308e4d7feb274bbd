"""What the benchmark scripts write: the command that ran, the GPU header, JSON, Markdown tables, notes.

One place for the form of a report, so that every report names its command and machine the same way.
Scripts in ``benchmarks/`` import it directly; ``benchmarks/studies/`` reach it through their ``sys.path``.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def command_line(argv: list[str] | None) -> str:
    """The command that ran this script, to record in its report (quoted as a shell would need it to run again)."""
    return "python " + shlex.join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])


def measured_on(d: dict[str, Any]) -> str:
    """The header sentence of a GPU report: ``Measured on **GPU**, driver D, DATE``."""
    return f"Measured on **{d['gpu']}**, driver {d['driver']}, {d['date']}"


def read_notes(path: Path | None) -> list[str]:
    """A JSON list of notes for the Markdown, or none."""
    return json.loads(path.read_text()) if path else []


def dump_json(path: Path, data: Any, *, indent: int | None = 1, newline: bool = False) -> None:
    """``data`` as JSON at ``path`` (``newline``: end the file with one, as some reports always have)."""
    path.write_text(json.dumps(data, indent=indent) + ("\n" if newline else ""))


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> list[str]:
    """A Markdown table's lines; ``align`` holds one letter per column, ``r`` for a right-aligned one."""
    rule = "".join("---:|" if a == "r" else "---|" for a in align.ljust(len(header), "l"))
    return ["| " + " | ".join(header) + " |", "|" + rule, *["| " + " | ".join(r) + " |" for r in rows]]


def write_report(out: Path, d: dict, render: Callable[[dict], str], *, newline: bool = True, echo: bool = True
                 ) -> None:
    """``d`` to ``out`` (JSON) and its rendering next to it (``.md``), and (``echo``) the rendering to stdout."""
    out.parent.mkdir(parents=True, exist_ok=True)
    dump_json(out, d, newline=newline)
    text = render(d)
    out.with_suffix(".md").write_text(text)
    if echo:
        print(text)


def read_report(out: Path) -> dict[str, Any]:
    """The report ``out`` holds so far (a run cut off and started again adds to it); {} where there is none."""
    return json.loads(out.read_text()) if out.is_file() else {}


HEADER_KEYS = ("gpu", "driver", "date", "command", "vllm_version")
#: reports/benchmarks/engine_true's title: engine_true/mlenergy_b200.py and heldout_served.py write a section each
ENGINE_TRUE_TITLE = "Engine-true predictions: the vLLM step model against what vLLM served"


def write_sections(stem: Path, title: str, name: str, section: dict[str, Any]) -> dict[str, Any]:
    """One report that several scripts write, a section each, at ``stem``.json and .md: section ``name`` replaced by
    ``section`` (its data, its ``header``: :data:`HEADER_KEYS`, and its rendered ``markdown`` lines), the others kept
    as they are. The top-level header keys join each section's. Returns the report."""
    json_path = stem.with_suffix(".json")
    report = json.loads(json_path.read_text()) if json_path.is_file() else {}
    sections = {**report.get("sections", {}), name: section}
    report = {k: "; ".join(f"{n}: {s['header'][k]}" for n, s in sections.items()) if len(sections) > 1
              else section["header"][k] for k in HEADER_KEYS} | {"sections": sections}
    dump_json(json_path, report)
    lines = [f"# {title}", ""]
    for n, s in sections.items():
        h = s["header"]
        lines += [f"## {n}", "",
                  f"GPU: {h['gpu']}. Driver: {h['driver']}. Date: {h['date']}. vLLM: {h['vllm_version']}.", "",
                  f"Command: `{h['command']}`", "", *s["markdown"], ""]
    stem.with_suffix(".md").write_text("\n".join(lines))
    return report
