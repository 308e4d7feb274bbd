"""Layers streamed from CPU memory onto a real GPU (accelerate's offload hooks with a CUDA execution device): the
bank keeps none of a streamed layer's weights on the GPU between forwards, and scores every plan as the model held
whole on that GPU does. The CPU tests (test_device_map.py) run the same path with the CPU as execution device."""

from __future__ import annotations

import pytest
import torch

from advisor.accuracy.proxy import ProxyEvaluator
from advisor.calibration.tokens import forward_loop
from advisor.formats import Format
from advisor.models.loading import load_model
from advisor.plan import Plan
from advisor.quantize.bank import FormatBank
from advisor.quantize.modelopt_config import prepare_device
from advisor.recipe.schema import ModelSpec

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FORMATS = (Format.BF16, Format.FP8, Format.NVFP4)
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")


def _scores(bank: FormatBank, groups, tokens: torch.Tensor) -> list:
    proxy = ProxyEvaluator(bank.assemble(Plan.uniform(groups, Format.BF16)), tokens)
    plans = [Plan.uniform(groups, f) for f in FORMATS[1:]]
    plans.append(Plan({g.name: FORMATS[i % 3] for i, g in enumerate(groups)}))
    with torch.no_grad():
        return [(proxy.score(bank.assemble(p)), bank.assemble(p)(input_ids=tokens.cuda()).logits.cpu()) for p in plans]


def test_a_streamed_bank_holds_no_streamed_weight_on_the_gpu_and_scores_as_in_memory(tiny_model_dir):
    prepare_device("cuda")
    tokens = torch.randint(3, 2000, (6, 32), generator=torch.Generator().manual_seed(3))
    whole = load_model(ModelSpec(source=str(tiny_model_dir)), "cuda")
    expected = _scores(FormatBank(whole.model, whole.shape.groups, FORMATS, forward_loop(tokens[:4])),
                       whole.shape.groups, tokens[4:])
    del whole
    streamed = load_model(ModelSpec(source=str(tiny_model_dir)), "cuda", device_map={
        "model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu", "model.norm": 0,
        "model.rotary_emb": 0, "lm_head": 0})
    bank = FormatBank(streamed.model, streamed.shape.groups, FORMATS, forward_loop(tokens[:4]))
    for fmt in FORMATS[1:]:
        for name in LINEARS:
            module = bank.module_for(f"model.layers.1.{name}", fmt)
            held = [n for n, t in [*module.named_parameters(), *module.named_buffers()]
                    if t.is_cuda and t.untyped_storage().nbytes() > 64]  # beyond quantizer scalars
            assert held == [], (fmt, name, held)
    got = _scores(bank, streamed.shape.groups, tokens[4:])
    for (a, la), (b, lb) in zip(expected, got, strict=True):
        assert a == b
        assert torch.equal(la, lb)
