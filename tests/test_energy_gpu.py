"""GPU tests of the runtime and the NVML meter (CI deselects them: -m "not gpu").

Recorded output: reports/gpu_tests/energy_gpu.txt.
Tolerances (relative L2 error of last-token logits, small random models: a Llama, and
each dense family at its real head layout with 2 layers, small MLP and vocab):
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


def _is_gemm(name: str) -> bool:
    low = name.lower()
    return any(t in low for t in ("gemm", "nvjet", "cutlass", "splitk", "xmma", "cublas"))


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
    from advisor.energy.runtime import DecoderRuntime, DecoderWeights

    model = _small_hf()
    tokens = torch.randint(0, 512, (3, 40), device="cuda")
    with torch.no_grad():
        ref = model(tokens).logits
    rt = DecoderRuntime(DecoderWeights.from_hf(model), {})
    pre, dec = _runtime_logits(rt, tokens)
    assert _rel(pre, ref[:, -2]) < BF16_TOL
    assert _rel(dec, ref[:, -1]) < BF16_TOL


def _text_layers(model):
    inner = model.model
    return inner.language_model.layers if hasattr(inner, "language_model") else inner.layers


def _hf_groups(layer) -> dict:
    """The modules of each runtime group in one HF layer (Phi-3's are pre-fused)."""
    a, mlp = layer.self_attn, layer.mlp
    if hasattr(a, "qkv_proj"):
        return {"qkv": [a.qkv_proj], "o": [a.o_proj], "gate_up": [mlp.gate_up_proj], "down": [mlp.down_proj]}
    return {
        "qkv": [a.q_proj, a.k_proj, a.v_proj],
        "o": [a.o_proj],
        "gate_up": [mlp.gate_proj, mlp.up_proj],
        "down": [mlp.down_proj],
    }


def _fake_quantize_hf(model, amax):
    """The same FP8 plan as the runtime, as fake quantization on the HF model."""
    fp8 = torch.float8_e4m3fn

    def fq(x, scale, inv=None):
        q = x.float() / scale if inv is None else x.float() * inv
        return q.clamp(-448, 448).to(fp8).float().mul(scale).to(x.dtype)

    for i, layer in enumerate(_text_layers(model)):
        for kind, mods in _hf_groups(layer).items():
            w_amax = torch.cat([m.weight for m in mods]).abs().amax().float()
            s_w = w_amax / 448
            s_x = torch.tensor(amax[f"{i}.{kind}"] / 448, device=w_amax.device)
            inv_x = 1.0 / s_x  # the runtime multiplies by the reciprocal, as here
            for m in mods:
                m.weight.data = fq(m.weight.data, s_w)
                m.register_forward_pre_hook(lambda _m, args, s=s_x, v=inv_x: (fq(args[0], s, v),))


def test_fp8_runtime_matches_fake_quantized_model_and_runs_fp8_gemms():
    from advisor.energy.runtime import DecoderRuntime, DecoderWeights, calibrate, kernel_names
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
    # 8 kernels per decode layer: 4 GEMMs, 2 RMSNorms, attention, act*up (no split-K
    # reduction of attention at this batch); besides, the step has the embedding, the
    # position fill, the final norm (one more _add_rmsnorm_kernel) and the lm_head GEMM
    ours = {r["name"]: r["count"] for r in rows if r["name"].startswith("_")}
    assert ours == {"_add_rmsnorm_kernel": 7, "_decode_attn_kernel": 3, "_gated_act_kernel": 3}, rows
    others = [r for r in rows if not r["name"].startswith("_") and not _is_gemm(r["name"])]
    assert sum(r["count"] for r in others) <= 2, others
    # decode attention is one fused kernel that also rotates, writes the cache and
    # emits FP8 for o_proj: no separate rope or quantization launches
    names = " ".join(r["name"] for r in rows)
    assert "_rope_qkv_kernel" not in names and "_quant_kernel" not in names, rows


def test_nvfp4_energy_is_refused_on_hopper():
    from advisor.energy.runtime import DecoderRuntime, DecoderWeights
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
    # a soak keeps the GPU busy until its temperature settles or its time is up, and leaves nothing in flight
    soak = meter.soak(step, max_s=4.0, settle_c=1.0, every_s=2.0)
    print("soak:", soak)
    assert 2.0 <= soak["seconds"] <= 6.0 and soak["to_c"] >= soak["from_c"] - 1
    assert torch.cuda.current_stream().query()



def test_gemm_table_times_and_meters_a_gemm():
    """The GPU profile's GEMM tables: time per GEMM grows with the rows, FP8 reads half the weight bytes of BF16
    (faster at one row on an 8B-sized GEMM), and the metered energy is the window's power times the GEMM's time."""
    from advisor.energy.meter import MeterConfig, open_meter
    from advisor.energy.profiling import gemm_row_energy, gemm_row_ms
    from advisor.formats import Format

    rows = (1, 64, 2048)
    bf16 = gemm_row_ms(14336, 4096, Format.BF16, rows)
    fp8 = gemm_row_ms(14336, 4096, Format.FP8, rows)
    print("ms per GEMM:", bf16, fp8)
    assert 0 < bf16[0] <= bf16[1] * 1.05 < bf16[2] and fp8[0] < bf16[0]
    meter = open_meter(0, MeterConfig(warmup_s=0.2, min_window_s=0.2, min_ticks=2, repeats=2, soak_s=0))
    points = gemm_row_energy(14336, 4096, Format.BF16, (1, 2048), meter)
    print("metered:", points)
    for p in points:
        assert p["j"] == pytest.approx(p["power_w"] * p["ms"] / 1e3, rel=0.05)
        assert p["power_w"] > meter.idle_power_w()
    assert points[1]["j"] > points[0]["j"]
def test_gemm_energies_are_metered_per_format_and_row_count_for_a_gpu_profile():
    """What `advisor profile` (no --model) adds to a GPU profile: each GEMM's metered J per row count, both formats
    except for an lm_head (BF16 only), shapes already metered kept, the caller told after each shape."""
    from advisor.energy.meter import MeterConfig, open_meter
    from advisor.energy.profiling import measure_gemm_energy

    meter = open_meter(0, MeterConfig(warmup_s=0.2, min_window_s=0.2, min_ticks=2, repeats=2, soak_s=1.0))
    kept = {"bf16": {"576x576": [{"j": 1.0}] * 2}, "fp8": {}}
    seen = []
    gemm, soak = measure_gemm_energy(meter, [(576, 576), (4096, 4096), (49152, 576)], rows=(1, 512), done=kept,
                                     log=print, after_shape=lambda g: seen.append(sum(len(v) for v in g.values())))
    print("soak:", soak, "metered:", {f: {nk: [round(p["j"] * 1e3, 4) for p in pts] for nk, pts in v.items()}
                                      for f, v in gemm.items()})
    assert gemm["bf16"]["576x576"] == kept["bf16"]["576x576"]  # kept, not metered again
    assert set(gemm["fp8"]) == {"576x576", "4096x4096"} and "49152x576" in gemm["bf16"]  # the lm_head: BF16 only
    for fmt in ("bf16", "fp8"):
        one, many = gemm[fmt]["4096x4096"]
        assert 0 < one["j"] < many["j"] and one["power_w"] > meter.idle_power_w()
    assert gemm["fp8"]["4096x4096"][0]["j"] < gemm["bf16"]["4096x4096"][0]["j"]  # half the weight bytes at one row
    assert seen == [2, 4, 5]


@pytest.mark.parametrize("batch,ctx,pdl", [(1, 1000, True), (4, 513, False), (16, 513, True), (64, 77, True)])
def test_fused_decode_attention_matches_rope_and_sdpa(batch, ctx, pdl):
    """Llama-3.1-8B head layout: the fused kernel against rope_qkv + SDPA over the real context."""
    from advisor.energy.runtime.kernels import decode_attention, rope_qkv

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


# -- each dense family at its real head layout ---------------------------------------------

_COMMON = dict(num_hidden_layers=2, intermediate_size=1024, vocab_size=1024, max_position_embeddings=4096,
               pad_token_id=0, bos_token_id=1, eos_token_id=2)
_WINDOW = 64  # shortened so that 150 tokens wrap the ring caches
FAMILY_SHAPES = {
    "llama-3.2-1b (hd 64)": ("LlamaConfig", dict(hidden_size=2048, num_attention_heads=32, num_key_value_heads=8,
                                                 head_dim=64)),
    "llama (hd 80)": ("LlamaConfig", dict(hidden_size=2560, num_attention_heads=32, num_key_value_heads=8,
                                          head_dim=80)),
    "qwen2.5-7b": ("Qwen2Config", dict(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4)),
    "qwen3-8b": ("Qwen3Config", dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128)),
    "mistral-7b": ("MistralConfig", dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                                         sliding_window=_WINDOW)),
    "gemma2-9b": ("Gemma2Config", dict(hidden_size=3584, num_attention_heads=16, num_key_value_heads=8, head_dim=256,
                                       query_pre_attn_scalar=256, sliding_window=_WINDOW)),
    "gemma3-4b": ("Gemma3TextConfig", dict(hidden_size=2560, num_attention_heads=8, num_key_value_heads=4,
                                           head_dim=256, sliding_window=_WINDOW,
                                           layer_types=["sliding_attention", "full_attention"])),
    "phi3-mini (hd 96)": ("Phi3Config", dict(hidden_size=3072, num_attention_heads=32, num_key_value_heads=32,
                                             sliding_window=_WINDOW)),
}


