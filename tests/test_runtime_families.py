"""Each dense family's runtime decoder against its transformers model, in Triton's CPU interpreter.

A tiny random-weight model of each family (head dims 64, 80, 96, 128, 256 at two heads,
sliding windows of 4 keys over 12-token sequences, two layers) is built by
transformers; its weights are copied into the runtime, which prefills 11 tokens and
decodes the 12th (the fused decode kernel, ring caches for windowed layers). Both
last-token logits are compared with the HF model run in float32 on the same
BF16-rounded weights. The runtime's relative L2 error is about 1-2% (the HF model in
BF16 is 0.6-0.9% off its float32 run; the interpreter truncates where the GPU rounds),
so the tolerance is 3%. Each family feature (window, q/k norm, biases, soft-capping,
GELU-tanh, scaled embeddings, Gemma's extra norms, per-layer-type RoPE) moves HF's
logits by more than twice that: a runtime lacking one would fail.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import warnings

import pytest
import torch

pytest.importorskip("triton")  # the dev extra installs it on Linux x86_64 only
import transformers  # noqa: E402  (a hard dependency: its absence must fail, not skip)

from advisor.energy.runtime import DecoderDims  # noqa: E402
from advisor.errors import SetupError, UnsupportedError  # noqa: E402
from advisor.testing import DENSE_FAMILIES  # noqa: E402

TOL = 3e-2
VOCAB, SEQ, WINDOW = 96, 12, 4
_BASE = dict(vocab_size=VOCAB, intermediate_size=96, num_hidden_layers=2, max_position_embeddings=64,
             initializer_range=0.05, pad_token_id=0, bos_token_id=1, eos_token_id=2, num_attention_heads=2,
             num_key_value_heads=1)
_GEMMA_TEXT = dict(_BASE, hidden_size=128, head_dim=256, sliding_window=WINDOW)


def _config(family: str):
    t = transformers
    make = {
        "llama": lambda: t.LlamaConfig(**_BASE, hidden_size=128, head_dim=64),
        "mistral": lambda: t.MistralConfig(**_BASE, hidden_size=160, head_dim=80, sliding_window=WINDOW),
        "qwen2": lambda: t.Qwen2Config(**_BASE, hidden_size=192),  # head_dim 96, q/k/v biases
        "qwen3": lambda: t.Qwen3Config(**_BASE, hidden_size=128, head_dim=128),
        "gemma2": lambda: t.Gemma2Config(**_GEMMA_TEXT, query_pre_attn_scalar=64, attn_logit_softcapping=0.5,
                                         final_logit_softcapping=0.5),
        "gemma3_text": lambda: t.Gemma3TextConfig(
            **_GEMMA_TEXT, layer_types=["sliding_attention", "full_attention"],
            # local RoPE far from the global one, so that mixing them up shows within 12 positions
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                             "full_attention": {"rope_type": "default", "rope_theta": 1e6}}),
        "gemma3": lambda: t.Gemma3Config(
            text_config=dict(_GEMMA_TEXT, head_dim=64, layer_types=["sliding_attention", "full_attention"]),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                               image_size=28, patch_size=14),
            mm_tokens_per_image=4, image_token_index=VOCAB - 1, boi_token_index=VOCAB - 3, eoi_token_index=VOCAB - 2),
        "phi3": lambda: t.Phi3Config(**_BASE, hidden_size=192, sliding_window=WINDOW),  # head_dim 96
    }
    return make[family]()


FAMILIES = DENSE_FAMILIES


@pytest.fixture(scope="module", autouse=True)
def _interpreter():
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU, and triton was imported before TRITON_INTERPRET=1 could be set (see conftest.py)")


@functools.cache
def _hf_model(family: str):
    """The tiny HF model (BF16, eager attention) with non-trivial norms and biases, and its tokens."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(_config(family), attn_implementation="eager")
    model = model.to(torch.bfloat16).eval()
    gemma = family.startswith("gemma")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # Gemma scales by 1 + w
                p.uniform_(-0.5, 0.5) if gemma else p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.5)
    tokens = torch.randint(3, VOCAB - 3, (2, SEQ), generator=torch.Generator().manual_seed(1))
    return model, tokens


