"""The one GEMM timer of every profile: a CUDA graph of one GEMM over several weights, replayed and timed.

Every kind of profile times its GEMMs here: the GPU profile's tables (distinct copies of one ``N x K``
weight, :func:`weight_copies`), the per-model profile's and the layer profile's (one layer's group over all
layers' weights). The FP8 input is a standard normal clamped to the FP8 range, then cast; a GEMM's time does
not depend on its input's values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from advisor.formats import Format

#: bytes of weight copies a GEMM table's graph cycles through, so that the L2 cache does not hold them
L2_DEFEAT_BYTES = 256 << 20
FP8_MAX = 448.0


def gemm_input(m: int, k: int, fmt: Format) -> Any:
    """``m`` rows of a GEMM's input of width ``k``: BF16, or FP8 codes for an FP8 GEMM."""
    import torch

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    if fmt == Format.FP8:
        x = x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return x


def over_weights(lins: Sequence[Any], m: int, fmt: Format) -> Callable[[], None]:
    """One GEMM of ``m`` rows through each of ``lins`` (runtime linears of one input width): what a graph
    captures."""
    x = gemm_input(m, lins[0].in_features, fmt)

    def run() -> None:
        for lin in lins:
            lin(x)

    return run


def gemm_graph_ms(lins: Sequence[Any], m: int, fmt: Format, iters: int = 20) -> float:
    """Time of one GEMM of ``m`` rows: a graph over every weight in ``lins``, per weight."""
    from advisor.energy.runtime import graph_ms

    return graph_ms(over_weights(lins, m, fmt), iters=iters) / len(lins)


def weight_copies(n: int, k: int, fmt: Format, max_copies: int | None) -> list:
    """Distinct copies of an ``n x k`` weight in ``fmt``, ``L2_DEFEAT_BYTES`` in all (at most ``max_copies``;
    None: no cap), so that a graph over them reads each from HBM rather than the L2 cache."""
    import torch

    from advisor.energy.runtime import GroupLinear

    copies = max(1, math.ceil(L2_DEFEAT_BYTES / (n * k * (2 if fmt == Format.BF16 else 1))))
    copies = min(copies, max_copies) if max_copies else copies
    lins = []
    for _ in range(copies):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        lins.append(GroupLinear(w, fmt, act_amax=4.0))
        if fmt != Format.BF16:
            del w
    return lins
