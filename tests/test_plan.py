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
