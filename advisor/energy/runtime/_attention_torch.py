"""Attention in PyTorch: prefill (SDPA, banded for sliding windows), and eager decode variants.

The decode step's attention is the fused Triton kernel (``kernels.decode_attention``);
these run prefill, and the decode variants it is compared against in benchmarks.
q arrives rotated and pre-scaled (``kernels.rope_qkv``), so every call uses scale 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from advisor.energy.runtime._dims import AttentionSpec


def attention_over_cache(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: int, spec: AttentionSpec, eager: bool = False
) -> torch.Tensor:
    """q [B, H, L, D] at positions start..start+L-1 over cached keys up to start+L-1.

    Full attention from position 0 without soft-capping is SDPA's causal path; one
    decode query (the benchmarks' eager variants) needs no mask. A sliding window reads
    only keys from the first query's window start, with a banded causal mask;
    soft-capping (Gemma 2) runs eagerly in float32, as transformers does. ``eager``:
    matmul and softmax instead of SDPA. Returns [B, H, L, D].
    """
    length = q.shape[2]
    ctx = start + length
    k0 = spec.first_key(start + 1)  # the first key any of these queries sees
    k, v = k_cache[:, :, k0:ctx], v_cache[:, :, k0:ctx]
    if spec.softcap is None and not eager and k0 == 0 and start == 0 and spec.sliding_window is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=length > 1, scale=1.0, enable_gqa=True)
    if length == 1 and spec.softcap is None:  # one query sees every key read: no mask
        b, h, _, d = q.shape
        qg = q.view(b, k.shape[1], h // k.shape[1], d)  # a kv head's q heads as its "queries"
        if eager:
            att = torch.matmul(torch.softmax(torch.matmul(qg, k.transpose(-1, -2)), dim=-1), v)
        else:
            att = F.scaled_dot_product_attention(qg, k, v, scale=1.0)
        return att.view(b, h, 1, d)
    q_pos = torch.arange(start, ctx, device=q.device)[:, None]
    k_pos = torch.arange(k0, ctx, device=q.device)[None, :]
    allowed = k_pos <= q_pos
    if spec.sliding_window is not None:
        allowed &= k_pos > q_pos - spec.sliding_window
    group = q.shape[1] // k.shape[1]
    # heads expanded: with a mask, SDPA's memory-efficient kernel runs only without GQA
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    if spec.softcap is None and not eager:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=1.0)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2))
    if spec.softcap is not None:
        scores = torch.tanh(scores / spec.softcap) * spec.softcap
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v.float()).to(q.dtype)