def _f32_logits(model, tokens) -> torch.Tensor:
    with torch.no_grad():
        return copy.deepcopy(model).float()(tokens).logits.float()


def _runtime_logits(model, tokens, dims: DecoderDims | None = None, decode_attention: str = "triton"):
    from advisor.energy.runtime import DecoderRuntime, DecoderWeights

    w = DecoderWeights.from_hf(model, max_pos=SEQ + 4, device="cpu", dims=dims)
    rt = DecoderRuntime(w, {}, decode_attention=decode_attention)
    rt.allocate_cache(tokens.shape[0], SEQ + 4)
    with torch.no_grad():
        prefill = rt.forward(tokens[:, :-1], 0)
        decode = rt.forward(tokens[:, -1:], SEQ - 1)
    return rt, prefill, decode


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("family", FAMILIES)
def test_runtime_decoder_matches_the_hf_model(family):
    model, tokens = _hf_model(family)
    ref = _f32_logits(model, tokens)
    rt, prefill, decode = _runtime_logits(model, tokens)
    errs = {"prefill": _rel(prefill, ref[:, -2]), "decode": _rel(decode, ref[:, -1])}
    print(family, errs)
    assert max(errs.values()) < TOL, errs
    for layer, k in zip(rt.dims.layers, rt.k_cache, strict=True):  # windowed layers keep only their window
        assert k.shape[2] == (WINDOW if layer.attention.sliding_window else SEQ + 4)


@pytest.mark.parametrize("family,variant", [("mistral", "sdpa"), ("gemma2", "bmm")])
def test_eager_decode_variants_read_the_ring_cache_too(family, variant):
    """The benchmarks' eager decode attention (PyTorch) on windowed layers: ring slots, soft-capping."""
    model, tokens = _hf_model(family)
    ref = _f32_logits(model, tokens)
    _, _, decode = _runtime_logits(model, tokens, decode_attention=variant)
    assert _rel(decode, ref[:, -1]) < TOL


def _without(layers_attr: str, value):
    def mutate(model):
        for layer in _text_layers(model):
            setattr(layer.self_attn, layers_attr, value)
    return mutate


def _text_layers(model):
    return model.model.language_model.layers if hasattr(model.model, "language_model") else model.model.layers


def _no_window(model):
    model.config.get_text_config().sliding_window = 10**6


def _silu_mlp(model):
    for layer in _text_layers(model):
        layer.mlp.act_fn = torch.nn.SiLU()


def _no_post_norms(model):
    for layer in _text_layers(model):
        layer.post_attention_layernorm = layer.post_feedforward_layernorm = torch.nn.Identity()


def _no_qkv_bias(model):
    for layer in _text_layers(model):
        for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            m.bias.data.zero_()


def _one_rope(model):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    cfg = model.config
    cfg.rope_parameters["sliding_attention"] = dict(cfg.rope_parameters["full_attention"])
    model.model.rotary_emb = Gemma3RotaryEmbedding(cfg)


FEATURES = {
    ("mistral", "sliding window"): _no_window,
    ("phi3", "sliding window"): _no_window,
    ("gemma3_text", "sliding window"): _no_window,
    ("qwen2", "q/k/v biases"): _no_qkv_bias,
    ("qwen3", "q/k RMSNorm"): lambda m: (_without("q_norm", torch.nn.Identity())(m),
                                         _without("k_norm", torch.nn.Identity())(m)),
    ("gemma2", "score soft-capping"): _without("attn_logit_softcapping", None),
    ("gemma2", "final soft-capping"): lambda m: setattr(m.config, "final_logit_softcapping", None),
    ("gemma2", "query_pre_attn_scalar"): _without("scaling", 256**-0.5),
    ("gemma3_text", "GELU-tanh"): _silu_mlp,
    ("gemma3_text", "scaled embedding"): lambda m: m.model.embed_tokens.embed_scale.fill_(1.0),
    ("gemma3_text", "post-attention/MLP norms"): _no_post_norms,
    ("gemma3_text", "RoPE per layer type"): _one_rope,
}


