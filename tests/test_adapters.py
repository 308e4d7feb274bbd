"""Architecture adapters on tiny random-weight models of every supported family (CPU, no downloads)."""

from __future__ import annotations

import contextlib
import fnmatch
import io
import json
import sys
import warnings

import pytest
import torch

from advisor.models import adapters as A
from advisor.quantize.modelopt_config import prepare_device
from advisor.testing import DENSE_FAMILIES, FAMILIES, random_model, tiny_config
from advisor.testing import MOE_FAMILIES as MOE

STACK = {f: "model.language_model.layers" if f == "gemma3" else "model.layers" for f in FAMILIES}


def build(family: str, seed: int = 0):
    return random_model(tiny_config(family), seed)


@pytest.fixture(scope="module")
def models():
    return {f: build(f) for f in FAMILIES}


@pytest.fixture(scope="module")
def infos(models):
    return {f: A.group_infos(m) for f, m in models.items()}


# ----------------------------------------------------------------------------- registry


def test_module_imports_no_torch():
    import subprocess

    code = (f"import importlib, sys; importlib.import_module({A.__name__!r}); "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=A.__file__.rsplit("/", 1)[0])


def test_registry_keys_are_text_model_types():
    assert set(A.SUPPORTED_MODEL_TYPES) == {"llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3",
                                            "mixtral", "qwen3_moe", "qwen2_moe"}
    for f in FAMILIES:
        cfg = tiny_config(f)
        assert A.adapter_for(cfg).model_type == cfg.get_text_config().model_type


def test_gemma3_wrapper_resolves_to_text_adapter_and_language_model_stack():
    cfg = tiny_config("gemma3")
    assert cfg.model_type == "gemma3" and cfg.get_text_config().model_type == "gemma3_text"
    ad = A.adapter_for(cfg)
    assert ad is A.ADAPTERS["gemma3_text"]
    assert ad.stack_for("gemma3").layers == "model.language_model.layers"
    assert ad.stack_for("gemma3_text").layers == "model.layers"


@pytest.mark.parametrize("model_type", ["bert", "gpt2", "t5"])
def test_unsupported_model_type_names_type_and_supported_list(model_type):
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type)
    with pytest.raises(A.UnsupportedArchitectureError) as e:
        A.adapter_for(cfg)
    msg = str(e.value)
    assert repr(model_type) in msg and all(t in msg for t in A.SUPPORTED_MODEL_TYPES)
    assert e.value.exit_code == 2  # a bad model, like any other input (README, "Exit codes")


def test_non_causal_lm_is_refused():
    from transformers import LlamaForSequenceClassification, LlamaModel

    cfg = tiny_config("llama")
    cfg.architectures = ["LlamaForSequenceClassification"]
    with pytest.raises(A.UnsupportedArchitectureError, match="not a decoder-only causal LM"):
        A.adapter_for(cfg)
    cfg = tiny_config("llama")
    torch.manual_seed(0)
    for cls in (LlamaModel, LlamaForSequenceClassification):
        with pytest.raises(A.UnsupportedArchitectureError, match="is not a causal LM"):
            A.group_infos(cls(cfg))


def test_unknown_wrapper_of_known_text_model_is_refused():
    cfg = tiny_config("gemma3")
    ad = A.adapter_for(cfg)
    with pytest.raises(A.UnsupportedArchitectureError, match="wrappers"):
        ad.stack_for("paligemma")


# ----------------------------------------------------------------------------- geometry


def test_geometry_dense_families():
    g = {f: A.layer_geometry(tiny_config(f)) for f in FAMILIES}
    assert g["llama"][0].head_dim == 16 and g["qwen3"][0].head_dim == 32 and g["gemma3"][0].head_dim == 32
    assert all(len(v) == 2 for v in g.values())
    assert g["qwen2"][0].qkv_bias and not g["llama"][0].qkv_bias and not g["qwen3"][0].qkv_bias
    assert g["qwen2_moe"][0].qkv_bias
    assert [f for f in FAMILIES if g[f][0].qk_norm] == ["qwen3", "gemma3_text", "gemma3", "qwen3_moe"]
    assert {f: g[f][0].activation for f in ("llama", "gemma2", "gemma3")} == {
        "llama": "silu", "gemma2": "gelu_pytorch_tanh", "gemma3": "gelu_pytorch_tanh"}
    assert {f: g[f][0].norms for f in ("llama", "phi3", "gemma2", "gemma3_text")} == {
        "llama": 2, "phi3": 2, "gemma2": 4, "gemma3_text": 4}
    assert [x.sliding_window for x in g["mistral"]] == [8, 8]
    assert [x.sliding_window for x in g["llama"]] == [None, None]
    assert [x.sliding_window for x in g["gemma2"]] == [8, None]  # local, global alternate


