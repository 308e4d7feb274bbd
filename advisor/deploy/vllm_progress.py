"""What a vLLM serving says as it goes: what the engine's start spent, read from vLLM's own log lines as they
pass, and a line per metering with what is left.

vLLM's engine core runs in a process of its own and logs its start to the standard error it inherits (weights
loaded, torch.compile, CUDA-graph capture, the whole engine init). :func:`watch_stderr` copies this process's
file descriptor 2 through a pipe, so every line still reaches the terminal, and keeps the seconds those lines
name; :func:`start_seconds` reads them from a text, for tests and for logs kept elsewhere.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

# vLLM 0.26.0's start lines (model_runner.py, monitor.py, backends.py, core.py); a line that does not match is
# only passed through
START_LINES: dict[str, re.Pattern[str]] = {
    "weights_s": re.compile(r"Model loading took .*? and ([\d.]+) seconds"),
    "dynamo_s": re.compile(r"Dynamo bytecode transform time: ([\d.]+) s"),
    "compile_s": re.compile(r"torch\.compile took ([\d.]+) s in total"),
    "graph_capture_s": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
    "engine_init_s": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
}
COMPILE_CACHE_HIT = re.compile(r"Directly load the compiled graph|Loading the AOT compiled|loaded AOT compiled",
                               re.IGNORECASE)


def start_seconds(text: str) -> dict[str, float | bool]:
    """The start's stages named in ``text`` (vLLM's log), in seconds; ``compile_cache_hit`` where vLLM loaded a
    graph it compiled before."""
    out: dict[str, float | bool] = {}
    for line in text.splitlines():
        for key, pattern in START_LINES.items():
            found = pattern.search(line)
            if found:
                out[key] = float(found.group(1))
        if COMPILE_CACHE_HIT.search(line):
            out["compile_cache_hit"] = True
    return out


@contextmanager
def watch_stderr() -> Iterator[dict[str, float | bool]]:
    """Within the block, file descriptor 2 (this process's and its children's standard error) passes through a
    pipe whose lines still reach the original standard error; the dict yielded fills with the start's stages
    (:func:`start_seconds`) as their lines pass."""
    found: dict[str, float | bool] = {}
    original = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def pump() -> None:
        pending = b""
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                os.write(original, chunk)
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    found.update(start_seconds(line.decode("utf-8", "replace")))

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        os.dup2(original, 2)  # the pipe's last writer here closes; the engine core's copy closes when it exits
        thread.join(timeout=0.5)


def say(message: str) -> None:
    """A line beside vLLM's own log (the engine's process has no other way to the terminal)."""
    print(message, file=sys.stderr, flush=True)


def start_words(start: dict[str, Any]) -> str:
    names = {"weights_s": "weights", "compile_s": "torch.compile", "graph_capture_s": "CUDA graphs",
             "engine_init_s": "engine init"}
    parts = [f"{names[k]} {start[k]:.0f} s" for k in names if k in start]
    if start.get("compile_cache_hit"):
        parts.append("compiled graph read from vLLM's cache")
    return ", ".join(parts) or "vLLM's log named no stage"


def metering_line(workload: dict[str, Any], done: Sequence[dict[str, Any]], queued: int) -> str:
    """What is metered now, what is left of this round and how long that is expected to take (the meterings so
    far, on average; later rounds of a batch search are not known yet)."""
    each = statistics.fmean(m["seconds"] for m in done) if done else None
    left = f"{queued} more queued" + (f", about {each * (queued + 1):.0f} s with this one" if each else "")
    return f"metering '{workload['name']}' at batch {workload['batch_size']} ({len(done) + 1} this engine; {left})"
