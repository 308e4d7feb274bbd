"""A model spread by a memory plan's device map (accelerate's hooks) scores trials exactly as one on one device;
on CPU the two placements are both the CPU, with accelerate's hooks forced on."""

from __future__ import annotations

import torch

from advisor.accuracy.proxy import ProxyEvaluator
from advisor.calibration.tokens import forward_loop
from advisor.formats import Format
from advisor.models.device_map import device_map_for, plan_device_map
from advisor.models.loading import load_model, model_fingerprint
from advisor.models.memory_plan import GIB, Device, RunSizes, plan_memory
from advisor.plan import Plan
from advisor.quantize.bank import FormatBank
from advisor.quantize.modelopt_config import prepare_device
from advisor.recipe.schema import ModelSpec

FORMATS = (Format.BF16, Format.FP8, Format.NVFP4)
SIZES = RunSizes(("bf16", "fp8", "nvfp4"), 4, 32, 2, 32, 2, False)


def _two_device_plan(config):
    """Devices just large enough that the tiny model's two layers go one to each."""
    for memory in range(2 * GIB, 4 * GIB, 2**16):
        plan = plan_memory(config, SIZES, [Device("cuda:0", memory), Device("cuda:1", memory)])
        if plan.fits and len({k for k in plan.device_of().values()}) == 2:
            return plan
    raise AssertionError("no memory splits the tiny model over two devices")


def test_device_map_places_layers_and_the_modules_around_them(tiny_model_dir):
    loaded = load_model(ModelSpec(source=str(tiny_model_dir)))
    got = device_map_for(loaded.model, "model.layers", [0, 1], first=0, last=1)
    assert got == {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "model.norm": 1,
                   "model.rotary_emb": 1, "lm_head": 1}


def test_plan_device_map_covers_every_weight(tiny_model_dir):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model_dir)
    plan = _two_device_plan(config)
    mapping = plan_device_map(config, plan)
    assert set(mapping.values()) == {0, 1}
    loaded = load_model(ModelSpec(source=str(tiny_model_dir)))
    for name, _ in loaded.model.named_parameters():
        assert any(name == k or name.startswith(f"{k}.") for k in mapping), name


def _scores(model, groups, tokens):
    bank = FormatBank(model, groups, FORMATS, forward_loop(tokens[:4]))
    proxy = ProxyEvaluator(bank.assemble(Plan.uniform(groups, Format.BF16)), tokens[4:])
    plans = [Plan.uniform(groups, f) for f in FORMATS[1:]]
    plans.append(Plan({g.name: FORMATS[i % 3] for i, g in enumerate(groups)}))
    out = []
    for plan in plans:
        with torch.no_grad():
            logits = bank.assemble(plan)(input_ids=tokens[4:]).logits
        out.append((proxy.score(bank.assemble(plan)), logits))
    return out


def test_spread_model_gives_the_same_kl_as_one_device(tiny_model_dir, one_torch_thread):
    from accelerate import dispatch_model
    from transformers import AutoConfig

    prepare_device("cpu")
    tokens = torch.randint(3, 2000, (6, 32), generator=torch.Generator().manual_seed(0))
    one = load_model(ModelSpec(source=str(tiny_model_dir)))
    spread = load_model(ModelSpec(source=str(tiny_model_dir)))
    mapping = plan_device_map(AutoConfig.from_pretrained(tiny_model_dir),
                              _two_device_plan(AutoConfig.from_pretrained(tiny_model_dir)))
    model = dispatch_model(spread.model, {k: "cpu" for k in mapping}, force_hooks=True)
    assert hasattr(model.model.layers[1], "_hf_hook")  # accelerate moves each layer's inputs
    for (a, la), (b, lb) in zip(_scores(one.model, one.shape.groups, tokens),
                                _scores(model, spread.shape.groups, tokens), strict=True):
        assert a == b
        assert torch.equal(la, lb)


