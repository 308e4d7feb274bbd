"""What every runtime kernel shares: the FP8 bound, programmatic dependent launch, exact dots when interpreted."""

from __future__ import annotations

import triton
import triton.language as tl

FP8_MAX = tl.constexpr(448.0)


@triton.jit
def _wait_for_producer(USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def _let_consumer_start(USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _dot(a, b, EXACT_F32: tl.constexpr):
    if EXACT_F32:  # Triton 3.6's CPU interpreter multiplies BF16 dot operands as raw integers
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


def _launch(kernel, grid, *args, pdl: bool, **meta) -> None:
    if pdl:
        meta["launch_pdl"] = True
    kernel[grid](*args, USE_PDL=pdl, **meta)
