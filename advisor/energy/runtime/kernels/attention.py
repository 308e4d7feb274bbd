"""Decode attention in one kernel: RoPE, KV-cache write, flash-decoding over the real context, BF16/FP8 output.

The KV cache is BF16, or FP8 E4M3 with one scale per tensor (per layer, one for K and one
for V: what ModelOpt exports as ``k_scale``/``v_scale`` and TensorRT-LLM and vLLM serve):
the kernel reads the FP8 bytes, widens them to BF16 in registers (exact) for the dots, and
applies the scales to the scores and to the output, so the step reads half the KV bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from advisor.energy.runtime.kernels import attention_policy as policy
from advisor.energy.runtime.kernels.attention_policy import decode_splits, head_tiles
from advisor.energy.runtime.kernels.common import (
    FP8_MAX,
    exact_dot,
    head_rmsnorm,
    launch_kernel,
    let_consumer_start,
    mask_below,
    soft_cap,
    wait_for_producer,
)


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
    QN_W,
    KN_W,
    M_out,
    L_out,
    ACC,
    OUT,
    inv_scale_ptr,
    KS,
    VS,
    kv_lo,
    n_old,
    LMAX,
    q_scale,
    norm_eps,
    H: tl.constexpr,
    KV: tl.constexpr,
    G: tl.constexpr,
    GP: tl.constexpr,
    D: tl.constexpr,
    HP: tl.constexpr,
    DP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCKS_PER_SPLIT: tl.constexpr,
    S: tl.constexpr,
    QK_NORM: tl.constexpr,
    NORM_ROUND: tl.constexpr,
    SOFTCAP: tl.constexpr,
    RING: tl.constexpr,
    OUT_FP8: tl.constexpr,
    KV_FP8: tl.constexpr,
    DOT_F16: tl.constexpr,
    INTERPRETED: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Flash-decoding of one new token: one (sequence, kv head, split) per program.

    Split ``sp`` attends to cached positions [kv_lo + sp*chunk, kv_lo + (sp+1)*chunk)
    below ``n_old`` (chunk = BLOCKS_PER_SPLIT * BLOCK_N; kv_lo > 0 for a sliding window);
    the last split also attends to the new token itself, taken (rotated) from the
    qkv row, and writes its k and v into the cache at position ``n_old`` for later
    steps. No program reads that position, so the write races with nothing.
    Head dims that are not a power of two (80, 96) or below 32 run in tiles padded to
    HP (half) and DP (whole), masked; the padding is zero and adds nothing to the dots.
    RING: the cache of a sliding-window layer holds only LMAX positions, position n
    in slot n % LMAX (the window's positions are consecutive, so they never collide).
    KV_FP8: the caches hold E4M3 codes of k / KS and v / VS; scores are the BF16 dots of
    q with the codes times KS, the accumulator sums probabilities times v codes and is
    multiplied by VS once at the end; the new token is quantized the same way and
    attended to as the cache will hold it.
    """
    bk = tl.program_id(0).to(tl.int64)  # b * KV + kv head
    sp = tl.program_id(1)
    b = bk // KV
    kvh = bk % KV
    rows = tl.arange(0, GP)
    rmask = rows < G
    half = tl.arange(0, HP)
    hmask = mask_below(half, D // 2, HP != D // 2)
    dd = tl.arange(0, DP)
    dmask = mask_below(dd, D, DP != D)
    p = tl.load(POS)
    c = tl.load(COS + p * (D // 2) + half, mask=hmask, other=0.0)[None, :]
    s = tl.load(SIN + p * (D // 2) + half, mask=hmask, other=0.0)[None, :]
    wait_for_producer(USE_PDL)
    row = QKV + b * (H + 2 * KV) * D
    heads = kvh * G + rows  # the q heads of this kv head
    qmask = rmask[:, None] & hmask[None, :]
    q1 = tl.load(row + heads[:, None] * D + half[None, :], mask=qmask, other=0.0).to(tl.float32)
    q2 = tl.load(row + heads[:, None] * D + D // 2 + half[None, :], mask=qmask, other=0.0).to(tl.float32)
    if QK_NORM:
        q1, q2 = head_rmsnorm(q1, q2, QN_W, half, hmask, D, norm_eps, NORM_ROUND)
    qa = ((q1 * c - q2 * s) * q_scale).to(tl.bfloat16)
    qb = ((q2 * c + q1 * s) * q_scale).to(tl.bfloat16)

    if KV_FP8:
        k_sc = tl.load(KS)
        v_sc = tl.load(VS)
    else:
        k_sc = 1.0
        v_sc = 1.0
    # DOT_F16: FP8 codes widen to FP16 in one instruction per pair (to BF16 they go through FP32);
    # q (|q| << 65504) and the probabilities are exact enough in FP16, every code is exact
    if DOT_F16:
        q_dot_a = qa.to(tl.float16)
        q_dot_b = qb.to(tl.float16)
    else:
        q_dot_a = qa
        q_dot_b = qb
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, DP], tl.float32)
    base = bk * LMAX * D
    lo = kv_lo + sp * (BLOCKS_PER_SPLIT * BLOCK_N)
    for it in range(0, BLOCKS_PER_SPLIT):
        n = lo + it * BLOCK_N + tl.arange(0, BLOCK_N)
        nm = n < n_old
        slot = n % LMAX if RING else n
        kmask = nm[:, None] & hmask[None, :]
        k1 = tl.load(KC + base + slot[:, None] * D + half[None, :], mask=kmask, other=0.0)
        k2 = tl.load(KC + base + slot[:, None] * D + D // 2 + half[None, :], mask=kmask, other=0.0)
        if KV_FP8:
            k1 = k1.to(q_dot_a.dtype)
            k2 = k2.to(q_dot_a.dtype)
        sc = exact_dot(q_dot_a, tl.trans(k1), INTERPRETED) + exact_dot(q_dot_b, tl.trans(k2), INTERPRETED)
        if KV_FP8:
            sc = sc * k_sc
        if SOFTCAP > 0:
            sc = soft_cap(sc, SOFTCAP)
        sc = tl.where(nm[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a block with no key yet
        alpha = tl.exp(m_i - m_use)
        pr = tl.exp(sc - m_use[:, None])
        l_i = l_i * alpha + tl.sum(pr, 1)
        v = tl.load(VC + base + slot[:, None] * D + dd[None, :], mask=nm[:, None] & dmask[None, :], other=0.0)
        if KV_FP8:
            v = v.to(q_dot_a.dtype)
        acc = acc * alpha[:, None] + exact_dot(pr.to(q_dot_a.dtype), v, INTERPRETED)
        m_i = m_new

    # the new token: rotated k (rounded to BF16 as the cache stores it) and v
    last = sp == S - 1
    kn1 = tl.load(row + (H + kvh) * D + half[None, :], mask=hmask[None, :], other=0.0).to(tl.float32)
    kn2 = tl.load(row + (H + kvh) * D + D // 2 + half[None, :], mask=hmask[None, :], other=0.0).to(tl.float32)
    vn = tl.load(row + (H + KV + kvh) * D + dd, mask=dmask, other=0.0)
    let_consumer_start(USE_PDL)
    if QK_NORM:
        kn1, kn2 = head_rmsnorm(kn1, kn2, KN_W, half, hmask, D, norm_eps, NORM_ROUND)
    ka = (kn1 * c - kn2 * s).to(tl.bfloat16)  # [1, HP]
    kb = (kn2 * c + kn1 * s).to(tl.bfloat16)
    if KV_FP8:  # the codes the cache will hold, and the new token as read back from them
        ka = tl.minimum(tl.maximum(ka.to(tl.float32) / k_sc, -FP8_MAX), FP8_MAX).to(tl.float8e4nv)
        kb = tl.minimum(tl.maximum(kb.to(tl.float32) / k_sc, -FP8_MAX), FP8_MAX).to(tl.float8e4nv)
        vn = tl.minimum(tl.maximum(vn.to(tl.float32) / v_sc, -FP8_MAX), FP8_MAX).to(tl.float8e4nv)
    s_new = tl.sum(qa.to(tl.float32) * ka.to(tl.float32), 1) + tl.sum(qb.to(tl.float32) * kb.to(tl.float32), 1)
    if KV_FP8:
        s_new = s_new * k_sc
    if SOFTCAP > 0:
        s_new = soft_cap(s_new, SOFTCAP)
    s_new = tl.where(last, s_new, float("-inf"))
    m_new = tl.maximum(m_i, s_new)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_use)
    p_new = tl.exp(s_new - m_use)
    l_i = l_i * alpha + p_new
    acc = acc * alpha[:, None] + p_new[:, None] * vn.to(tl.float32)[None, :]
    m_i = m_new
    if KV_FP8:
        acc = acc * v_sc
    wmask = last & hmask
    p_slot = p % LMAX if RING else p
    tl.store(KC + base + p_slot * D + half[None, :], ka, mask=wmask[None, :])
    tl.store(KC + base + p_slot * D + D // 2 + half[None, :], kb, mask=wmask[None, :])
    tl.store(VC + base + p_slot * D + dd, vn, mask=last & dmask)

    omask = rmask[:, None] & dmask[None, :]
    if S == 1:
        _store_attention_output(OUT, acc / l_i[:, None], b * H + heads, dd, omask, inv_scale_ptr, D, OUT_FP8)
    else:
        o = (bk * S + sp) * G + rows  # partials [B*KV, S, G, (D)]: only the G real rows
        tl.store(M_out + o, m_i, mask=rmask)
        tl.store(L_out + o, l_i, mask=rmask)
        tl.store(ACC + o[:, None] * D + dd[None, :], acc, mask=omask)


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
    DP: tl.constexpr,
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
    dd = tl.arange(0, DP)
    dmask = mask_below(dd, D, DP != D)
    ok = sp < S
    wait_for_producer(USE_PDL)
    idx = (bk * S + sp) * G + g
    m = tl.load(M_in + idx, mask=ok, other=float("-inf"))
    lsum = tl.load(L_in + idx, mask=ok, other=0.0)
    mx = tl.max(m, 0)
    w = tl.where(ok & (lsum > 0), tl.exp(m - mx), 0.0)
    acc = tl.load(ACC + idx[:, None] * D + dd[None, :], mask=ok[:, None] & dmask[None, :], other=0.0)
    out = tl.sum(acc * w[:, None], 0) / tl.sum(lsum * w, 0)
    heads = (bk // KV) * H + (bk % KV) * G + g + tl.zeros([1], tl.int64)
    _store_attention_output(OUT, out[None, :], heads, dd, dmask[None, :], inv_scale_ptr, D, OUT_FP8)


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
    *,
    kv_lo: int = 0,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    norm_round: bool = True,
    softcap: float | None = None,
    q_scale: float | None = None,
    ring: bool = False,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    block_n: int | None = None,
    dot_f16: bool | None = None,
    min_splits: int | None = None,
) -> torch.Tensor:
    """Attention of one new token per sequence over positions [kv_lo, ctx) (GQA).

    qkv: [B, (H + 2*KV) * D], the fused projection of the new tokens, unrotated;
    ``pos`` holds their position ``ctx - 1`` (on the device, so a CUDA graph reads it
    at replay); caches [B, KV, LMAX, D] hold positions below it and receive the new k
    and v. ``kv_lo`` > 0 is a sliding window's first key: nothing before it is read.
    ``q_norm``/``k_norm``: per-head RMSNorm weights of q and k, applied before RoPE
    (Qwen3, Gemma 3). ``softcap``: Gemma 2's score capping. ``q_scale`` defaults to
    head_dim ** -0.5. ``ring``: the caches hold position n in slot n % LMAX (a
    sliding-window layer's cache of window length). Returns [B, H * D] in BF16, or FP8
    scaled by ``inv_scale``. FP8 (E4M3) caches hold k / ``k_scale`` and v / ``v_scale``
    (float32 one-element tensors on the device); the new k and v are written the same way.
    ``block_n``: keys per pipelined block (default 64 BF16, FP8_KV_BLOCK_N FP8; 32 for 256-wide heads);
    ``dot_f16`` / ``min_splits``: FP8-cache variants (defaults FP8_KV_DOT_F16, FP8_KV_MIN_SPLITS).
    Only the attended context is read, never the whole allocated cache.
    """
    kv_fp8 = k_cache.dtype == torch.float8_e4m3fn
    if kv_fp8 != (v_cache.dtype == torch.float8_e4m3fn) or (kv_fp8 and (k_scale is None or v_scale is None)):
        raise ValueError("an FP8 KV cache needs FP8 k and v caches and both scales")
    b = qkv.shape[0]
    lmax = k_cache.shape[2]
    g = heads // kv_heads
    gp = max(16, triton.next_power_of_2(g))  # tl.dot needs 16 rows
    hp, dp = head_tiles(head_dim)
    # 256-wide heads (Gemma): smaller key blocks and one stage fewer keep the pipelined
    # k and v tiles within shared memory; up to 128 the tuned Llama configuration
    default_n, stages = (64, 3) if dp <= 128 else (32, 2)
    if kv_fp8 and dp <= 128:
        default_n = policy.FP8_KV_BLOCK_N
    block_n = block_n or default_n
    n_old = ctx - 1
    kv_lo = min(max(kv_lo, 0), n_old)
    n_read = n_old - kv_lo
    if splits is None:
        # Triton's CPU interpreter (tests) has no SMs to fill
        sms = torch.cuda.get_device_properties(qkv.device).multi_processor_count if qkv.is_cuda else 1
        splits = decode_splits(b * kv_heads, n_read, sms, block_n)
        if kv_fp8 and n_read >= 16 * block_n:
            splits = max(splits, policy.FP8_KV_MIN_SPLITS if min_splits is None else min_splits)
    chunk = max(block_n, triton.cdiv(triton.cdiv(max(n_read, 1), splits), block_n) * block_n)
    splits = max(1, triton.cdiv(n_read, chunk))
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
    launch_kernel(
        _decode_attn_kernel,
        (b * kv_heads, splits),
        qkv,
        cos,
        sin,
        pos,
        k_cache,
        v_cache,
        q_norm if q_norm is not None else cos,
        k_norm if k_norm is not None else cos,
        m,
        lsum,
        acc,
        out,
        scale_ptr,
        k_scale if kv_fp8 else cos,
        v_scale if kv_fp8 else cos,
        kv_lo,
        n_old,
        lmax,
        q_scale if q_scale is not None else head_dim**-0.5,
        norm_eps,
        pdl=pdl,
        H=heads,
        KV=kv_heads,
        G=g,
        GP=gp,
        D=head_dim,
        HP=hp,
        DP=dp,
        BLOCK_N=block_n,
        BLOCKS_PER_SPLIT=chunk // block_n,
        S=splits,
        QK_NORM=q_norm is not None,
        NORM_ROUND=norm_round,
        SOFTCAP=float(softcap or 0.0),
        RING=ring,
        OUT_FP8=inv_scale is not None,
        KV_FP8=kv_fp8,
        DOT_F16=kv_fp8 and (policy.FP8_KV_DOT_F16 if dot_f16 is None else dot_f16),
        INTERPRETED=not qkv.is_cuda,
        num_warps=4,
        num_stages=stages,
    )
    if splits > 1:
        launch_kernel(
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
            DP=dp,
            S=splits,
            SP=triton.next_power_of_2(splits),
            H=heads,
            OUT_FP8=inv_scale is not None,
            num_warps=4,
        )
    return out
