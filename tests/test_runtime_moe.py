"""Routed-expert layers in the measurement runtime, against transformers' own MoE models (CPU interpreter).

Tiny random-weight Qwen3-MoE, Mixtral and Qwen2-MoE (a shared expert beside the routed ones)
models (8 experts, top-2, two layers) are built by
transformers; the runtime copies their weights and prefills 11 tokens, then decodes the
12th. Its expert path (router, sort by expert, grouped GEMMs - a loop over experts on the
CPU -, weighted combine) must give the HF model's logits (float32 run) within the
5% (HF's own BF16 run is 1.0-2.2% off its float32 run on these models, and the
interpreter truncates to BF16 where the GPU rounds); routing to the wrong experts moves
them by over 100%.
"""

from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch

pytest.importorskip("triton")  # the dev extra installs it on Linux x86_64 only
import transformers  # noqa: E402  (a hard dependency: its absence must fail, not skip)

from advisor.formats import Format  # noqa: E402

TOL, VOCAB, SEQ = 5e-2, 96, 12
_MOE = dict(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            head_dim=64, max_position_embeddings=64, num_experts_per_tok=2, initializer_range=0.05)


@pytest.fixture(scope="module", autouse=True)
def _interpreter():
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU, and triton was imported before TRITON_INTERPRET=1 could be set (see conftest.py)")


def _config(family: str):
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(**_MOE, num_experts=8, moe_intermediate_size=48, norm_topk_prob=True)
    if family == "qwen2_moe":  # a shared expert beside the routed ones; top-k probabilities not renormalized
        return transformers.Qwen2MoeConfig(**_MOE, num_experts=8, moe_intermediate_size=48,
                                           shared_expert_intermediate_size=64, norm_topk_prob=False)
    return transformers.MixtralConfig(**_MOE, num_local_experts=8, intermediate_size=48)


def _model(family: str):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(_config(family), attn_implementation="eager")
    model = model.to(torch.bfloat16).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif "gate.weight" in name:
                p.normal_(0.0, 0.5)  # a router with clear preferences
            elif "expert" in name:
                p.normal_(0.0, 0.15)  # experts (routed and shared) that move the logits
    tokens = torch.randint(3, VOCAB - 3, (2, SEQ), generator=torch.Generator().manual_seed(1))
    return model, tokens


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _runtime(model, fmt: Format = Format.BF16, amax=None):
    from advisor.energy.measure import uniform_formats
    from advisor.energy.runtime import DecoderRuntime, DecoderWeights

    w = DecoderWeights.from_hf(model, max_pos=SEQ + 4, device="cpu")
    return DecoderRuntime(w, uniform_formats(w.dims, fmt), amax)


def _logits(rt, tokens):
    rt.allocate_cache(tokens.shape[0], SEQ + 4)
    with torch.no_grad():
        return rt.forward(tokens[:, :-1], 0), rt.forward(tokens[:, -1:], SEQ - 1)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "qwen2_moe"])
def test_runtime_moe_decoder_matches_the_hf_model(family):
    model, tokens = _model(family)
    with torch.no_grad():
        ref = copy.deepcopy(model).float()(tokens).logits.float()
    rt = _runtime(model)
    assert set(rt.experts) == {0, 1} and not any(k.endswith((".gate_up", ".down")) for k in rt.lin)
    prefill, decode = _logits(rt, tokens)
    errs = (_rel(prefill, ref[:, -2]), _rel(decode, ref[:, -1]))
    assert max(errs) < TOL, errs
    if family == "qwen2_moe":  # the shared expert runs: without it the layer is another function
        assert {k.split(".", 1)[1] for k in rt.lin} == {"qkv", "o", "shared_gate_up", "shared_down"}
        alone = _runtime(model)
        for i in alone.experts:
            alone.lin[f"{i}.shared_down"].w = torch.zeros_like(alone.lin[f"{i}.shared_down"].w)
        assert _rel(_logits(alone, tokens)[1], ref[:, -1]) > 5 * TOL
    # routing every token to its experts' neighbours moves the logits far beyond that
    wrong_rt = _runtime(model)
    for e in wrong_rt.experts.values():
        e.router = e.router.roll(1, 0)
    _, wrong = _logits(wrong_rt, tokens)
    assert _rel(wrong, ref[:, -1]) > 5 * TOL


def test_calibration_and_touched_experts_of_the_runtime():
    from advisor.energy.runtime import calibrate

    model, tokens = _model("qwen3_moe")
    rt = _runtime(model)
    amax = calibrate(rt.w, batch=2, length=8)
    assert amax["0.experts"] > 0 and amax["0.experts_down"] > 0
    for e in rt.experts.values():
        e.track = True
    _logits(rt, tokens)
    # prefill of 2 x 11 tokens, then a decode step of 2 tokens: at most 2 x 2 experts each
    touched = rt.experts[0].touched
    assert len(touched) == 2 and 2 <= touched[1] <= 4 and 2 <= touched[0] <= 8


def test_fp8_experts_track_the_bf16_experts():
    from advisor.energy.runtime import RoutedExperts

    model, _ = _model("qwen3_moe")
    rt = _runtime(model)
    t, spec = rt.w.t, rt.dims.layers[0].moe
    x = torch.randn(16, 128, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    bf16 = RoutedExperts(spec, t["0.router"], t["0.experts_gate_up"], t["0.experts_down"], Format.BF16)
    mid = {}
    ref = bf16(x, lambda k, v: mid.__setitem__(k, v.float().abs().amax().item()), "e")
    fp8 = RoutedExperts(spec, t["0.router"], t["0.experts_gate_up"], t["0.experts_down"], Format.FP8,
                        mid["e"], mid["e_down"])
    assert fp8.w1.dtype == torch.float8_e4m3fn and fp8.scale_w1.shape == (8, 96) and fp8.scale_w2.shape == (8, 128)
    assert fp8.weight_bytes * 2 == bf16.weight_bytes
    # two E4M3 roundings (the input and act*up, static per-tensor scales) of random data, and the
    # interpreter misrounds some codes: ~11% here; a wrong expert or scale would be off by ~100%
    assert 0 < _rel(fp8(x), ref) < 0.2


def test_a_shared_expert_is_calibrated():  # the FP8 runtime needs a GPU: tests/test_model_profile_gpu.py
    from advisor.energy.runtime import calibrate

    model, _ = _model("qwen2_moe")
    amax = calibrate(_runtime(model).w, batch=2, length=8)
    assert amax["0.shared_gate_up"] > 0 and amax["0.shared_down"] > 0 and amax["1.experts"] > 0
