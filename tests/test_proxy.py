"""The proxy's layer replay (sensitivity reuses the reference pass's leading layers)."""

from __future__ import annotations

import pytest
import torch

from advisor.accuracy.proxy import ProxyEvaluator
from advisor.formats import Format
from advisor.models.groups import decoder_layers_path, model_shape
from advisor.plan import Plan
from advisor.quantize.bank import FormatBank
from advisor.quantize.modelopt_config import prepare_device
from advisor.search.sensitivity import first_changed_layer
from advisor.testing import random_model, tiny_config


def _bank(family: str, kv_cache=(Format.BF16,)):
    prepare_device("cpu")
    model = random_model(tiny_config(family, vocab=128))
    groups = model_shape(model).groups
    tokens = torch.randint(3, 120, (6, 24), generator=torch.Generator().manual_seed(0))

    @torch.no_grad()
    def loop(m):
        m(input_ids=tokens[:4])

    bank = FormatBank(model, groups, (Format.BF16, Format.FP8, Format.NVFP4), loop, kv_cache=kv_cache)
    return bank, groups, tokens[4:]


@pytest.mark.parametrize("family", ["llama", "gemma3", "qwen3_moe"])
def test_replayed_layers_give_the_full_passes_score_for_every_one_group_plan(family):
    bank, groups, heldout = _bank(family)
    base = Plan.uniform(groups, Format.BF16)
    path = decoder_layers_path(bank.model)
    replaying = ProxyEvaluator(bank.assemble(base), heldout, batch_size=1, layers=path)
    full = ProxyEvaluator(bank.assemble(base), heldout, batch_size=1)
    reused = 0
    for g in groups:
        for fmt in (Format.FP8, Format.NVFP4):
            plan = Plan({**base.formats, g.name: fmt})
            layer = first_changed_layer(plan)
            assert layer == int(g.name.split(".")[1])
            fast = replaying.score(bank.assemble(plan), reuse_layers=layer)
            slow = full.score(bank.assemble(plan))
            assert fast.kl == slow.kl, (g.name, fmt)
            assert fast.ppl == slow.ppl, (g.name, fmt)
            reused += layer
    assert reused > 0  # layer 1's groups did skip layer 0
    stack = bank.model.get_submodule(path)
    assert all(type(layer).__name__ != "_RecordedLayer" for layer in stack)  # every layer put back


def test_replay_puts_the_layers_back_when_the_forward_fails():
    bank, groups, heldout = _bank("llama")
    proxy = ProxyEvaluator(bank.assemble(Plan.uniform(groups, Format.BF16)), heldout, layers="model.layers")
    stack = bank.model.model.layers
    before = list(stack)
    with pytest.raises(IndexError):
        proxy.score(bank.model, reuse_layers=len(stack) + 1)
    assert list(stack) == before


def test_reuse_needs_recorded_layers():
    bank, groups, heldout = _bank("llama")
    proxy = ProxyEvaluator(bank.assemble(Plan.uniform(groups, Format.BF16)), heldout)
    with pytest.raises(ValueError, match="layers="):
        proxy.score(bank.model, reuse_layers=1)


def test_first_changed_layer():
    plan = Plan({"layers.0.qkv": Format.BF16, "layers.3.o": Format.FP8, "layers.2.down": Format.NVFP4})
    assert first_changed_layer(plan) == 2
    assert first_changed_layer(Plan({"layers.3.o": Format.FP8}, Format.FP8)) == 0  # KV cache: every layer
    assert first_changed_layer(Plan({"layers.3.o": Format.BF16})) == 0
    assert first_changed_layer(Plan({"lm_head": Format.FP8, "layers.3.o": Format.FP8})) == 0


@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
def test_the_reference_score_is_what_scoring_the_reference_model_gives(family):
    bank, groups, heldout = _bank(family)
    proxy = ProxyEvaluator(bank.assemble(Plan.uniform(groups, Format.BF16)), heldout, batch_size=2)
    again = proxy.score(bank.assemble(Plan.uniform(groups, Format.BF16)))
    assert proxy.reference_score() == again and again.kl == 0.0
    assert proxy.score(bank.assemble(Plan.uniform(groups, Format.FP8))).kl > 0  # another plan is scored
