"""How decode attention is tiled and split: host-side choices (no Triton kernels here), chosen by the measurements
in reports/benchmarks/decode_step_variants.md."""

from __future__ import annotations

import triton

#: key block of an FP8 cache (heads up to 128 wide): the same bytes per pipelined block as 64 BF16 keys
FP8_KV_BLOCK_N = 128
#: FP8 cache: dots in FP16 (codes widen to FP16 natively; to BF16 through FP32), and a minimum
#: split count for contexts of 16+ blocks. On an H100 (reports/benchmarks/kv_cache.md) FP16 dots
#: took batch 64 x context 8192 from 493 to 374 us (BF16 cache: 779 us); 2 or 4 splits did not pay
#: over the four measured points, so 1 (the BF16 policy) stays.
FP8_KV_DOT_F16 = True
FP8_KV_MIN_SPLITS = 1


def decode_splits(programs: int, n_old: int, sms: int, block_n: int = 64) -> int:
    """How many programs share one sequence's context.

    One split (no second kernel) once the (sequence, kv head) programs alone cover
    a quarter of the SMs; otherwise enough splits for about two programs per SM,
    each with at least one block of keys (the crossover measured in
    reports/benchmarks/decode_step_variants.md).
    """
    if programs * 4 >= sms:
        return 1
    return max(1, min(triton.cdiv(2 * sms, programs), triton.cdiv(n_old, block_n)))


def head_tiles(head_dim: int) -> tuple[int, int]:
    """Power-of-two tiles (half, whole) holding a head: ``tl.dot`` needs >= 16 along each side."""
    return max(16, triton.next_power_of_2(head_dim // 2)), max(16, triton.next_power_of_2(head_dim))