@pytest.mark.parametrize("family,feature", list(FEATURES), ids=[f"{f}-{x}" for f, x in FEATURES])
def test_each_family_feature_moves_the_logits_beyond_the_tolerance(family, feature):
    """Without the feature, HF's logits move > 2 x TOL: a runtime lacking it would fail the test above."""
    model, tokens = _hf_model(family)
    ref = _f32_logits(model, tokens)
    changed = copy.deepcopy(model).float()
    with torch.no_grad():
        FEATURES[(family, feature)](changed)
        moved = changed(tokens).logits.float()
    assert _rel(moved[:, -2:], ref[:, -2:]) > 2 * TOL


def test_trained_model_with_head_dim_16_runs_and_matches(tiny_model_dir):
    """tinystories-656k: head_dim 16 (below tl.dot's 16 per half) runs in padded tiles."""
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).eval()
    assert model.config.hidden_size // model.config.num_attention_heads == 16
    tokens = torch.randint(3, model.config.vocab_size, (1, SEQ), generator=torch.Generator().manual_seed(2))
    ref = _f32_logits(model, tokens)
    _, prefill, decode = _runtime_logits(model, tokens)
    assert _rel(prefill, ref[:, -2]) < TOL and _rel(decode, ref[:, -1]) < TOL


def test_unrunnable_variants_are_refused_with_the_reason():
    t = transformers
    small = dict(_BASE, hidden_size=64)
    mixtral = t.MixtralConfig(**dict(small, intermediate_size=32), num_local_experts=4, num_experts_per_tok=2)
    assert DecoderDims.from_config(mixtral).is_moe  # routed experts run (tests/test_runtime_moe.py)
    with pytest.raises(UnsupportedError, match="partial rotary"):
        DecoderDims.from_config(t.Phi3Config(**small, partial_rotary_factor=0.75))
    with pytest.raises(UnsupportedError, match="activation 'gelu'"):
        DecoderDims.from_config(t.LlamaConfig(**dict(small, hidden_act="gelu")))
    with pytest.raises(UnsupportedError, match="head_dim 512"):
        DecoderDims.from_config(t.Qwen3Config(**small, head_dim=512))

    from advisor.models.adapters import model_shape

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        moe_model = t.AutoModelForCausalLM.from_config(mixtral)
    with pytest.raises(UnsupportedError, match="dense decoder layers"):  # a stand-in needs the config for MoE
        DecoderDims.from_shape(model_shape(moe_model))


def test_measured_energy_refuses_an_unrunnable_model_before_looking_for_a_gpu():
    from advisor.energy.measure import MeasuredEnergyModel
    from advisor.models.shape import llama_shape

    cfg = transformers.Phi3Config(**dict(_BASE, hidden_size=64), partial_rotary_factor=0.75)
    with pytest.raises(UnsupportedError, match="partial rotary"):
        MeasuredEnergyModel(llama_shape("model.layers", 2, 64, 96, 2, 1, VOCAB), model_config=cfg)


def test_shared_expert_layers_reach_the_runtime_dims():
    cfg = transformers.Qwen2MoeConfig(**dict(_BASE, hidden_size=64), num_experts=4, num_experts_per_tok=2,
                                      moe_intermediate_size=32, shared_expert_intermediate_size=48)
    dims = DecoderDims.from_config(cfg)
    assert all(la.moe is not None and la.shared_intermediate == 48 for la in dims.layers)
    assert dims.layers[0].attention.qkv_bias and not dims.layers[0].attention.o_bias  # Qwen2: q, k, v only


def test_routed_expert_layers_reach_the_runtime_dims():
    cfg = transformers.Qwen3MoeConfig(**dict(_BASE, hidden_size=64), num_experts=4, num_experts_per_tok=2,
                                      moe_intermediate_size=32, norm_topk_prob=True)
    dims = DecoderDims.from_config(cfg)
    assert dims.is_moe and all(la.moe is not None and la.intermediate == 0 for la in dims.layers)
    assert (dims.layers[0].moe.num_experts, dims.layers[0].moe.top_k, dims.layers[0].moe.intermediate) == (4, 2, 32)
    assert dims.layers[0].attention.qk_norm


