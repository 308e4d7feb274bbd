"""One line for a CUDA out-of-memory error: which GPU, what this process and the others held, and what to do.

torch's message says it all but buries it in allocator advice; a search that runs out of GPU memory either shares
its GPU with another process (the memory plan counted only the memory free when the search started) or met a
memory plan that is short (a bug to report). Read from the message alone, so no torch import is needed."""

from __future__ import annotations

import re

from advisor.errors import exception_chain

_TRIED = re.compile(r"Tried to allocate ([\d.]+ [KMGT]?i?B)")
_GPU = re.compile(r"GPU (\d+) has a total capacity of ([\d.]+ [KMGT]?i?B)")
_OTHER = re.compile(r"Process \d+ has ([\d.]+) ([KMGT]?i?B) memory in use")
_OWN = re.compile(r"this process has ([\d.]+ [KMGT]?i?B) memory in use")
_CAP = re.compile(r"([\d.]+ [KMGT]?i?B) allowed")
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def _is_cuda_oom(exc: BaseException) -> bool:
    return type(exc).__name__ == "OutOfMemoryError" and type(exc).__module__.startswith("torch")


def gpu_out_of_memory_message(exc: BaseException) -> str | None:
    """The `Error:` line for ``exc`` (or an exception it was raised from) when it is torch's CUDA out-of-memory
    error; None otherwise."""
    return next((_line(str(e)) for e in exception_chain(exc) if _is_cuda_oom(e)), None)


def _line(text: str) -> str:
    gpu, tried, own, cap = _GPU.search(text), _TRIED.search(text), _OWN.search(text), _CAP.search(text)
    where = f"GPU {gpu.group(1)} ({gpu.group(2)})" if gpu else "the GPU"
    head = f"{where} ran out of memory" + (f" allocating {tried.group(1)}" if tried else "")
    if own:
        head += f"; this process held {own.group(1)}" + (f" of the {cap.group(1)} it may use" if cap else "")
    others = sum(float(n) * _UNITS.get(unit, 1) for n, unit in _OTHER.findall(text))
    if others:
        return (f"{head}; other processes held {others / 2**30:.1f} GiB of it: free that GPU or run on another "
                "(CUDA_VISIBLE_DEVICES), or give a search --gpu-memory what is free so that layers beyond it stream "
                "from CPU memory")
    return (f"{head}, which the memory plan did not foresee (`advisor search --dry-run` prints it): a search "
            "given a lower --gpu-memory streams more layers from CPU memory; please report it with the output of "
            "--debug")