def test_geometry_sliding_window_patterns():
    from transformers import Gemma2Config, Gemma3Config, Gemma3TextConfig, Qwen2Config

    g3 = A.layer_geometry(Gemma3TextConfig(num_hidden_layers=12, sliding_window=512))
    assert [i for i, x in enumerate(g3) if x.sliding_window is None] == [5, 11]  # 5 local : 1 global
    assert all(x.sliding_window == 512 for x in g3 if x.index not in (5, 11))
    wrapped = A.layer_geometry(Gemma3Config(text_config=dict(num_hidden_layers=12, sliding_window=512)))
    assert [x.sliding_window for x in wrapped] == [x.sliding_window for x in g3]
    g2 = A.layer_geometry(Gemma2Config(num_hidden_layers=4, sliding_window=256))
    assert [x.sliding_window for x in g2] == [256, None, 256, None]
    q = A.layer_geometry(Qwen2Config(num_hidden_layers=4, use_sliding_window=True, sliding_window=64,
                                     max_window_layers=2))
    assert [x.sliding_window for x in q] == [None, None, 64, 64]
    assert all(x.sliding_window is None for x in A.layer_geometry(Qwen2Config(num_hidden_layers=3)))


def test_geometry_sliding_fallback_without_layer_types():
    """Configs from before transformers had layer_types: the adapter's Gemma pattern applies."""
    from types import SimpleNamespace

    base = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
                vocab_size=128, sliding_window=32, hidden_activation="gelu_pytorch_tanh")
    cfg = SimpleNamespace(model_type="gemma3_text", num_hidden_layers=7, sliding_window_pattern=6, **base)
    assert [x.sliding_window for x in A.layer_geometry(cfg)] == [32] * 5 + [None, 32]
    cfg2 = SimpleNamespace(model_type="gemma2", num_hidden_layers=3, **base)
    assert [x.sliding_window for x in A.layer_geometry(cfg2)] == [32, None, 32]


def test_geometry_moe_and_tied_embeddings():
    mix, q3, q2 = (A.layer_geometry(tiny_config(f)) for f in MOE)
    assert (mix[0].num_experts, mix[0].top_k, mix[0].moe_intermediate) == (4, 2, 32)
    assert [x.is_moe for x in q3] == [True, False]  # mlp_only_layers=[1]
    assert q3[1].intermediate == 96 and q3[0].intermediate == 0
    assert (q2[0].num_experts, q2[0].moe_intermediate, q2[0].shared_expert_intermediate) == (4, 32, 48)
    tied = {f: A.text_geometry(tiny_config(f)).tied_embeddings for f in FAMILIES}
    assert {f for f, t in tied.items() if t} == {"gemma2", "gemma3_text", "gemma3"}
    geo = A.text_geometry(tiny_config("gemma3"))
    assert (geo.outer_model_type, geo.model_type, geo.vocab, geo.hidden) == ("gemma3", "gemma3_text", 256, 64)


def test_kv_bytes_caps_sliding_layers():
    geo = A.text_geometry(tiny_config("gemma2"))  # layer 0 window 8, layer 1 global; kv 2 x 32
    per_tok = 2 * 2 * 32 * 2.0
    assert geo.kv_bytes(100) == per_tok * (8 + 100)


# ----------------------------------------------------------------------------- groups


@pytest.mark.parametrize("family", FAMILIES)
def test_groups_match_config_geometry(family, infos):
    got = {gi.name: gi.group.shapes for gi in infos[family]}
    assert got == A.expected_group_shapes(tiny_config(family))


