from __future__ import annotations

import pytest

from advisor.errors import InputError
from advisor.formats import Format
from advisor.plan import LayerGroup, Plan

GROUPS = (
    LayerGroup("layers.0.qkv", ("q", "k", "v"), ((64, 64), (64, 32), (64, 32))),
    LayerGroup("layers.0.down", ("d",), ((128, 64),)),
)


def test_plan_round_trips_through_json_and_keeps_its_id():
    plan = Plan({"layers.0.qkv": Format.FP8, "layers.0.down": Format.NVFP4})
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assert again.id == plan.id
    assert Plan({"layers.0.down": "nvfp4", "layers.0.qkv": "fp8"}).id == plan.id  # order-free
    assert len({plan, again}) == 1


def test_plan_id_changes_with_content():
    a = Plan.uniform(GROUPS, Format.FP8)
    b = Plan({**a.formats, "layers.0.down": Format.BF16})
    assert a.id != b.id
    assert a.label() == "all-fp8"
    assert b.label() == "mixed (1 bf16, 1 fp8)"


def test_effective_bits_weights_by_parameter_count():
    plan = Plan({"layers.0.qkv": Format.BF16, "layers.0.down": Format.FP8})
    n_qkv, n_down = 64 * 128, 128 * 64
    assert plan.effective_bits(GROUPS) == pytest.approx((16 * n_qkv + 8 * n_down) / (n_qkv + n_down))
    assert Plan.uniform(GROUPS, Format.NVFP4).effective_bits(GROUPS) == pytest.approx(4.5)


@pytest.mark.parametrize(
    "text",
    ['{"formats": {"a": "int2"}}', "not json", '{"formats": [1, 2]}',
     '{"id": "000000000000", "formats": {"a": "fp8"}}'],
)
def test_bad_plan_json_is_an_input_error(text):
    with pytest.raises(InputError):
        Plan.from_json(text)


def test_plan_that_does_not_match_the_model_is_refused():
    with pytest.raises(InputError, match="missing"):
        Plan({"layers.0.qkv": Format.FP8}).check_against(GROUPS)


def test_kv_cache_is_part_of_the_id_only_when_it_is_not_bf16():
    plan = Plan({"layers.0.qkv": Format.FP8, "layers.0.down": Format.NVFP4})
    assert Plan(plan.formats, Format.BF16).id == plan.id  # ids of plans made before the KV dimension
    fp8_kv = plan.with_kv_cache(Format.FP8)
    assert fp8_kv.id != plan.id and fp8_kv != plan
    assert Plan.uniform(GROUPS, Format.FP8, Format.FP8).label() == "all-fp8 + fp8 KV"
    assert Plan.uniform(GROUPS, Format.BF16, Format.FP8).uniform_format() is None  # not the BF16 reference
    assert Plan.uniform(GROUPS, Format.BF16, Format.FP8).uniform_weights() == Format.BF16


def test_kv_cache_round_trips_through_json_and_optuna_params():
    plan = Plan({"layers.0.qkv": Format.FP8, "layers.0.down": Format.BF16}, Format.FP8)
    again = Plan.from_json(plan.to_json())
    assert again == plan and again.kv_cache == Format.FP8 and again.id == plan.id
    assert '"kv_cache"' not in plan.with_kv_cache(Format.BF16).to_json()  # old plan files stay byte-identical
    assert Plan.from_params(plan.params()) == plan
    bf16_kv = plan.with_kv_cache(Format.BF16)
    assert "kv_cache" not in bf16_kv.params() and bf16_kv.params(kv_dimension=True)["kv_cache"] == "bf16"
    assert Plan.from_params(bf16_kv.params(kv_dimension=True)) == bf16_kv


@pytest.mark.parametrize("kv", ["nvfp4", "int8"])
def test_kv_cache_formats_other_than_bf16_and_fp8_are_refused(kv):
    with pytest.raises((InputError, ValueError)):
        Plan.from_json(f'{{"formats": {{"a": "fp8"}}, "kv_cache": "{kv}"}}')
