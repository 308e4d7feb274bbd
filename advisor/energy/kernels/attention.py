"""Decode attention in one kernel: RoPE, KV-cache write, flash-decoding over the real context, BF16/FP8 output."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from advisor.energy.kernels.common import FP8_MAX, _dot, _launch, _let_consumer_start, _wait_for_producer


@triton.jit
def _store_attention_output(OUT, o, heads, dd, mask, inv_scale_ptr, D: tl.constexpr, OUT_FP8: tl.constexpr):
    """Rows ``heads`` of OUT [B*H, D]: BF16, or FP8 quantized from the BF16-rounded value."""
    ptrs = OUT + heads[:, None] * D + dd[None, :]
    o = o.to(tl.bfloat16)
    if OUT_FP8:
        s = tl.load(inv_scale_ptr)
        y = tl.minimum(tl.maximum(o.to(tl.float32) * s, -FP8_MAX), FP8_MAX)
        tl.store(ptrs, y.to(tl.float8e4nv), mask=mask)
    else:
        tl.store(ptrs, o, mask=mask)


@triton.jit
def _decode_attn_kernel(
    QKV,
    COS,
    SIN,
    POS,
    KC,
    VC,
    M_out,
    L_out,
    ACC,
    OUT,
    inv_scale_ptr,
    n_old,
    LMAX,
    q_scale,
    H: tl.constexpr,
    KV: tl.constexpr,
    G: tl.constexpr,
    GP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCKS_PER_SPLIT: tl.constexpr,
    S: tl.constexpr,
    OUT_FP8: tl.constexpr,
    INTERPRETED: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Flash-decoding of one new token: one (sequence, kv head, split) per program.

    Split ``sp`` attends to cached positions [sp*chunk, (sp+1)*chunk) below ``n_old``
    (chunk = BLOCKS_PER_SPLIT * BLOCK_N);
    the last split also attends to the new token itself, taken (rotated) from the
    qkv row, and writes its k and v into the cache at position ``n_old`` for later
    steps. No program reads that position, so the write races with nothing.
    """
    bk = tl.program_id(0).to(tl.int64)  # b * KV + kv head
    sp = tl.program_id(1)
    b = bk // KV
    kvh = bk % KV
    rows = tl.arange(0, GP)
    rmask = rows < G
    half = tl.arange(0, D // 2)
    dd = tl.arange(0, D)
    p = tl.load(POS)
    c = tl.load(COS + p * (D // 2) + half)[None, :]
    s = tl.load(SIN + p * (D // 2) + half)[None, :]
    _wait_for_producer(USE_PDL)
    row = QKV + b * (H + 2 * KV) * D
    heads = kvh * G + rows  # the q heads of this kv head
    q1 = tl.load(row + heads[:, None] * D + half[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
    q2 = tl.load(row + heads[:, None] * D + D // 2 + half[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
    qa = ((q1 * c - q2 * s) * q_scale).to(tl.bfloat16)
    qb = ((q2 * c + q1 * s) * q_scale).to(tl.bfloat16)

    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    base = bk * LMAX * D
    lo = sp * (BLOCKS_PER_SPLIT * BLOCK_N)
    for it in range(0, BLOCKS_PER_SPLIT):
        n = lo + it * BLOCK_N + tl.arange(0, BLOCK_N)
        nm = n < n_old
        k1 = tl.load(KC + base + n[:, None] * D + half[None, :], mask=nm[:, None], other=0.0)
        k2 = tl.load(KC + base + n[:, None] * D + D // 2 + half[None, :], mask=nm[:, None], other=0.0)
        sc = _dot(qa, tl.trans(k1), INTERPRETED) + _dot(qb, tl.trans(k2), INTERPRETED)
        sc = tl.where(nm[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a block with no key yet
        alpha = tl.exp(m_i - m_use)
        pr = tl.exp(sc - m_use[:, None])
        l_i = l_i * alpha + tl.sum(pr, 1)
        v = tl.load(VC + base + n[:, None] * D + dd[None, :], mask=nm[:, None], other=0.0)
        acc = acc * alpha[:, None] + _dot(pr.to(tl.bfloat16), v, INTERPRETED)
        m_i = m_new

    # the new token: rotated k (rounded to BF16 as the cache stores it) and v
    last = sp == S - 1
    kn1 = tl.load(row + (H + kvh) * D + half).to(tl.float32)
    kn2 = tl.load(row + (H + kvh) * D + D // 2 + half).to(tl.float32)
    vn = tl.load(row + (H + KV + kvh) * D + dd)
    _let_consumer_start(USE_PDL)
    ka = (kn1 * c - kn2 * s).to(tl.bfloat16)
    kb = (kn2 * c + kn1 * s).to(tl.bfloat16)
    s_new = tl.sum(qa.to(tl.float32) * ka.to(tl.float32), 1) + tl.sum(qb.to(tl.float32) * kb.to(tl.float32), 1)
    s_new = tl.where(last, s_new, float("-inf"))
    m_new = tl.maximum(m_i, s_new)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_use)
    p_new = tl.exp(s_new - m_use)
    l_i = l_i * alpha + p_new
    acc = acc * alpha[:, None] + p_new[:, None] * vn.to(tl.float32)[None, :]
    m_i = m_new
    wmask = last & (half < D // 2)
    tl.store(KC + base + p * D + half[None, :], ka, mask=wmask[None, :])
    tl.store(KC + base + p * D + D // 2 + half[None, :], kb, mask=wmask[None, :])
    tl.store(VC + base + p * D + dd, vn, mask=last & (dd < D))

    if S == 1:
        _store_attention_output(
            OUT, acc / l_i[:, None], b * H + heads, dd, rmask[:, None], inv_scale_ptr, D, OUT_FP8
        )
    else:
        o = (bk * S + sp) * G + rows  # partials [B*KV, S, G, (D)]: only the G real rows
        tl.store(M_out + o, m_i, mask=rmask)
        tl.store(L_out + o, l_i, mask=rmask)
        tl.store(ACC + o[:, None] * D + dd[None, :], acc, mask=rmask[:, None])


@triton.jit
def _decode_attn_reduce_kernel(
    M_in,
    L_in,
    ACC,
    OUT,
    inv_scale_ptr,
    KV: tl.constexpr,
    G: tl.constexpr,
    D: tl.constexpr,
    S: tl.constexpr,
    SP: tl.constexpr,
    H: tl.constexpr,
    OUT_FP8: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Flash-decoding, stage 2: combine the splits of one (sequence, q head)."""
    bk = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    sp = tl.arange(0, SP)
    dd = tl.arange(0, D)
    ok = sp < S
    _wait_for_producer(USE_PDL)
    idx = (bk * S + sp) * G + g
    m = tl.load(M_in + idx, mask=ok, other=float("-inf"))
    lsum = tl.load(L_in + idx, mask=ok, other=0.0)
    mx = tl.max(m, 0)
    w = tl.where(ok & (lsum > 0), tl.exp(m - mx), 0.0)
    acc = tl.load(ACC + idx[:, None] * D + dd[None, :], mask=ok[:, None], other=0.0)
    out = tl.sum(acc * w[:, None], 0) / tl.sum(lsum * w, 0)
    heads = (bk // KV) * H + (bk % KV) * G + g + tl.zeros([1], tl.int64)
    _store_attention_output(OUT, out[None, :], heads, dd, dd[None, :] < D, inv_scale_ptr, D, OUT_FP8)


def decode_splits(programs: int, n_old: int, sms: int, block_n: int = 64) -> int:
    """How many programs share one sequence's context.

    One split (no second kernel) once the (sequence, kv head) programs alone cover
    a quarter of the SMs; otherwise enough splits for about two programs per SM,
    each with at least one block of keys. On an H100 at context 512, one split was
    faster from batch 8 (64 programs) and eight splits at batch 1
    (reports/benchmarks/decode_step_variants.md).
    """
    if programs * 4 >= sms:
        return 1
    return max(1, min(triton.cdiv(2 * sms, programs), triton.cdiv(n_old, block_n)))


def decode_attention(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    pos: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    ctx: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    inv_scale: torch.Tensor | None = None,
    splits: int | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """Attention of one new token per sequence over its first ``ctx`` positions (GQA).

    qkv: [B, (H + 2*KV) * D], the fused projection of the new tokens, unrotated;
    ``pos`` holds their position ``ctx - 1`` (on the device, so a CUDA graph reads it
    at replay); caches [B, KV, LMAX, D] hold positions below it and receive the new k
    and v. Returns [B, H * D] in BF16, or FP8 scaled by ``inv_scale`` when given.
    Only the real context is read, never the whole allocated cache.
    """
    b = qkv.shape[0]
    lmax = k_cache.shape[2]
    g = heads // kv_heads
    gp = max(16, triton.next_power_of_2(g))  # tl.dot needs 16 rows
    block_n = 64
    n_old = ctx - 1
    if splits is None:
        # Triton's CPU interpreter (tests) has no SMs to fill
        sms = torch.cuda.get_device_properties(qkv.device).multi_processor_count if qkv.is_cuda else 1
        splits = decode_splits(b * kv_heads, n_old, sms, block_n)
    chunk = max(block_n, triton.cdiv(triton.cdiv(max(n_old, 1), splits), block_n) * block_n)
    splits = max(1, triton.cdiv(n_old, chunk))
    out = torch.empty(
        b, heads * head_dim, device=qkv.device, dtype=torch.float8_e4m3fn if inv_scale is not None else torch.bfloat16
    )
    if splits > 1:
        m = torch.empty(b * kv_heads, splits, g, device=qkv.device, dtype=torch.float32)
        lsum = torch.empty_like(m)
        acc = torch.empty(b * kv_heads, splits, g, head_dim, device=qkv.device, dtype=torch.float32)
    else:
        m = lsum = acc = out
    scale_ptr = inv_scale if inv_scale is not None else cos
    _launch(
        _decode_attn_kernel,
        (b * kv_heads, splits),
        qkv,
        cos,
        sin,
        pos,
        k_cache,
        v_cache,
        m,
        lsum,
        acc,
        out,
        scale_ptr,
        n_old,
        lmax,
        head_dim**-0.5,
        pdl=pdl,
        H=heads,
        KV=kv_heads,
        G=g,
        GP=gp,
        D=head_dim,
        BLOCK_N=block_n,
        BLOCKS_PER_SPLIT=chunk // block_n,
        S=splits,
        OUT_FP8=inv_scale is not None,
        INTERPRETED=not qkv.is_cuda,
        num_warps=4,
        num_stages=3,
    )
    if splits > 1:
        _launch(
            _decode_attn_reduce_kernel,
            (b * kv_heads, g),
            m,
            lsum,
            acc,
            out,
            scale_ptr,
            pdl=pdl,
            KV=kv_heads,
            G=g,
            D=head_dim,
            S=splits,
            SP=triton.next_power_of_2(splits),
            H=heads,
            OUT_FP8=inv_scale is not None,
            num_warps=4,
        )
    return out