def _family_hf(name: str):
    import transformers

    cls, kw = FAMILY_SHAPES[name]
    cfg = getattr(transformers, cls)(**_COMMON, **kw)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.bfloat16)
    model.eval()
    gemma = cls.startswith("Gemma")
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.uniform_(-0.5, 0.5) if gemma else p.uniform_(0.5, 1.5)
            elif pname.endswith("bias"):
                p.normal_(0.0, 0.5)
    return model


def _f32_reference(model, tokens):
    import copy

    with torch.no_grad():
        ref = copy.deepcopy(model).float()(tokens).logits
    torch.cuda.empty_cache()
    return ref


@pytest.mark.parametrize("name", list(FAMILY_SHAPES))
def test_bf16_runtime_matches_hf_for_each_family(name):
    """Prefill (SDPA, banded where windowed) and a graph-captured decode step (the fused kernel)."""
    from advisor.energy.runtime import DecoderRuntime, DecoderWeights

    model = _family_hf(name)
    tokens = torch.randint(3, 1024, (3, 150), device="cuda")
    ref = _f32_reference(model, tokens)
    rt = DecoderRuntime(DecoderWeights.from_hf(model), {})
    pre, dec = _runtime_logits(rt, tokens)
    errs = {"prefill": _rel(pre, ref[:, -2]), "decode": _rel(dec, ref[:, -1])}
    print(name, "bf16 logits rel. L2 errors:", errs)
    assert max(errs.values()) < BF16_TOL, errs