def test_load_with_a_device_map_reads_the_same_weights(tiny_model_dir):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model_dir)
    mapping = {k: "cpu" for k in plan_device_map(config, _two_device_plan(config))}
    plain = load_model(ModelSpec(source=str(tiny_model_dir)))
    mapped = load_model(ModelSpec(source=str(tiny_model_dir)), device_map=mapping)
    assert model_fingerprint(mapped.model) == model_fingerprint(plain.model)
    assert mapped.shape.groups == plain.shape.groups


def test_a_streaming_plan_maps_its_streamed_layers_to_the_cpu(tiny_model_dir):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model_dir)
    whole = plan_memory(config, SIZES, [Device("cuda:0", 4 * GIB)])
    # a byte short of holding it all: the room for a streamed layer costs what streaming a layer saves
    plan = plan_memory(config, SIZES, [Device("cuda:0", whole.placements[0].used_bytes - 1)], stream=True)
    assert plan.streaming and plan.overflow
    mapping = plan_device_map(config, plan)
    assert [mapping[f"model.layers.{i}"] for i in range(2)] == [
        "cpu" if f"layer {i}" in plan.overflow else 0 for i in range(2)]
    assert mapping["model.embed_tokens"] == 0 and mapping["lm_head"] == 0


def _load_streaming(tiny_model_dir):
    """Layer 1 streamed as a search on a GPU loads it (transformers' device_map: accelerate's dispatch), with the
    CPU as the execution device: named as a torch.device, so that accelerate streams the "cpu" layer."""
    here = torch.device("cpu")
    return load_model(ModelSpec(source=str(tiny_model_dir)), device_map={
        "model.embed_tokens": here, "model.layers.0": here, "model.layers.1": "cpu", "model.norm": here,
        "model.rotary_emb": here, "lm_head": here})


def test_streamed_layers_give_the_same_kl_as_in_memory(tiny_model_dir, one_torch_thread):
    from advisor.quantize.streamed import offload_hook

    prepare_device("cpu")
    tokens = torch.randint(3, 2000, (6, 32), generator=torch.Generator().manual_seed(1))
    one = load_model(ModelSpec(source=str(tiny_model_dir)))
    streamed = _load_streaming(tiny_model_dir)
    model = streamed.model
    q = model.model.layers[1].self_attn.q_proj
    assert offload_hook(q) is not None and q.weight.device.type == "meta"
    for (a, la), (b, lb) in zip(_scores(one.model, one.shape.groups, tokens),
                                _scores(model, streamed.shape.groups, tokens), strict=True):
        assert a == b
        assert torch.equal(la, lb)


def test_streamed_bank_entries_are_packed_and_held_in_cpu_memory(tiny_model_dir, one_torch_thread):
    prepare_device("cpu")
    tokens = torch.randint(3, 2000, (4, 32), generator=torch.Generator().manual_seed(2))
    plain = load_model(ModelSpec(source=str(tiny_model_dir)))
    model = _load_streaming(tiny_model_dir).model
    banks = [FormatBank(m, plain.shape.groups, FORMATS, forward_loop(tokens)) for m in (plain.model, model)]
    assert banks[0].pack_stats.packed == banks[1].pack_stats.packed > 0
    assert banks[0].pack_stats.kept_bf16 == banks[1].pack_stats.kept_bf16
    fp8 = banks[1].module_for("model.layers.1.self_attn.q_proj", Format.FP8)
    codes = fp8.packed_weights["weight"].codes
    assert codes.device.type == "meta"  # between forwards: in the offload hook's CPU map, not on the device
    assert fp8._hf_hook.hooks[0].weights_map["packed_weights.weight.codes"].dtype == torch.float8_e4m3fn
    bf16 = banks[1].module_for("model.layers.1.self_attn.q_proj", Format.BF16)
    nvfp4 = banks[1].module_for("model.layers.1.mlp.up_proj", Format.NVFP4)
    assert nvfp4.packed_weights["weight"].nibbles.device.type == "meta"
    for fmt in (Format.FP8, Format.NVFP4):  # between forwards, nothing of a streamed entry's weights on its device
        for m in ("self_attn.q_proj", "self_attn.o_proj", "mlp.up_proj", "mlp.down_proj"):
            module = banks[1].module_for(f"model.layers.1.{m}", fmt)
            held = [n for n, t in [*module.named_parameters(), *module.named_buffers()]
                    if t.device.type != "meta" and t.untyped_storage().nbytes() > 64]  # beyond quantizer scalars
            assert held == [], (fmt, m, held)
    # folding wrote into the format's own entry, never into the BF16 weights the copies share
    assert torch.equal(bf16._hf_hook.weights_map["weight"], plain.model.model.layers[1].self_attn.q_proj.weight)