@pytest.mark.parametrize("family", FAMILIES)
def test_groups_stay_in_one_stack_and_layer(family, models, infos):
    stack = STACK[family]
    names = [gi.name for gi in infos[family]]
    assert len(names) == len(set(names))
    members = [m for gi in infos[family] for m in gi.group.members]
    assert len(members) == len(set(members))
    for gi in infos[family]:
        assert gi.stack == stack and gi.name == f"layers.{gi.layer}.{gi.kind}"
        for m in gi.group.members:
            assert m.startswith(f"{stack}.{gi.layer}.")
    model = models[family]
    for gi in infos[family]:
        for m in gi.group.members:
            if gi.layout == "linear":
                assert isinstance(model.get_submodule(m), torch.nn.Linear)
            else:
                owner, _, p = m.rpartition(".")
                assert getattr(model.get_submodule(owner), p).dim() == 3


@pytest.mark.parametrize("family", FAMILIES)
def test_never_quantized_modules_never_in_groups(family, models, infos):
    model = models[family]
    ad = A.adapter_for(model.config)
    members = {m for gi in infos[family] for m in gi.group.members}
    for m in members:
        assert not ad.is_never_quantized(m, model.config.model_type), m
        assert not any(s in m for s in ("vision", "multi_modal", "lm_head", "embed", "norm", "router"))
        assert not m.endswith((".gate", "shared_expert_gate")), m
    # every linear outside the groups is declared never-quantized: lm_head, routers, vision
    outside = {n for n, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)} - members
    assert all(ad.is_never_quantized(n, model.config.model_type) for n in outside)
    assert "lm_head" in outside


def test_gemma3_vision_linears_have_layer_like_names_but_stay_out(models, infos):
    model = models["gemma3"]
    vision_qkv = [n for n, _ in model.named_modules() if fnmatch.fnmatch(n, "*vision_tower*.layers.0.self_attn.q_proj")]
    assert vision_qkv, "the tiny SigLIP tower has layers.N.self_attn.q_proj: a naive .layers. regex would match it"
    members = {m for gi in infos["gemma3"] for m in gi.group.members}
    assert not any("vision" in m for m in members)
    assert {gi.stack for gi in infos["gemma3"]} == {"model.language_model.layers"}


def test_kinds_per_family(infos):
    kinds = {f: sorted({gi.kind for gi in v}) for f, v in infos.items()}
    dense = sorted(["qkv", "o", "gate_up", "down"])
    for f in DENSE_FAMILIES:
        assert kinds[f] == dense
    assert kinds["mixtral"] == sorted(["qkv", "o", "experts"])
    assert kinds["qwen3_moe"] == sorted(dense + ["experts"])  # layer 1 dense
    assert kinds["qwen2_moe"] == sorted(["qkv", "o", "shared_gate_up", "shared_down", "experts"])


def test_phi3_prefused_members(infos):
    g = {gi.kind: gi.group for gi in infos["phi3"] if gi.layer == 0}
    assert g["qkv"].members == ("model.layers.0.self_attn.qkv_proj",)
    assert g["gate_up"].members == ("model.layers.0.mlp.gate_up_proj",)
    assert g["qkv"].shapes == ((64, 64 + 2 * 32),) and g["gate_up"].shapes == ((64, 2 * 96),)


@pytest.mark.parametrize("family", MOE)
def test_moe_groups(family, models, infos):
    model = models[family]
    ad = A.adapter_for(model.config)
    experts = [gi for gi in infos[family] if gi.kind in A.ROUTED_KINDS]
    assert [gi.layer for gi in experts] == ([0] if family == "qwen3_moe" else [0, 1])
    for gi in infos[family]:
        if gi.kind in A.ROUTED_KINDS:  # gate/up and down of every expert: one group, one module
            stem = f"{STACK[family]}.{gi.layer}.mlp.experts"
            assert gi.layout == "fused_experts"
            assert gi.group.members == (f"{stem}.gate_up_proj", f"{stem}.down_proj")
            assert gi.modules == (stem,)
            assert (gi.num_experts, gi.top_k, gi.active_fraction) == (4, 2, 0.5)
            assert gi.quantizers == tuple(f"{m}_{q}_quantizer" for m in gi.group.members for q in ("weight", "input"))
            assert not gi.members_share_input
        else:
            assert gi.active_fraction == 1.0 and gi.modules == gi.group.members
    routers = [n for n, _ in model.named_modules() if ad.is_router(n)]
    assert routers and all(n.endswith(("mlp.gate", "shared_expert_gate")) for n in routers)


