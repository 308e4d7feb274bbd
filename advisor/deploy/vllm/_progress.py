"""What a vLLM serving says as it goes: what the engine's start spent, read from vLLM's own log lines as they
pass, and a line per metering with what is left.

vLLM's engine core runs in a process of its own and logs its start to the standard output it inherits (weights
loaded, torch.compile, CUDA-graph capture, the whole engine init). :func:`watch_output` copies this process's
standard output and error through pipes, so every line still reaches the terminal, and keeps the seconds those
lines name; :func:`start_seconds` reads them from a text, for tests and for logs kept elsewhere.
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
    # with VLLM_USE_AOT_COMPILE=0 vLLM names the same span "torch.compile and initial profiling/warmup run together"
    "compile_s": re.compile(r"torch\.compile (?:and initial profiling/warmup run together )?took ([\d.]+) s in total"),
    "graph_capture_s": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
    "engine_init_s": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
}
# The clock time of two lines, for the kernel warm-up between them: after CUDA-graph capture vLLM's V2 model runner
# runs steps with every sampling feature, which JIT-compiles their kernels (FlashInfer's top-k/top-p sampler built
# with nvcc unless VLLM_USE_FLASHINFER_SAMPLER=0, Triton's: reports/benchmarks/verify_time.md), and logs nothing
# until its JIT monitor starts
STAMPED_LINES: dict[str, re.Pattern[str]] = {
    "graph_capture_at": re.compile(r"INFO \S+ (\d\d):(\d\d):(\d\d) .*Graph capturing finished"),
    "warmed_at": re.compile(r"INFO \S+ (\d\d):(\d\d):(\d\d) .*Kernel JIT monitor activated"),
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
        for key, pattern in STAMPED_LINES.items():
            found = pattern.search(line)
            if found:
                h, m, sec = (int(g) for g in found.groups())
                out[key] = float(h * 3600 + m * 60 + sec)
        if COMPILE_CACHE_HIT.search(line):
            out["compile_cache_hit"] = True
    return with_warmup(out)


def with_warmup(stages: dict[str, float | bool]) -> dict[str, float | bool]:
    """``stages`` with ``kernel_warmup_s`` (the clock seconds from CUDA-graph capture to vLLM's JIT monitor) where
    both lines were seen."""
    start, end = stages.get("graph_capture_at"), stages.get("warmed_at")
    if isinstance(start, float) and isinstance(end, float):
        stages["kernel_warmup_s"] = (end - start) % 86400
    return stages


@contextmanager
def watch_output(fds: tuple[int, ...] = (1, 2)) -> Iterator[dict[str, float | bool]]:
    """Within the block, each of file descriptors ``fds`` (this process's and its children's standard output and
    error: vLLM logs to standard output) passes through a pipe whose lines still reach where they went before;
    the dict yielded fills with the start's stages (:func:`start_seconds`) as their lines pass."""
    found: dict[str, float | bool] = {}
    originals, threads = [], []
    for fd in fds:
        original = os.dup(fd)
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        originals.append((fd, original))
        threads.append(threading.Thread(target=_pump, args=(read_end, original, found), daemon=True))
        threads[-1].start()
    try:
        yield found
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, original in originals:  # the pipe's last writer here closes; the engine core's when it exits
            os.dup2(original, fd)
        for thread in threads:
            thread.join(timeout=0.5)


def _pump(read_end: int, original: int, found: dict[str, float | bool]) -> None:
    pending = b""
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        while chunk := pipe.read(65536):
            os.write(original, chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                found.update(start_seconds(line.decode("utf-8", "replace")))
                with_warmup(found)


def say(message: str) -> None:
    """A line beside vLLM's own log (the engine's process has no other way to the terminal)."""
    print(message, file=sys.stderr, flush=True)


def start_words(start: dict[str, Any]) -> str:
    names = {"weights_s": "weights", "compile_s": "torch.compile", "graph_capture_s": "CUDA graphs",
             "kernel_warmup_s": "kernel warm-up", "engine_init_s": "engine init"}
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
