"""GPU memory beside a vLLM engine: the engine's share shrinks to what this process leaves free (vLLM refuses to
start below its share), and `advisor verify` exports on the GPU only where everything an export holds fits."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from advisor.deploy import serving_gpus
from advisor.deploy.serving_gpus import ENGINE_HEADROOM_BYTES, GIB, engine_memory_share
from advisor.errors import SetupError


def _gpus(monkeypatch, free_total: list[tuple[int, int]]) -> list[str]:
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(free_total))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i=0: free_total[i])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    return calls


def test_the_engine_takes_its_share_where_the_gpus_are_free_and_less_beside_a_search(monkeypatch):
    total = 80 * GIB
    calls = _gpus(monkeypatch, [(79 * GIB, total), (79 * GIB, total)])
    assert engine_memory_share(2) == serving_gpus.SERVE_MEMORY_SHARE  # nothing held: vLLM's usual share
    assert calls == ["empty_cache"]  # this process's cached blocks are given back first
    _gpus(monkeypatch, [(79 * GIB, total), (54 * GIB, total)])  # a search holds 26 GiB of cuda:1
    assert engine_memory_share(2) == pytest.approx((54 * GIB - ENGINE_HEADROOM_BYTES) / total)
    assert engine_memory_share(1) == serving_gpus.SERVE_MEMORY_SHARE  # cuda:1 is not the engine's
    _gpus(monkeypatch, [(9 * GIB, total)])
    with pytest.raises(SetupError, match=r"vLLM cannot start beside this process on cuda:0: 9\.0 of 80 GiB"):
        engine_memory_share(1)


def test_without_a_gpu_the_share_is_vllms_usual_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert engine_memory_share(4) == serving_gpus.SERVE_MEMORY_SHARE


def test_the_vllm_tier_asks_the_engine_for_the_share_left_beside_the_search(tmp_path, monkeypatch):
    from advisor.deploy.vllm import VllmEnergyModel, serve
    from advisor.energy.meter import MeterConfig
    from advisor.formats import Format
    from advisor.plan import Plan
    from advisor.recipe.schema import Workload
    from advisor.testing_vllm import ConstantPowerCounter, fake_vllm

    vllm = fake_vllm(step_s=0.001)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setattr("advisor.deploy.vllm._engine.engine_memory_share", lambda gpus: 0.42)
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").write_text('{"num_hidden_layers": 1, "vocab_size": 64}')
    meter = MeterConfig(warmup_s=0.5, min_window_s=0.2, min_ticks=10, repeats=2, idle_s=0.02, max_cv=0.5)
    chat = Workload(name="chat", batch_size=2, input_tokens=8, output_tokens=8)
    model = VllmEnergyModel(lambda plan: Path(ck), [chat], 64, meter=meter,
                            runner=lambda job: serve(job, make_counter=ConstantPowerCounter))
    model.estimate(Plan.uniform(["layers.0.qkv"], Format.BF16), chat)
    assert [llm.kwargs["gpu_memory_utilization"] for llm in vllm.instances] == [0.42]


def test_verify_exports_on_the_gpu_only_where_an_export_fits_there(monkeypatch):
    from advisor.workflows.verify import EXPORT_HEADROOM_BYTES, exports_device

    model = torch.nn.Linear(1000, 1000, bias=False)  # 1e6 weights: 2 MB in BF16, an export holds 4 such copies
    need = 4 * 2 * 10**6 + EXPORT_HEADROOM_BYTES
    _gpus(monkeypatch, [(need, 80 * GIB)])
    assert exports_device(model) == "cuda"
    _gpus(monkeypatch, [(need - 1, 80 * GIB)])
    assert exports_device(model) == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert exports_device(model) == "cpu"