def test_geometry_reaches_the_runtime_dims():
    dims = DecoderDims.from_config(_config("gemma3_text"))
    a0, a1 = (la.attention for la in dims.layers)
    assert (a0.sliding_window, a1.sliding_window) == (WINDOW, None)
    assert (a0.rope, a1.rope) == ("sliding_attention", "full_attention")
    assert a0.qk_norm and dims.gemma_norms and dims.layers[0].norms == 4 and dims.layers[0].activation == "gelu_tanh"
    assert dims.embed_scale == 128**0.5 and dims.tied_embeddings
    # the KV a decode step reads: the window on the sliding layer, everything on the global one
    per_token = 2 * 1 * 256 * 2
    assert dims.kv_bytes(batch=3, context=100) == 3 * per_token * (WINDOW + 100)
    q2 = DecoderDims.from_config(_config("qwen2")).layers[0].attention
    assert q2.qkv_bias and not q2.o_bias and q2.head_dim == 96
    assert DecoderDims.from_config(_config("gemma2")).layers[0].attention.scale == 64**-0.5
    assert dims.with_layers(1).num_layers == 1 and dims.with_layers(1).config.num_hidden_layers == 1


def test_rope_tables_grow_to_the_longest_workload_and_the_cache_bounds_are_checked():
    from advisor.energy.runtime import DecoderRuntime, DecoderWeights, rope_tables

    dims = DecoderDims.from_config(_config("qwen3"))
    w = DecoderWeights.random(dims, max_pos=16, device="cpu")
    rt = DecoderRuntime(w, {})
    rt.allocate_cache(1, 40)  # a later, longer workload
    assert w.max_pos == 40
    cos, sin = w.rope["default"]
    ref_cos, ref_sin = rope_tables(dims, 40, "cpu")["default"]
    assert cos.shape == (40, 64) and torch.equal(cos, ref_cos) and torch.equal(sin, ref_sin)
    with pytest.raises(SetupError, match="exceeds the allocated cache"):
        rt.forward(torch.zeros(1, 1, dtype=torch.long), 40)


def test_plan_keys_with_a_stack_prefix_map_to_runtime_groups():
    from advisor.energy.runtime import group_formats
    from advisor.formats import Format

    fmts = group_formats({"model.language_model.layers.1.o": Format.FP8, "layers.0.qkv": "fp8"}, 2)
    assert fmts["1.o"] == Format.FP8 and fmts["0.qkv"] == Format.FP8 and fmts["1.qkv"] == Format.BF16
    with pytest.raises(SetupError, match="not a group"):
        group_formats({"model.layers.0.experts_gate_up": Format.FP8}, 2)


def test_dims_edits_keep_the_rest_of_the_model():
    dims = DecoderDims.from_config(_config("mistral"))
    flat = dataclasses.replace(dims, layers=dims.layers[:1])
    assert flat.family == "Mistral" and flat.layers[0].attention.head_dim == 80
    assert DecoderDims.llama31_8b().summary()["intermediate"] == 14336


@pytest.mark.parametrize("start,length", [(0, 9), (5, 4), (20, 1)])
@pytest.mark.parametrize("window,softcap,eager", [(None, None, False), (3, None, False), (3, 0.7, False),
                                                  (None, None, True)])
def test_prefill_and_decode_attention_in_torch_match_a_masked_softmax(start, length, window, softcap, eager):
    from advisor.energy.runtime import AttentionSpec, attention_over_cache

    g = torch.Generator().manual_seed(start + length)
    h, kv, d, ctx = 4, 2, 16, start + length
    q = torch.randn(2, h, length, d, generator=g)
    kc, vc = torch.randn(2, kv, 32, d, generator=g), torch.randn(2, kv, 32, d, generator=g)
    spec = AttentionSpec(h, kv, d, sliding_window=window, softcap=softcap)
    out = attention_over_cache(q, kc, vc, start, spec, eager=eager)
    k, v = kc[:, :, :ctx].repeat_interleave(2, 1), vc[:, :, :ctx].repeat_interleave(2, 1)
    scores = q @ k.transpose(-1, -2)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    qp, kp = torch.arange(start, ctx)[:, None], torch.arange(ctx)[None, :]
    allowed = (kp <= qp) & (kp > qp - (window or ctx + 1))
    ref = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
