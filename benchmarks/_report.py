"""What the no-GPU analysis benchmarks write: their command line, their notes, and a JSON + Markdown pair."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path


def command_line(argv: list[str] | None) -> str:
    """The command that ran this script, to record in its report."""
    return "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])


def read_notes(path: Path | None) -> list[str]:
    """A JSON list of notes for the Markdown, or none."""
    return json.loads(path.read_text()) if path else []


def write_report(out: Path, d: dict, render: Callable[[dict], str]) -> None:
    """``d`` to ``out`` (JSON) and its rendering next to it (``.md``), and the rendering to stdout."""
    out.write_text(json.dumps(d, indent=1) + "\n")
    text = render(d)
    out.with_suffix(".md").write_text(text)
    print(text)
