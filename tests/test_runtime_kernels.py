"""The runtime's Triton kernels against plain PyTorch references.

On a CUDA GPU the kernels run compiled. Without one they run in Triton's
interpreter (numpy on the CPU; conftest.py sets TRITON_INTERPRET=1 before triton is
imported); CI runs them that way. Triton 3.6's interpreter converts FP32 to BF16 by
truncation and to FP8 wrongly where rounding crosses a power of two, so on the CPU
roundings are checked to one BF16 step and FP8 codes to most elements; on the GPU
they are checked bit for bit. Timings are not tested here (benchmarks/studies/energy_formats.py measures them).
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
    from advisor.energy.runtime import kernels

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


# -- the families' variants: padded head dims, windows (ring caches), q/k norms, soft-capping


def _head_norm(x, w, eps=1e-6):
    """Llama-style per-head RMSNorm (normalized value rounded to BF16 before the weight)."""
    y = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16).float()
    return (y * w.float()).to(torch.bfloat16).float()


def _family_case(batch, ctx, d, h=4, kv=2, lmax=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(batch, (h + 2 * kv) * d, generator=g).to(torch.bfloat16).to(DEVICE)
    kc = torch.randn(batch, kv, lmax, d, generator=g).to(torch.bfloat16).to(DEVICE)
    vc = torch.randn(batch, kv, lmax, d, generator=g).to(torch.bfloat16).to(DEVICE)
    cos, sin = _rope_tables(max(lmax, ctx) + 1, d)
    return qkv, cos, sin, torch.tensor([ctx - 1], device=DEVICE), kc, vc


def _family_reference(qkv, cos, sin, kc, vc, ctx, h, kv, kv_lo=0, q_norm=None, k_norm=None, softcap=None):
    """One decode step over positions [kv_lo, ctx) of a cache holding position n in slot n % length (fp32)."""
    b, d, length = qkv.shape[0], kc.shape[-1], kc.shape[2]
    p = ctx - 1
    c, s = cos[p], sin[p]
    x = qkv.float().view(b, h + 2 * kv, d)
    q, k_new = x[:, :h], x[:, h : h + kv]
    if q_norm is not None:
        q, k_new = _head_norm(q, q_norm), _head_norm(k_new, k_norm)
    q = (_rotate(q, c, s) * d**-0.5).to(torch.bfloat16).float()
    k_new = _rotate(k_new, c, s).to(torch.bfloat16)
    kc, vc = kc.clone(), vc.clone()
    kc[:, :, p % length] = k_new
    vc[:, :, p % length] = qkv.view(b, h + 2 * kv, d)[:, h + kv :]
    slots = torch.arange(kv_lo, ctx, device=kc.device) % length
    k = kc[:, :, slots].float().repeat_interleave(h // kv, 1)
    v = vc[:, :, slots].float().repeat_interleave(h // kv, 1)
    scores = q[:, :, None] @ k.transpose(-1, -2)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    return (torch.softmax(scores, -1) @ v).reshape(b, h * d), kc, vc


@pytest.mark.parametrize("d,splits", [(16, 1), (80, 1), (96, 3), (256, 2), (64, 1)])
def test_decode_attention_pads_head_dims_that_are_not_a_power_of_two(K, d, splits):
    qkv, cos, sin, pos, kc, vc = _family_case(2, 70, d)
    before_k = kc.clone()
    out = K.decode_attention(qkv, cos, sin, pos, kc, vc, 70, 4, 2, d, splits=splits)
    ref, ref_k, ref_v = _family_reference(qkv, cos, sin, before_k, vc.clone(), 70, 4, 2)
    assert out.shape == (2, 4 * d)
    assert _rel(out, ref) < 2e-2
    torch.testing.assert_close(kc[:, :, 69].float(), ref_k[:, :, 69].float(), rtol=1e-2, atol=1e-6)
    assert torch.equal(vc[:, :, 69], ref_v[:, :, 69])
    assert torch.equal(kc[:, :, :69], before_k[:, :, :69]) and torch.equal(kc[:, :, 70:], before_k[:, :, 70:])


def test_decode_attention_with_a_window_reads_only_the_window(K):
    qkv, cos, sin, pos, kc, vc = _family_case(2, 90, 64)
    kv_lo = 90 - 20  # window 20: the new token and the 19 before it
    ref, _, _ = _family_reference(qkv, cos, sin, kc, vc, 90, 4, 2, kv_lo=kv_lo)
    kc[:, :, :kv_lo] = float("nan")  # before the window: must never be read
    vc[:, :, :kv_lo] = float("nan")
    out = K.decode_attention(qkv, cos, sin, pos, kc, vc, 90, 4, 2, 64, kv_lo=kv_lo, splits=2)
    assert _rel(out, ref) < 2e-2


def test_decode_attention_on_a_ring_cache_reads_and_writes_slots_modulo_its_length(K):
    window, ctx = 24, 150  # the cache holds 24 positions; position n sits in slot n % 24
    qkv, cos, sin, pos, kc, vc = _family_case(2, ctx, 80, lmax=window)
    before_k, before_v = kc.clone(), vc.clone()
    out = K.decode_attention(qkv, cos, sin, pos, kc, vc, ctx, 4, 2, 80, kv_lo=ctx - window, ring=True)
    ref, ref_k, ref_v = _family_reference(qkv, cos, sin, before_k, before_v, ctx, 4, 2, kv_lo=ctx - window)
    assert _rel(out, ref) < 2e-2
    slot = (ctx - 1) % window
    assert torch.equal(vc[:, :, slot], ref_v[:, :, slot])
    others = [i for i in range(window) if i != slot]
    assert torch.equal(kc[:, :, others], before_k[:, :, others])


@pytest.mark.parametrize("splits", [1, 3])
def test_decode_attention_with_qk_norm_and_softcap(K, splits):
    d = 96
    qkv, cos, sin, pos, kc, vc = _family_case(2, 80, d, seed=3)
    g = torch.Generator().manual_seed(4)
    qn = (torch.rand(d, generator=g) + 0.5).to(torch.bfloat16).to(DEVICE)
    kn = (torch.rand(d, generator=g) + 0.5).to(torch.bfloat16).to(DEVICE)
    kc0 = kc.clone()
    out = K.decode_attention(
        qkv, cos, sin, pos, kc, vc, 80, 4, 2, d, splits=splits, q_norm=qn, k_norm=kn, softcap=0.5
    )
    ref, ref_k, _ = _family_reference(qkv, cos, sin, kc0, vc.clone(), 80, 4, 2, q_norm=qn, k_norm=kn, softcap=0.5)
    assert _rel(out, ref) < 2e-2
    torch.testing.assert_close(kc[:, :, 79].float(), ref_k[:, :, 79].float(), rtol=2e-2, atol=1e-2)
    # the cap binds: without it the same inputs give another output
    uncapped, _, _ = _family_reference(qkv, cos, sin, kc0, vc.clone(), 80, 4, 2, q_norm=qn, k_norm=kn)
    assert _rel(uncapped, ref) > 10 * _rel(out, ref)


@pytest.mark.parametrize("d", [16, 96])
def test_rope_qkv_pads_the_head_and_normalizes_q_and_k(K, d):
    h, kv, length, lmax = 4, 2, 5, 16
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(2 * length, (h + 2 * kv) * d, generator=g).to(torch.bfloat16).to(DEVICE)
    qn = (torch.rand(d, generator=g) + 0.5).to(torch.bfloat16).to(DEVICE)
    kn = (torch.rand(d, generator=g) + 0.5).to(torch.bfloat16).to(DEVICE)
    kc = torch.zeros(2, kv, lmax, d, dtype=torch.bfloat16, device=DEVICE)
    vc = torch.zeros_like(kc)
    cos, sin = _rope_tables(lmax, d)
    pos = torch.tensor([3], device=DEVICE)
    q = K.rope_qkv(qkv, cos, sin, pos, kc, vc, 2, length, h, kv, d, q_norm=qn, k_norm=kn, q_scale=0.25)
    x = qkv.float().view(2, length, h + 2 * kv, d)
    c, s = cos[3 : 3 + length][None, :, None], sin[3 : 3 + length][None, :, None]
    ref_q = (_rotate(_head_norm(x[:, :, :h], qn), c, s) * 0.25).transpose(1, 2)
    ref_k = _rotate(_head_norm(x[:, :, h : h + kv], kn), c, s).transpose(1, 2)
    torch.testing.assert_close(q.float(), ref_q, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(kc[:, :, 3 : 3 + length].float(), ref_k, rtol=2e-2, atol=2e-2)
    assert torch.equal(vc[:, :, 3 : 3 + length], qkv.view(2, length, h + 2 * kv, d)[:, :, h + kv :].transpose(1, 2))
    assert not kc[:, :, :3].any() and not kc[:, :, 3 + length :].any()


def test_gelu_tanh_mul_matches_torch(K):
    g = torch.Generator().manual_seed(6)
    gu = (torch.randn(3, 2 * 700, generator=g) * 3).to(torch.bfloat16).to(DEVICE)
    out = K.gated_act(gu, "gelu_tanh")
    gate, up = gu.float()[:, :700], gu.float()[:, 700:]
    gelu = torch.nn.functional.gelu(gate, approximate="tanh").to(torch.bfloat16).float()
    ref = (gelu * up).to(torch.bfloat16)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    silu = (torch.nn.functional.silu(gate).to(torch.bfloat16).float() * up).to(torch.bfloat16)
    assert (silu.float() - ref.float()).abs().max() > 0.2  # the two activations differ here: the check can fail


def test_add_rmsnorm_normalizes_the_input_first_in_gemma_style(K):
    """Gemma: residual += norm(x) * (1 + w_post); out = norm(residual) * (1 + w_pre), in float32."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(3, 96, generator=g) * 4).to(torch.bfloat16).to(DEVICE)
    r = torch.randn(3, 96, generator=g).to(torch.bfloat16).to(DEVICE)
    w_post = (torch.rand(96, generator=g) + 0.5).to(DEVICE)  # float32 1 + w, as the runtime stores it
    w_pre = (torch.rand(96, generator=g) + 0.5).to(DEVICE)
    resid = r.clone()
    y = K.add_rmsnorm(x, resid, w_pre, 1e-6, x_weight=w_post, norm_round=False)

    def norm(t, w):
        t = t.float()
        return (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * w).to(torch.bfloat16)

    s = (norm(x, w_post).float() + r.float()).to(torch.bfloat16)
    torch.testing.assert_close(resid.float(), s.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(y.float(), norm(s, w_pre).float(), rtol=2e-2, atol=2e-2)


def _fp8_cache(kc, vc):
    """E4M3 codes of a BF16 cache with one scale per tensor (amax / 448, as ModelOpt exports them)."""
    ks = (kc.float().abs().amax() / 448).reshape(1)
    vs = (vc.float().abs().amax() / 448).reshape(1)
    return (kc.float() / ks).to(torch.float8_e4m3fn), (vc.float() / vs).to(torch.float8_e4m3fn), ks, vs


@pytest.mark.parametrize("batch,ctx,splits", [(2, 150, 1), (2, 150, 3), (3, 1, None)])
def test_decode_attention_reads_an_fp8_cache_and_writes_the_new_token_in_fp8(K, batch, ctx, splits):
    qkv, cos, sin, pos, kc, vc = _case(batch, ctx)
    k8, v8, ks, vs = _fp8_cache(kc, vc)
    before_k, before_v = k8.clone(), v8.clone()
    out = K.decode_attention(qkv, cos, sin, pos, k8, v8, ctx, H, KV, D, splits=splits, k_scale=ks, v_scale=vs)
    # reference: the cache as its codes say (dequantized), the new token quantized as the cache will hold it
    p = ctx - 1
    x = qkv.float().view(batch, H + 2 * KV, D)
    k_new = _rotate(x[:, H:H + KV], cos[p], sin[p]).to(torch.bfloat16)
    k_new8 = (k_new.float() / ks).to(torch.float8_e4m3fn)
    v_new8 = (x[:, H + KV:] / vs).to(torch.float8_e4m3fn)
    deq_k, deq_v = (k8.float() * ks).to(torch.bfloat16), (v8.float() * vs).to(torch.bfloat16)
    # the new token as the kernel wrote it (its codes are checked against k_new8 / v_new8 below)
    deq_k[:, :, p], deq_v[:, :, p] = (k8[:, :, p].float() * ks).to(torch.bfloat16), (v8[:, :, p].float() * vs).to(
        torch.bfloat16)
    q = (_rotate(x[:, :H], cos[p], sin[p]) * D**-0.5).to(torch.bfloat16).float()
    k = deq_k[:, :, :ctx].float().repeat_interleave(H // KV, 1)
    v = deq_v[:, :, :ctx].float().repeat_interleave(H // KV, 1)
    ref = (torch.softmax(q[:, :, None] @ k.transpose(-1, -2), -1) @ v).reshape(batch, H * D)
    assert out.dtype == torch.bfloat16 and _rel(out, ref) < 2e-2
    # the BF16-cache result differs by FP8's own error, which is far above the kernel's
    bf16 = K.decode_attention(qkv, cos, sin, pos, kc.clone(), vc.clone(), ctx, H, KV, D, splits=splits)
    assert _rel(out, ref) < _rel(bf16, ref) or ctx == 1
    same_k = (k8[:, :, p].view(torch.uint8) == k_new8.view(torch.uint8)).float().mean()
    same_v = (v8[:, :, p].view(torch.uint8) == v_new8.view(torch.uint8)).float().mean()
    # codes equal (the GPU's rotation FMAs may move a rare one; the interpreter's FP8 rounding more)
    assert min(same_k, same_v) > (0.95 if EXACT else 0.9)
    others = [i for i in range(k8.shape[2]) if i != p]
    assert torch.equal(k8[:, :, others].view(torch.uint8), before_k[:, :, others].view(torch.uint8))
    assert torch.equal(v8[:, :, others].view(torch.uint8), before_v[:, :, others].view(torch.uint8))


def test_decode_attention_refuses_an_fp8_cache_without_scales(K):
    qkv, cos, sin, pos, kc, vc = _case(1, 20)
    k8, v8, ks, _ = _fp8_cache(kc, vc)
    with pytest.raises(ValueError, match="both scales"):
        K.decode_attention(qkv, cos, sin, pos, k8, v8, 20, H, KV, D, k_scale=ks)