def test_transformers4_per_expert_layout_is_grouped():
    """A transformers-4 style Mixtral layer (experts as a ModuleList of w1/w2/w3) groups per layer."""
    model = build("mixtral")
    for layer in model.model.layers:
        experts = torch.nn.ModuleList()
        for _ in range(4):
            e = torch.nn.Module()
            e.w1, e.w3, e.w2 = torch.nn.Linear(64, 32), torch.nn.Linear(64, 32), torch.nn.Linear(32, 64)
            experts.append(e)
        moe = torch.nn.Module()
        moe.gate, moe.experts = torch.nn.Linear(64, 4, bias=False), experts
        del layer.mlp
        layer.block_sparse_moe = moe
    infos = A.group_infos(model)
    ex = next(gi for gi in infos if gi.name == "layers.0.experts")
    assert ex.layout == "linear" and len(ex.group.members) == 12 and ex.group.num_weights == 4 * 3 * 64 * 32
    assert ex.group.members[:3] == ("model.layers.0.block_sparse_moe.experts.0.w1",
                                    "model.layers.0.block_sparse_moe.experts.0.w3",
                                    "model.layers.0.block_sparse_moe.experts.0.w2")
    assert not ex.members_share_input  # NVFP4 scales are not tied across experts
    assert not any(m.endswith("gate") for gi in infos for m in gi.group.members)


def test_unplaced_linear_is_refused():
    model = build("llama")
    model.model.layers[0].mlp.extra_proj = torch.nn.Linear(64, 64)
    with pytest.raises(A.UnsupportedArchitectureError, match="extra_proj"):
        A.group_infos(model)


def test_short_names_and_model_shape(models):
    g = A.discover_groups(models["llama"])
    assert [x.name for x in g[:4]] == ["layers.0.qkv", "layers.0.o", "layers.0.gate_up", "layers.0.down"]
    shape = A.model_shape(models["gemma3"])
    assert shape.num_layers == 2 and shape.head_dim == 32 and shape.vocab_size == 256
    assert shape.groups[0].name == "layers.0.qkv"
    assert shape.groups[0].members[0] == "model.language_model.layers.0.self_attn.q_proj"
    assert (shape.model_type, shape.outer_model_type, shape.searches_text_tower_only) == ("gemma3_text", "gemma3", True)
    assert [x.sliding_window for x in shape.layers] == [8, 8]


# ----------------------------------------------------------------------------- ModelOpt


def _quantizer_cfgs():
    import modelopt.torch.quantization as mtq

    out = {}
    for fmt, preset in (("fp8", mtq.FP8_DEFAULT_CFG),):
        found = {e["quantizer_name"].lstrip("*"): e["cfg"] for e in preset["quant_cfg"]
                 if e.get("quantizer_name") in ("*weight_quantizer", "*input_quantizer") and "cfg" in e}
        assert set(found) == {"weight_quantizer", "input_quantizer"}
        out[fmt] = found
    return out


def _plan(infos):
    """Mixed plan: layer 0 qkv/gate_up-ish groups and experts FP8, layer 1 down-ish groups FP8, the rest BF16."""
    fp8 = {0: {"qkv", "gate_up", "shared_down", "experts"}, 1: {"down", "shared_gate_up"}}
    return {gi.name: "fp8" if gi.kind in fp8.get(gi.layer, ()) else "bf16" for gi in infos}


def _quantize(model, infos, plan, ids):
    import modelopt.torch.quantization as mtq

    cfg = {"quant_cfg": A.quant_cfg_entries(infos, plan, _quantizer_cfgs()), "algorithm": "max"}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        return mtq.quantize(model, cfg, lambda m: m(ids))


def _enabled_quantizers(model):
    from modelopt.torch.quantization.nn import TensorQuantizer

    return {n for n, m in model.named_modules() if isinstance(m, TensorQuantizer) and m.is_enabled}


def _normalize(name):
    import re

    return re.sub(r"(weight_quantizer|input_quantizer)s\.\d+$", r"\1", name)


