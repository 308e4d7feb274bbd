"""The fits behind reports/benchmarks/shipped_fit_ceiling: the minimax fit's floor and the units' spread
(benchmarks/studies/, no GPU). The GEMM energy table's lookup: tests/test_gpu_profile.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "studies"


def _load(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def _rows(ratios: list[float]) -> list[dict]:
    """Steps whose J is 2 J/s x their time x a ratio (one feature: the time)."""
    return [{"t_ms": 1.0 + i, "parts": {}, "j": 2.0 * (1.0 + i) / 1e3 * r, "shape": "s"} for i, r in enumerate(ratios)]


def test_the_minimax_fit_reaches_the_least_largest_error_and_least_squares_does_not():
    ceiling = _load("shipped_fit_ceiling")

    def form(t_ms, parts):
        return [t_ms / 1e3]

    rows = _rows([1.05, 0.95, 1.05, 1.05, 1.05])  # least squares leans to the majority; minimax splits the two
    worst = {}
    for name, fit in (("minimax", ceiling.minimax_rows), ("nnls", ceiling.fit_rows)):
        coef = fit(form, rows)
        worst[name] = max(abs(e) for _, e in ceiling.relative_errors(form, coef, rows))
    # the best a single coefficient can do: c / 2.1 and c / 1.9 equally far from 1, i.e. 5% off
    assert worst["minimax"] == pytest.approx(0.05, abs=1e-6)
    assert worst["nnls"] > worst["minimax"] + 0.005


def _raw(uuid: str, rows: list[tuple[str, int, float]]) -> tuple[str, dict]:
    return uuid, {"gpu_uuid": uuid, "shapes": {"SmolLM2-135M": {"rows": [
        {"plan": plan, "phase": "decode", "batch": b, "measured_j_per_token": j} for plan, b, j in rows]}}}


def test_the_unit_spread_floor_is_half_the_widest_range_over_units_measured_twice_or_more():
    ceiling = _load("shipped_fit_ceiling")
    raws = [_raw("GPU-a", [("bf16", 1, 1.00), ("fp8", 1, 0.80), ("bf16", 64, 0.10)]),
            _raw("GPU-a", [("bf16", 1, 1.02)]),  # the same unit again: its mean, 1.01, counts once
            _raw("GPU-b", [("bf16", 1, 1.10), ("fp8", 1, 0.82)]),
            _raw("GPU-c", [("bf16", 1, 1.05)])]
    floor = ceiling.unit_spread_floor(raws)["SmolLM2-135M"]
    # bf16 b1 over three units: 1.01 .. 1.10 -> 0.09 / 2.11; fp8 b1 (0.80 .. 0.82) is narrower; bf16 b64 one unit
    assert floor["floor"] == pytest.approx(0.09 / 2.11)
    assert (floor["row"], floor["units"]) == ("bf16 decode 1", 3)
    # a prediction of 2 x 1.01 x 1.10 / 2.11 misses both ends by exactly that much, and nothing does better
    middle = 2 * 1.01 * 1.10 / 2.11
    assert middle / 1.01 - 1 == pytest.approx(floor["floor"]) == pytest.approx(1 - middle / 1.10)