@pytest.mark.parametrize("name", ["qwen2.5-7b", "gemma3-4b", "phi3-mini (hd 96)"])
def test_fp8_runtime_matches_fake_quantized_model_for_families(name):
    """FP8 GEMMs with biases in the epilogue (Qwen2), Gemma's fused norms, Phi-3's pre-fused groups."""
    from advisor.energy.runtime import DecoderRuntime, DecoderWeights, calibrate, kernel_names
    from advisor.formats import Format

    model = _family_hf(name)
    w = DecoderWeights.from_hf(model)
    amax = calibrate(w, batch=2, length=64)
    plan = {f"layers.{i}.{k}": Format.FP8 for i in range(2) for k in ("qkv", "o", "gate_up", "down")}
    rt = DecoderRuntime(w, plan, amax)
    tokens = torch.randint(3, 1024, (3, 150), device="cuda")
    pre, dec = _runtime_logits(rt, tokens)
    with torch.no_grad():
        bf16 = model(tokens).logits
    _fake_quantize_hf(model, amax)
    with torch.no_grad():
        ref = model(tokens).logits
    errs = {"prefill": _rel(pre, ref[:, -2]), "decode": _rel(dec, ref[:, -1])}
    fq_vs_bf16 = _rel(ref[:, -1], bf16[:, -1])
    print(name, "fp8 logits rel. L2 errors vs fake-quant:", errs, "fake-quant vs bf16:", fq_vs_bf16)
    # FP8 rounding flips make two correct FP8 paths differ by several %, more on these
    # 2-layer random models with 4 norms (Gemma) than on the Llama above (CPU dry run with
    # exact FP8 rounding: Qwen2 2%, Phi-3 5%, Gemma 3 7% at hidden 128-192); what must hold
    # is that the runtime is the fake-quantized model, clearly closer to it than BF16 is
    assert max(errs.values()) < 0.1, errs
    assert max(errs.values()) < 0.75 * fq_vs_bf16, (errs, fq_vs_bf16)
    rt.allocate_cache(16, 64)
    tok = torch.randint(0, 1024, (16, 1), device="cuda")
    rows = kernel_names(lambda: rt.forward(tok, 10))
    fp8_gemms = sum(r["count"] for r in rows if "_qq" in r["name"] or "e4m3" in r["name"].lower())
    assert fp8_gemms == 8, rows


