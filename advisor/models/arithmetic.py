"""The arithmetic accuracy is scored in: BF16, except on a CPU without BF16 matrix instructions.

On such a CPU (AVX2 only: most laptops and many cloud machines) PyTorch's BF16 matrix products
run on a slow path, several times slower than float32. There the model's BF16 weights are copied to
float32 (exactly) and every plan, the BF16 reference included, is computed in float32, without BF16's
rounding of activations: on the same tokens its KL stays close to BF16 arithmetic's, at a fraction of
the time (`reports/benchmarks/cpu_arithmetic.md`). The weights'
fingerprint is taken before the copy, so the model is the same model to the study, the caches
and `recheck`; the arithmetic is part of where a study scores (:func:`scoring_place`), which a
resume or a worker must match.
"""

from __future__ import annotations

import os
from typing import Any

BF16 = "bfloat16"
FLOAT32 = "float32"
#: float32 weights may take at most this share of the machine's memory (else BF16 stays, slow but fits); physical
#: memory, not free memory, so that the same machine always picks the same arithmetic (a resume must match)
MEMORY_SHARE = 0.4


def cpu_has_bf16_matmul() -> bool:
    """Whether this CPU multiplies BF16 matrices natively (AVX512-BF16, AMX or AVX-512 emulation; Arm BF16),
    as PyTorch's oneDNN backend reports it. Unknown (another PyTorch build): assumed so, which keeps BF16."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return True


def physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def choose_arithmetic(device: str, n_params: int, has_bf16: bool, memory_bytes: int | None) -> tuple[str, str]:
    """(dtype name, why) for scoring a model of ``n_params`` weights on ``device``."""
    if device != "cpu":
        return BF16, "the GPU computes in BF16"
    if has_bf16:
        return BF16, "this CPU has BF16 matrix instructions"
    need = 4 * n_params
    if memory_bytes is not None and need > MEMORY_SHARE * memory_bytes:
        return BF16, (f"this CPU lacks BF16 matrix instructions (slow), but float32 weights ({need / 2**30:.1f} GiB) "
                      f"would take over {MEMORY_SHARE:.0%} of its {memory_bytes / 2**30:.0f} GiB")
    return FLOAT32, "this CPU lacks BF16 matrix instructions; BF16 weights computed in float32"


def scoring_place(device: str, arithmetic: str) -> str:
    """Where and how a study scores accuracy, as stored with it and printed: ``cpu``, ``cuda`` or
    ``cpu (float32 arithmetic)``."""
    return device if arithmetic == BF16 else f"{device} ({arithmetic} arithmetic)"


def to_scoring_arithmetic(model: Any, device: str) -> tuple[str, str]:
    """Copy ``model`` to the arithmetic :func:`choose_arithmetic` picks for this machine (in place); (dtype, why)."""
    import torch

    n_params = sum(p.numel() for p in model.parameters())
    name, why = choose_arithmetic(device, n_params, device == "cpu" and cpu_has_bf16_matmul(),
                                  physical_memory_bytes())
    if name == FLOAT32:
        model.to(torch.float32)
    return name, why