def test_streamed_sensitivity_replay_and_fp8_kv_cache_score_as_in_memory(tiny_model_dir, one_torch_thread):
    """The sensitivity pass (reference outputs replayed for the BF16 layers before a group) and an FP8 KV cache
    calibrated on the working model, with layer 1 streamed."""
    from advisor.models.groups import decoder_layers_path
    from advisor.search.sensitivity import first_changed_layer

    prepare_device("cpu")
    tokens = torch.randint(3, 2000, (6, 32), generator=torch.Generator().manual_seed(3))
    scores = []
    for loaded in (load_model(ModelSpec(source=str(tiny_model_dir))), _load_streaming(tiny_model_dir)):
        groups = loaded.shape.groups
        bank = FormatBank(loaded.model, groups, FORMATS[:2], forward_loop(tokens[:4]),
                          kv_cache=(Format.BF16, Format.FP8))
        proxy = ProxyEvaluator(bank.assemble(Plan.uniform(groups, Format.BF16)), tokens[4:],
                               layers=decoder_layers_path(loaded.model))
        one_group = [Plan({h.name: Format.FP8 if h.name == g.name else Format.BF16 for h in groups}) for g in groups]
        scores.append([proxy.score(bank.assemble(p), reuse_layers=first_changed_layer(p)).kl for p in one_group]
                      + [proxy.score(bank.assemble(Plan.uniform(groups, Format.FP8, kv_cache=Format.FP8))).kl])
    assert scores[0] == scores[1]
    assert all(kl > 0 for kl in scores[0])


def test_a_streamed_entry_brings_its_patch_and_decodes_as_the_folded_weight(tiny_model_dir, one_torch_thread,
                                                                              monkeypatch):
    """Codes made wrong at a few elements (as a GPU kernel's rounding leaves them) are patched at pack time; a
    streamed entry's patch streams with its codes, so the bank scores as one packed without a patch."""
    import advisor.quantize.packed as packed

    prepare_device("cpu")
    tokens = torch.randint(3, 2000, (6, 32), generator=torch.Generator().manual_seed(4))
    plain = load_model(ModelSpec(source=str(tiny_model_dir)))
    expected = _scores(plain.model, plain.shape.groups, tokens)

    def wrong_at_a_few(pack):
        def wrapped(*args):
            entry = pack(*args)
            codes = entry.codes.view(torch.uint8) if hasattr(entry, "codes") else entry.nibbles
            codes.view(-1)[:3] ^= 0x11  # another magnitude, decoded otherwise than the folded value
            return entry
        return wrapped

    monkeypatch.setattr(packed, "_pack_fp8", wrong_at_a_few(packed._pack_fp8))
    monkeypatch.setattr(packed, "_pack_nvfp4", wrong_at_a_few(packed._pack_nvfp4))
    streamed = _load_streaming(tiny_model_dir)
    bank = FormatBank(streamed.model, streamed.shape.groups, FORMATS, forward_loop(tokens[:4]))
    assert bank.pack_stats.patched > 0 and bank.pack_stats.kept_bf16 == []
    entry = bank.module_for("model.layers.1.mlp.up_proj", Format.NVFP4).packed_weights["weight"]
    assert entry.patch_index.device.type == "meta"  # between forwards: in the offload hook's CPU map
    for (a, la), (b, lb) in zip(expected, _scores(streamed.model, streamed.shape.groups, tokens), strict=True):
        assert a == b
        assert torch.equal(la, lb)