@pytest.mark.parametrize("family", FAMILIES)
def test_modelopt_fp8_mixed_plan_quantize_and_forward(family):
    model = build(family)
    infos = A.group_infos(model)
    ad = A.adapter_for(model.config)
    plan = _plan(infos)
    assert set(plan.values()) == {"fp8", "bf16"}
    ids = torch.randint(3, 120, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits.float()
    q = _quantize(model, infos, plan, ids)
    on = _enabled_quantizers(q)
    want = {n for gi in infos if plan[gi.name] == "fp8" for n in gi.quantizers}
    assert {_normalize(n) for n in on} == want  # exactly the planned ones, no output/KV quantizers
    for n in on:
        owner = n.rsplit(".", 1)[0]
        assert not ad.is_never_quantized(owner, model.config.model_type) and not ad.is_router(owner)
        assert "vision" not in n and "lm_head" not in n
    if family in MOE:  # per-expert weight quantizers, all calibrated
        per_expert = [n for n in on if "_weight_quantizers." in n]
        fp8_experts = sum(len(gi.group.members) for gi in infos
                          if gi.layout == "fused_experts" and plan[gi.name] == "fp8")
        assert len(per_expert) == 4 * fp8_experts
        assert all(q.get_submodule(n).amax is not None for n in on)
    with torch.no_grad():
        out = q(ids).logits.float()
    assert torch.isfinite(out).all()
    assert 0 < (out - ref).abs().max() < 1.0


def _excluded(module: str, patterns) -> bool:
    """Engines match exclude_modules at their module granularity: a pattern may name the module or a
    parent (ModelOpt lists a whole BF16 fused-experts module as ``model.layers.1.mlp.experts``)."""
    parts = module.split(".")
    return any(fnmatch.fnmatch(".".join(parts[:i]), p) for i in range(1, len(parts) + 1) for p in patterns)


@pytest.mark.parametrize("family", ["llama", "phi3", "gemma3", "mixtral", "qwen2_moe"])
def test_modelopt_export_names_and_exclusions(family, tmp_path):
    """export_hf_checkpoint: FP8 + exclude_modules; the adapter's exported names are the file's."""
    from modelopt.torch.export import export_hf_checkpoint
    from safetensors.torch import load_file

    model = build(family)
    infos = A.group_infos(model)
    plan = _plan(infos)
    ids = torch.randint(3, 120, (2, 16), generator=torch.Generator().manual_seed(1))
    q = _quantize(model, infos, plan, ids)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        export_hf_checkpoint(q, export_dir=tmp_path)
    hq = json.loads((tmp_path / "hf_quant_config.json").read_text())["quantization"]
    assert hq["quant_algo"] == "FP8" and hq["kv_cache_quant_algo"] is None and "quantized_layers" not in hq
    excluded = hq["exclude_modules"]
    tensors = {}
    for f in tmp_path.glob("*.safetensors"):
        tensors.update(load_file(str(f)))
    for gi in infos:
        for name in gi.exported:
            w = tensors[f"{name}.weight"]
            is_excluded = _excluded(name, excluded)
            if plan[gi.name] == "fp8":
                assert w.dtype == torch.float8_e4m3fn and f"{name}.weight_scale" in tensors
                assert f"{name}.input_scale" in tensors and not is_excluded, name
            else:
                assert w.dtype == torch.bfloat16 and is_excluded, name
    if family == "gemma3":
        assert any(p.startswith("vision_tower") for p in excluded)
        assert not any(k.startswith("model.") for k in tensors)  # legacy layout: language_model.model.*
    if family in MOE:  # routers: written BF16 and listed as excluded
        gates = [k.removesuffix(".weight") for k in tensors if k.endswith((".mlp.gate.weight", ".gate.weight"))]
        assert len(gates) == 2
        for g in gates:
            assert tensors[f"{g}.weight"].dtype == torch.bfloat16
            assert _excluded(g, excluded), g


def test_modelopt_export_of_split_expert_formats_is_inconsistent(tmp_path):
    """Why gate/up and down of a layer's experts are one group: ModelOpt 0.47 excludes a fused-experts
    module only as a whole, so BF16 down experts next to FP8 gate/up experts are written BF16 but NOT
    excluded. (Fused-MoE kernels also take one quantization mode per layer.)"""
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    from safetensors.torch import load_file

    model = build("qwen3_moe")
    infos = A.group_infos(model)
    plan = {gi.name: "fp8" if gi.kind in ("qkv", "experts") else "bf16" for gi in infos}
    entries = [e for e in A.quant_cfg_entries(infos, plan, _quantizer_cfgs()) if "down_proj" not in e["quantizer_name"]]
    ids = torch.randint(3, 120, (2, 16), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        q = mtq.quantize(model, {"quant_cfg": entries, "algorithm": "max"}, lambda m: m(ids))
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        export_hf_checkpoint(q, export_dir=tmp_path)
    excluded = json.loads((tmp_path / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    tensors = load_file(str(tmp_path / "model.safetensors"))
    down = "model.layers.0.mlp.experts.0.down_proj"
    assert tensors[f"{down}.weight"].dtype == torch.bfloat16
    assert not _excluded(down, excluded)


def test_transformers_reload_ignores_modelopt_scales(tmp_path):
    """transformers 5.23 has no quantizer for quant_method 'modelopt': from_pretrained warns, skips
    quantization and loads the FP8 codes as BF16 values without their scales (wrong weights)."""
    from modelopt.torch.export import export_hf_checkpoint
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = build("llama")
    infos = A.group_infos(model)
    plan = _plan(infos)
    ids = torch.randint(3, 120, (2, 16), generator=torch.Generator().manual_seed(1))
    q = _quantize(model, infos, plan, ids)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        export_hf_checkpoint(q, export_dir=tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    name = "model.layers.0.self_attn.q_proj"
    codes = tensors[f"{name}.weight"].to(torch.bfloat16)
    deq = (tensors[f"{name}.weight"].float() * tensors[f"{name}.weight_scale"]).to(torch.bfloat16)
    got = r.get_submodule(name).weight
    assert torch.equal(got, codes) and not torch.equal(got, deq)


def test_fits_project_plan_and_formats(models):
    from advisor.formats import Format
    from advisor.plan import Plan

    infos = A.group_infos(models["qwen2_moe"])
    groups = [gi.group for gi in infos]
    plan = Plan.uniform(groups, Format.FP8)
    plan.check_against(groups)
    assert 8 <= plan.effective_bits(groups) < 9
    entries = A.quant_cfg_entries(infos, plan.formats, _quantizer_cfgs())
    assert entries[0] == {"quantizer_name": "*", "enable": False}
    assert len(entries) == 1 + sum(len(gi.quantizers) for gi in infos)


def test_modelopt_fp8_nvfp4_plan_exports_mixed_precision_per_module(tmp_path):
    """FP8 + NVFP4 gives quant_algo MIXED_PRECISION; a fused-experts module is ONE entry."""
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint

    prepare_device("cpu")
    model = build("qwen2_moe")
    infos = A.group_infos(model)
    kinds = {"qkv": "fp8", "o": "bf16", "shared_gate_up": "fp8", "shared_down": "nvfp4", "experts": "nvfp4"}
    plan = {gi.name: kinds[gi.kind] for gi in infos}
    qc = dict(_quantizer_cfgs())
    qc["nvfp4"] = {e["quantizer_name"].lstrip("*"): e["cfg"] for e in mtq.NVFP4_DEFAULT_CFG["quant_cfg"]
                   if e.get("quantizer_name") in ("*weight_quantizer", "*input_quantizer") and "cfg" in e}
    ids = torch.randint(3, 120, (2, 16), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        q = mtq.quantize(model, {"quant_cfg": A.quant_cfg_entries(infos, plan, qc), "algorithm": "max"},
                         lambda m: m(ids))
        assert torch.isfinite(q(ids).logits).all()
        export_hf_checkpoint(q, export_dir=tmp_path)
    hq = json.loads((tmp_path / "hf_quant_config.json").read_text())["quantization"]
    assert hq["quant_algo"] == "MIXED_PRECISION"
    layers = {k: v["quant_algo"] for k, v in hq["quantized_layers"].items()}
    assert layers["model.layers.0.mlp.experts"] == "NVFP4"  # the module, not experts.{e}.gate_proj
    assert layers["model.layers.0.mlp.shared_expert.down_proj"] == "NVFP4"
    assert layers["model.layers.0.self_attn.q_proj"] == "FP8"
    assert "model.layers.0.self_attn.o_proj" not in layers
    assert not any(k.endswith(("mlp.gate", "shared_expert_gate")) for k in layers)
