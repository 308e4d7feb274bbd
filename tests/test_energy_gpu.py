"""GPU tests of the runtime and the NVML meter (CI deselects them: -m "not gpu").

Recorded output: reports/gpu_tests/energy_gpu.txt.
Tolerances (relative L2 error of last-token logits, small random Llama):
BF16 runtime vs HF eager: <= 2e-2; FP8 runtime vs the fake-quantized HF model
(same per-tensor weight and activation scales): <= 5e-2, and under half of the
fake-quantized model's own distance from BF16 (FP8 rounding flips where tiny BF16
differences cross a rounding boundary, so two correct FP8 paths differ by a few %).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

BF16_TOL = 2e-2
FP8_TOL = 5e-2


def _small_hf():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128,
        },
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    with torch.no_grad():  # non-trivial norm weights
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _runtime_logits(rt, tokens):
    """Prefill all but the last token, then one decode step (graph-captured)."""
    b, n = tokens.shape
    rt.allocate_cache(b, n + 8)
    with torch.no_grad():
        pre = rt.forward(tokens[:, :-1], 0)
    step = rt.capture(tokens[:, -1:], n - 1)
    step.graph.replay()
    torch.cuda.synchronize()
    return pre, step.logits.clone()


def test_bf16_runtime_matches_hf():
    from advisor.energy.runtime import DecoderRuntime
    from advisor.energy.weights import DecoderWeights

    model = _small_hf()
    tokens = torch.randint(0, 512, (3, 40), device="cuda")
    with torch.no_grad():
        ref = model(tokens).logits
    rt = DecoderRuntime(DecoderWeights.from_hf(model), {})
    pre, dec = _runtime_logits(rt, tokens)
    assert _rel(pre, ref[:, -2]) < BF16_TOL
    assert _rel(dec, ref[:, -1]) < BF16_TOL


def _fake_quantize_hf(model, amax):
    """The same FP8 plan as the runtime, as fake quantization on the HF model."""
    fp8 = torch.float8_e4m3fn

    def fq(x, scale, inv=None):
        q = x.float() / scale if inv is None else x.float() * inv
        return q.clamp(-448, 448).to(fp8).float().mul(scale).to(x.dtype)

    for i, layer in enumerate(model.model.layers):
        a, mlp = layer.self_attn, layer.mlp
        groups = {
            "qkv": [a.q_proj, a.k_proj, a.v_proj],
            "o": [a.o_proj],
            "gate_up": [mlp.gate_proj, mlp.up_proj],
            "down": [mlp.down_proj],
        }
        for kind, mods in groups.items():
            w_amax = torch.cat([m.weight for m in mods]).abs().amax().float()
            s_w = w_amax / 448
            s_x = torch.tensor(amax[f"{i}.{kind}"] / 448, device="cuda")
            inv_x = 1.0 / s_x  # the runtime multiplies by the reciprocal, as here
            for m in mods:
                m.weight.data = fq(m.weight.data, s_w)
                m.register_forward_pre_hook(lambda _m, args, s=s_x, v=inv_x: (fq(args[0], s, v),))


def test_fp8_runtime_matches_fake_quantized_model_and_runs_fp8_gemms():
    from advisor.energy.cuda_tools import kernel_names
    from advisor.energy.runtime import DecoderRuntime, calibrate
    from advisor.energy.weights import DecoderWeights
    from advisor.formats import Format

    model = _small_hf()
    w = DecoderWeights.from_hf(model)
    amax = calibrate(w, batch=2, length=64)
    plan = {f"layers.{i}.{k}": Format.FP8 for i in range(3) for k in ("qkv", "o", "gate_up", "down")}
    rt = DecoderRuntime(w, plan, amax)
    tokens = torch.randint(0, 512, (3, 40), device="cuda")
    pre, dec = _runtime_logits(rt, tokens)
    with torch.no_grad():
        bf16 = model(tokens).logits
    _fake_quantize_hf(model, amax)
    with torch.no_grad():
        ref = model(tokens).logits
    errs = {
        "prefill vs fake-quant": _rel(pre, ref[:, -2]),
        "decode vs fake-quant": _rel(dec, ref[:, -1]),
        "prefill vs bf16": _rel(pre, bf16[:, -2]),
        "fake-quant vs bf16": _rel(ref[:, -1], bf16[:, -1]),
    }
    print("fp8 logits rel. L2 errors:", errs)
    assert errs["prefill vs fake-quant"] < FP8_TOL
    assert errs["decode vs fake-quant"] < FP8_TOL
    # the runtime is the fake-quantized model, not merely close to BF16
    assert errs["decode vs fake-quant"] < 0.5 * errs["fake-quant vs bf16"]
    rt.allocate_cache(16, 64)
    tok = torch.randint(0, 512, (16, 1), device="cuda")
    rows = kernel_names(lambda: rt.forward(tok, 10))
    print("fp8 decode kernels:", [(r["name"], r["count"]) for r in rows])
    # cuBLASLt's Hopper FP8 GEMMs are nvjet_sm90_qq* (e4m3 x e4m3); the BF16 ones nvjet_sm90_tst*.
    # Every projection (4 groups x 3 layers) must be an FP8 GEMM; only the lm_head stays BF16.
    fp8_gemms = sum(r["count"] for r in rows if "_qq" in r["name"] or "e4m3" in r["name"].lower())
    bf16_gemms = sum(
        r["count"]
        for r in rows
        if ("gemm" in r["name"].lower() or "nvjet" in r["name"])
        and "_qq" not in r["name"]
        and "splitKreduce" not in r["name"]
    )
    assert fp8_gemms == 12, rows
    assert bf16_gemms <= 1, rows
    # decode attention is one fused kernel that also rotates, writes the cache and
    # emits FP8 for o_proj: no separate rope or quantization launches
    names = " ".join(r["name"] for r in rows)
    assert "_rope_qkv_kernel" not in names and "_quant_kernel" not in names, rows


def test_nvfp4_energy_is_refused_on_hopper():
    from advisor.energy.runtime import DecoderRuntime
    from advisor.energy.weights import DecoderWeights
    from advisor.errors import UnsupportedError
    from advisor.formats import Format

    if torch.cuda.get_device_capability()[0] >= 10:
        pytest.skip("Blackwell: NVFP4 runs natively")
    w = DecoderWeights.from_hf(_small_hf())
    with pytest.raises(UnsupportedError, match="NVFP4 energy cannot be measured"):
        DecoderRuntime(w, {"layers.0.qkv": Format.NVFP4})


def test_nvml_meter_on_a_gpu_matmul():
    from advisor.energy.meter import MeterConfig, open_meter

    meter = open_meter(0, MeterConfig(warmup_s=0.5, min_window_s=1.0, min_ticks=10, repeats=3))
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

    def step():
        for _ in range(20):
            a @ a
        ev = torch.cuda.Event()
        ev.record()
        return ev

    m = meter.measure(step, "matmul", 1)
    print("meter:", m.power_w, "W", m.s_per_step * 1e3, "ms", "cv", m.cv, m.gpu_after)
    assert m.power_w > m.idle_power_w > 0
    assert all(w.ticks >= 2 for w in m.windows)
    assert m.gpu_after.power_limit_w > 0 and m.gpu_after.driver


@pytest.mark.parametrize("batch,ctx,pdl", [(1, 1000, True), (4, 513, False), (16, 513, True), (64, 77, True)])
def test_fused_decode_attention_matches_rope_and_sdpa(batch, ctx, pdl):
    """Llama-3.1-8B head layout: the fused kernel against rope_qkv + SDPA over the real context."""
    from advisor.energy.kernels import decode_attention, rope_qkv

    h, kv, d, lmax = 32, 8, 128, 1100
    g = torch.Generator(device="cuda").manual_seed(batch)
    qkv = torch.randn(batch, (h + 2 * kv) * d, device="cuda", generator=g).to(torch.bfloat16)
    kc = torch.randn(batch, kv, lmax, d, device="cuda", generator=g).to(torch.bfloat16)
    vc = torch.randn(batch, kv, lmax, d, device="cuda", generator=g).to(torch.bfloat16)
    ang = torch.arange(lmax, device="cuda")[:, None] / (500000.0 ** (torch.arange(0, d, 2, device="cuda") / d))
    cos, sin = ang.cos().float().contiguous(), ang.sin().float().contiguous()
    pos = torch.tensor([ctx - 1], device="cuda")
    kc2, vc2 = kc.clone(), vc.clone()
    out = decode_attention(qkv, cos, sin, pos, kc, vc, ctx, h, kv, d, pdl=pdl)
    q = rope_qkv(qkv, cos, sin, pos, kc2, vc2, batch, 1, h, kv, d)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float(), kc2[:, :, :ctx].float(), vc2[:, :, :ctx].float(), scale=1.0, enable_gqa=True
    ).reshape(batch, -1)
    assert _rel(out, ref) < 1e-2
    assert torch.equal(vc[:, :, ctx - 1], vc2[:, :, ctx - 1])
    torch.testing.assert_close(kc[:, :, ctx - 1].float(), kc2[:, :, ctx - 1].float(), rtol=1e-2, atol=1e-6)
