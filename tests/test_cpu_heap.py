"""models.cpu_heap: a CPU run reuses the memory of the large tensors it frees instead of faulting it in again."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

PROBE = """
import ctypes, json, resource, sys, torch

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "keep":
    from advisor.models.cpu_heap import keep_freed_memory
    assert keep_freed_memory()
torch.empty(1)
x = torch.ones(25 * 2**20)  # 100 MB, a batch's logits
mapped_alone = libc.mallinfo2().hblkhd  # bytes in blocks mmap'ed one by one
del x
kept_free = libc.mallinfo2().fordblks  # free bytes the heap keeps
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(8):
    x = torch.ones(25 * 2**20)
    del x
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"mapped_alone": mapped_alone, "kept_free": kept_free, "faults": faults}))
"""


def probe(mode: str) -> dict[str, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_freed_large_tensors_are_reused_not_faulted_in_again():
    size = 100 * 2**20
    default, keep = probe("default"), probe("keep")
    assert default["mapped_alone"] >= size and default["kept_free"] < size  # mmap'ed, then handed back
    assert keep["mapped_alone"] < size and keep["kept_free"] >= size  # from the heap, and kept there
    assert keep["faults"] < default["faults"]  # fewer fresh pages (how many fewer varies with the kernel)