def test_trained_model_with_head_dim_16_runs_compiled(tiny_model_dir):
    """tinystories-656k (head_dim 16) once crashed the decode kernel's compilation (tl.dot K < 16)."""
    from transformers import AutoModelForCausalLM

    from advisor.energy.runtime import DecoderRuntime, DecoderWeights, calibrate
    from advisor.formats import Format

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).to("cuda").eval()
    tokens = torch.randint(3, model.config.vocab_size, (4, 100), device="cuda")
    ref = _f32_reference(model, tokens)
    w = DecoderWeights.from_hf(model)
    pre, dec = _runtime_logits(DecoderRuntime(w, {}), tokens)
    assert _rel(pre, ref[:, -2]) < BF16_TOL and _rel(dec, ref[:, -1]) < BF16_TOL
    plan = {f"layers.{i}.{k}": Format.FP8 for i in range(2) for k in ("qkv", "o", "gate_up", "down")}
    _, dec8 = _runtime_logits(DecoderRuntime(w, plan, calibrate(w, batch=2, length=64)), tokens)
    assert torch.isfinite(dec8).all()


def test_measured_estimates_free_their_runtime_and_grow_rope(tiny_model_dir):
    """Estimates of several plans leave no KV cache or graph behind; a longer workload gets RoPE tables."""
    from transformers import AutoConfig

    from advisor.energy.measure import MeasuredEnergyModel
    from advisor.energy.meter import MeterConfig
    from advisor.formats import Format
    from advisor.models.shape import llama_shape
    from advisor.plan import Plan
    from advisor.recipe.schema import Workload

    cfg = AutoConfig.from_pretrained(tiny_model_dir)
    shape = llama_shape("model.layers", 2, 128, 384, 8, 4, cfg.vocab_size)
    quick = MeterConfig(warmup_s=0.2, min_window_s=0.3, min_ticks=3, repeats=1, idle_s=0.3, soak_s=2.0)
    em = MeasuredEnergyModel(shape, config=quick, model_config=cfg)
    assert "Llama 3.x layers" in em.label
    formats = (Format.BF16, Format.FP8, Format.BF16, Format.FP8)
    plans = [Plan({g.name: fmt for g in shape.groups}) for fmt in formats]
    short = Workload(name="s", batch_size=8, input_tokens=256, output_tokens=64)
    allocated = []
    for plan in plans:
        est = em.estimate(plan, short)
        assert est.j_per_token > 0 and est.measured
        torch.cuda.synchronize()
        allocated.append(torch.cuda.memory_allocated())
    # after the first FP8 plan only the shared FP8 weight copies stay; no cache or graph per plan
    assert max(allocated[1:]) <= allocated[1] + (1 << 20), allocated
    long = Workload(name="l", batch_size=2, input_tokens=9000, output_tokens=64)
    assert em.estimate(plans[0], long).j_per_token > 0
    assert em._bench.weights.max_pos >= 9000 + 64 + 1
