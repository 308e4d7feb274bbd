"""The contract every predicted energy tier meets, run for each tier of the registry (after Optuna's
``optuna/testing/pytest_samplers.py``): each is priced from a profile of the simulated GPU (or, for the layer
profile and the roofline, what ships), and a tier added to ``PREDICTED_TIERS`` must add its profile here."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest
from test_gpu_profile import TEST, simulated_gpu_profile
from test_model_profiles import SHAPE, STATE, simulated_profile

from advisor.energy.prediction import PREDICTED_TIERS, TierRequest, make_predicted_model
from advisor.energy.profiling import (
    ProfileStore,
    shipped_profile,
)
from advisor.errors import UnsupportedError
from advisor.estimate import EnergyEstimate
from advisor.formats import GPU, Format
from advisor.models.shape import ModelShape
from advisor.plan import Plan
from advisor.recipe.schema import Workload

#: tier name -> (its profile of the simulated GPU, the model it prices); an H100 in every case
SIMULATED: dict[str, Callable[[], tuple[dict[str, Any], ModelShape]]] = {
    "per-model": lambda: (simulated_profile(STATE), SHAPE),
    "gpu": lambda: (simulated_gpu_profile(), TEST.shape(4)),
    "layer": lambda: (shipped_profile(GPU.H100), SHAPE),  # no simulated layer profile: the shipped one
    "roofline": lambda: ({}, SHAPE),  # the datasheet
}
WORKLOADS = (Workload(name="b1", batch_size=1, input_tokens=512, output_tokens=256),
             Workload(name="b64", batch_size=64, input_tokens=512, output_tokens=256))


def test_every_tier_of_the_registry_has_a_simulated_profile():
    assert list(SIMULATED) == list(PREDICTED_TIERS)


@pytest.fixture(scope="module", params=list(PREDICTED_TIERS))
def tier(request, tmp_path_factory):
    """(name, its energy model, the model's shape, the profile) for each registered tier."""
    name = request.param
    profile, shape = SIMULATED[name]()
    req = TierRequest(shape, GPU.H100, None, ProfileStore(tmp_path_factory.mktemp("store")))
    return name, PREDICTED_TIERS[name].price(profile, req), shape, profile


def _plans(shape: ModelShape) -> dict[str, Plan]:
    names = [g.name for g in shape.groups]
    return {"bf16": Plan.uniform(names, Format.BF16), "fp8": Plan.uniform(names, Format.FP8),
            "nvfp4": Plan.uniform(names, Format.NVFP4), "fp8-kv": Plan.uniform(names, Format.FP8, Format.FP8),
            "mlp": Plan({n: Format.FP8 if n.endswith(("gate_up", "down")) else Format.BF16 for n in names})}


def test_a_tier_prices_a_plan_as_predicted_with_one_consistent_request(tier):
    _, model, shape, _ = tier
    assert model.measured is False and model.label.startswith("predicted (")
    for w in WORKLOADS:
        est = model.estimate(_plans(shape)["bf16"], w)
        assert isinstance(est, EnergyEstimate) and not est.measured and est.workload == w.name
        assert est.source.startswith("predicted (")
        values = (est.j_per_token, est.decode_j_per_token, est.prefill_j_per_input_token, est.decode_tokens_per_s)
        assert all(math.isfinite(v) and v > 0 for v in values)
        request_j = est.prefill_j_per_input_token * w.input_tokens + w.output_tokens * est.decode_j_per_token
        assert est.j_per_token == pytest.approx(request_j / w.output_tokens, rel=1e-9)


def test_a_tier_is_deterministic_and_batching_amortizes_a_step(tier, tmp_path):
    name, model, shape, profile = tier
    plan = _plans(shape)["bf16"]
    again = PREDICTED_TIERS[name].price(profile, TierRequest(shape, GPU.H100, None, ProfileStore(tmp_path)))
    assert again.estimate(plan, WORKLOADS[1]) == model.estimate(plan, WORKLOADS[1])  # priced anew, the same
    b1, b64 = (model.estimate(plan, w).decode_j_per_token for w in WORKLOADS)
    assert b64 < b1


def test_fp8_saves_at_a_large_batch_and_a_mixed_plan_lies_between(tier):
    _, model, shape, _ = tier
    plans = _plans(shape)
    bf16, fp8, mlp = (model.estimate(plans[k], WORKLOADS[1]).decode_j_per_token for k in ("bf16", "fp8", "mlp"))
    assert fp8 < bf16 and min(fp8, bf16) <= mlp <= max(fp8, bf16)


def test_what_a_tier_cannot_price_is_an_unsupported_error_and_its_chain_prices_or_says_so(tier, tmp_path):
    name, model, shape, profile = tier
    for key in ("nvfp4", "fp8-kv"):
        try:
            est = model.estimate(_plans(shape)[key], WORKLOADS[0])
        except UnsupportedError:
            continue
        assert math.isfinite(est.j_per_token) and est.source.startswith("predicted (")
    if not profile:
        return  # the roofline: no file
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    given = make_predicted_model(shape, GPU.H100, profile=path, store=ProfileStore(tmp_path / "store"))
    assert [t.name for t in PREDICTED_TIERS.values() if t.reads(profile)][0] == name
    assert given.estimate(_plans(shape)["fp8"], WORKLOADS[1]) == model.estimate(_plans(shape)["fp8"], WORKLOADS[1])
    if PREDICTED_TIERS[name].fallback is not None:  # the fallback prices a plan the tier cannot, and says so
        est = given.estimate(_plans(shape)["fp8-kv"], WORKLOADS[1])
        assert f"[not in {model.label}" in est.source
