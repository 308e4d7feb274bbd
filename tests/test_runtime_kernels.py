"""The runtime's Triton kernels against plain PyTorch references.

On a CUDA GPU the kernels run compiled. Without one they run in Triton's
interpreter (numpy on the CPU; conftest.py sets TRITON_INTERPRET=1 before triton is
imported); CI runs them that way. Triton 3.6's interpreter converts FP32 to BF16 by
truncation and to FP8 wrongly where rounding crosses a power of two, so on the CPU
roundings are checked to one BF16 step and FP8 codes to most elements; on the GPU
they are checked bit for bit. Timings are not tested here (benchmarks/energy_formats.py measures them).
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")  # the dev extra installs it on Linux x86_64

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EXACT = DEVICE == "cuda"  # see the module docstring
H, KV, D = 8, 2, 32


def _same_bf16(a, b):
    if EXACT:
        assert torch.equal(a, b)
    else:
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-6)


@pytest.fixture(scope="module")
def K():
    if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU, and triton was imported before TRITON_INTERPRET=1 could be set (see conftest.py)")
    from advisor.energy import kernels

    return kernels


def _rope_tables(max_pos: int, d: int):
    inv = 1.0 / (10000 ** (torch.arange(0, d // 2, dtype=torch.float32) * 2 / d))
    ang = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv[None, :]
    return ang.cos().to(DEVICE), ang.sin().to(DEVICE)


def _rotate(x, c, s):
    """x [..., D] float32 -> rotated, halves convention (as HF Llama)."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def _case(batch: int, ctx: int, lmax: int = 160, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(batch, (H + 2 * KV) * D, generator=g).to(torch.bfloat16).to(DEVICE)
    kc = torch.randn(batch, KV, lmax, D, generator=g).to(torch.bfloat16).to(DEVICE)
    vc = torch.randn(batch, KV, lmax, D, generator=g).to(torch.bfloat16).to(DEVICE)
    cos, sin = _rope_tables(lmax, D)
    pos = torch.tensor([ctx - 1], device=DEVICE)
    return qkv, cos, sin, pos, kc, vc


def _reference(qkv, cos, sin, kc, vc, ctx):
    """Rotate q and the new k, put k and v at position ctx-1, attend over ctx positions (fp32)."""
    b = qkv.shape[0]
    p = ctx - 1
    c, s = cos[p], sin[p]
    x = qkv.float().view(b, H + 2 * KV, D)
    q = (_rotate(x[:, :H], c, s) * D**-0.5).to(torch.bfloat16).float()
    k_new = _rotate(x[:, H : H + KV], c, s).to(torch.bfloat16)
    kc, vc = kc.clone(), vc.clone()
    kc[:, :, p] = k_new
    vc[:, :, p] = qkv.view(b, H + 2 * KV, D)[:, H + KV :]
    k = kc[:, :, :ctx].float().repeat_interleave(H // KV, 1)
    v = vc[:, :, :ctx].float().repeat_interleave(H // KV, 1)
    att = torch.softmax(q[:, :, None] @ k.transpose(-1, -2), -1) @ v
    return att.reshape(b, H * D), kc, vc


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize(
    "batch,ctx,splits",
    [(2, 150, 1), (2, 150, 3), (1, 129, None), (3, 1, None), (2, 65, 2)],
)
def test_decode_attention_matches_reference_and_writes_the_new_token(K, batch, ctx, splits):
    qkv, cos, sin, pos, kc, vc = _case(batch, ctx)
    before_k, before_v = kc.clone(), vc.clone()
    out = K.decode_attention(qkv, cos, sin, pos, kc, vc, ctx, H, KV, D, splits=splits)
    ref, ref_k, ref_v = _reference(qkv, cos, sin, before_k, before_v, ctx)
    assert out.dtype == torch.bfloat16 and out.shape == (batch, H * D)
    assert _rel(out, ref) < 2e-2
    p = ctx - 1
    # the new k and v land at position ctx-1 and nowhere else (k may differ by one
    # BF16 step: the GPU contracts the rotation into FMAs)
    torch.testing.assert_close(kc[:, :, p].float(), ref_k[:, :, p].float(), rtol=1e-2, atol=1e-6)
    assert torch.equal(vc[:, :, p], ref_v[:, :, p])
    others = [i for i in range(kc.shape[2]) if i != p]
    assert torch.equal(kc[:, :, others], before_k[:, :, others])
    assert torch.equal(vc[:, :, others], before_v[:, :, others])


def test_decode_attention_reads_only_the_real_context(K):
    qkv, cos, sin, pos, kc, vc = _case(2, 40)
    a = K.decode_attention(qkv, cos, sin, pos, kc.clone(), vc.clone(), 40, H, KV, D)
    kc[:, :, 40:] = float("nan")  # beyond the context: must never be read
    vc[:, :, 40:] = float("nan")
    b = K.decode_attention(qkv, cos, sin, pos, kc, vc, 40, H, KV, D)
    assert torch.equal(a, b)


@pytest.mark.parametrize("splits", [1, 3])
def test_decode_attention_fp8_output_is_the_quantized_bf16_output(K, splits):
    qkv, cos, sin, pos, kc, vc = _case(2, 150)
    bf16 = K.decode_attention(qkv, cos, sin, pos, kc.clone(), vc.clone(), 150, H, KV, D, splits=splits)
    inv = torch.tensor([3.0], device=DEVICE)
    fp8 = K.decode_attention(qkv, cos, sin, pos, kc, vc, 150, H, KV, D, inv_scale=inv, splits=splits)
    assert fp8.dtype == torch.float8_e4m3fn
    expect = (bf16.float() * 3.0).clamp(-448, 448).to(torch.float8_e4m3fn)
    same = fp8.view(torch.uint8) == expect.view(torch.uint8)
    assert same.all() if EXACT else same.float().mean() > 0.9


def test_decode_splits_policy(K):
    assert K.decode_splits(programs=128, n_old=512, sms=132) == 1  # batch 16 x 8 kv heads
    assert K.decode_splits(programs=64, n_old=512, sms=132) == 1  # batch 8
    assert K.decode_splits(programs=32, n_old=512, sms=132) == 8  # batch 4
    assert K.decode_splits(programs=8, n_old=512, sms=132) == 8  # batch 1: bounded by key blocks
    assert K.decode_splits(programs=8, n_old=4096, sms=132) == 33
    assert K.decode_splits(programs=8, n_old=0, sms=132) == 1


def test_add_rmsnorm_and_silu_mul_match_torch(K):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 96, generator=g).to(torch.bfloat16).to(DEVICE)
    r = torch.randn(3, 96, generator=g).to(torch.bfloat16).to(DEVICE)
    w = (torch.rand(96, generator=g) + 0.5).to(torch.bfloat16).to(DEVICE)
    resid = r.clone()
    y = K.add_rmsnorm(x, resid, w, 1e-5)
    s = (x.float() + r.float()).to(torch.bfloat16)
    _same_bf16(resid, s)
    sf = s.float()
    ref = ((sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16).float() * w.float()).to(
        torch.bfloat16
    )
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=1e-2)

    gu = torch.randn(2, 2 * 1500, generator=g).to(torch.bfloat16).to(DEVICE)
    out = K.silu_mul(gu)
    gate, up = gu.float()[:, :1500], gu.float()[:, 1500:]
    ref = (torch.nn.functional.silu(gate).to(torch.bfloat16).float() * up).to(torch.bfloat16)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=1e-2)
