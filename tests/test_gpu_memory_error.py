"""A CUDA out-of-memory error ends a command with one line that says which GPU, who held its memory and what to do
(exit 3), not as an unexpected bug. The messages are torch's own, as two 14B searches on an H100 printed them."""

from __future__ import annotations

import pytest
import torch
import typer

from advisor.cli.common import handle_errors
from advisor.gpu_memory_error import gpu_out_of_memory_message

SHARED = ("CUDA out of memory. Tried to allocate 270.00 MiB. GPU 0 has a total capacity of 79.18 GiB of which "
          "202.62 MiB is free. Process 945 has 28.25 GiB memory in use. Including non-PyTorch memory, this process "
          "has 50.72 GiB memory in use. Of the allocated memory 49.71 GiB is allocated by PyTorch, and 331.02 MiB is "
          "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
          "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
CAPPED = ("CUDA out of memory. Tried to allocate 270.00 MiB. GPU 0 has a total capacity of 79.18 GiB of which 54.71 "
          "GiB is free. Including non-PyTorch memory, this process has 24.46 GiB memory in use. 24.00 GiB allowed; "
          "Of the allocated memory 23.68 GiB is allocated by PyTorch, and 99.80 MiB is reserved by PyTorch but "
          "unallocated.")


def test_a_gpu_shared_with_another_process_is_named_with_what_it_held():
    line = gpu_out_of_memory_message(torch.OutOfMemoryError(SHARED))
    assert line.startswith("GPU 0 (79.18 GiB) ran out of memory allocating 270.00 MiB; this process held 50.72 GiB")
    assert "other processes held 28.2 GiB" in line and "CUDA_VISIBLE_DEVICES" in line


def test_a_capped_search_that_runs_out_is_a_plan_to_report():
    line = gpu_out_of_memory_message(torch.OutOfMemoryError(CAPPED))
    assert "this process held 24.46 GiB of the 24.00 GiB it may use" in line
    assert "memory plan did not foresee" in line and "report" in line and "other processes" not in line


def test_only_cuda_out_of_memory_is_read_so_and_a_wrapped_one_is_found():
    assert gpu_out_of_memory_message(RuntimeError(SHARED)) is None
    assert gpu_out_of_memory_message(MemoryError()) is None
    try:
        try:
            raise torch.OutOfMemoryError(CAPPED)
        except torch.OutOfMemoryError as inner:
            raise RuntimeError("calibration failed") from inner
    except RuntimeError as outer:
        assert "24.46 GiB" in gpu_out_of_memory_message(outer)


def test_the_cli_ends_with_one_error_line_and_exit_3(capsys):
    @handle_errors
    def command() -> None:
        raise torch.OutOfMemoryError(SHARED)

    with pytest.raises(typer.Exit) as ended:
        command()
    assert ended.value.exit_code == 3
    err = capsys.readouterr().err
    assert err.count("Error:") == 1 and "unexpected" not in err and "GPU 0 (79.18 GiB) ran out of memory" in err
