"""models.cpu_heap: a CPU run reuses the memory of the large tensors it frees instead of faulting it in again."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

PROBE = """
import resource, sys, torch
if sys.argv[1] == "keep":
    from advisor.models.cpu_heap import keep_freed_memory
    assert keep_freed_memory()
torch.empty(1)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(8):
    x = torch.ones(25 * 2**20)  # 100 MB, a batch's logits
    del x
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_freed_large_tensors_are_reused_not_faulted_in_again():
    pages = 100 * 2**20 // 4096
    assert page_faults("default") > 6 * pages  # each allocation maps fresh pages
    assert page_faults("keep") < 2 * pages  # the first one does; the others reuse it
