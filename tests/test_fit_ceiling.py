"""The fits behind reports/benchmarks/shipped_fit_ceiling and gemm_energy: the minimax fit's floor, the GEMM
energy table's lookup (benchmarks/, no GPU)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


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


def test_gemm_energy_is_read_per_row_count_and_scaled_for_a_shape_it_lacks():
    evaluation = _load("gemm_energy_eval")
    from advisor.formats import Format

    table = evaluation.GemmEnergy({"m_buckets": [1, 64], "gemm": {
        "bf16": {"100x100": [{"j": 1.0}, {"j": 3.0}]}, "fp8": {"100x100": [{"j": 0.5}, {"j": 1.5}]}}})
    assert table.gemm_j(Format.BF16, 100, 100, 1) == pytest.approx(1.0)
    assert table.gemm_j(Format.FP8, 100, 100, 32.5) == pytest.approx(1.0)  # halfway between the buckets
    assert not table.approximate
    assert table.gemm_j(Format.BF16, 200, 100, 64) == pytest.approx(6.0)  # twice the weights, from 100x100
    assert table.approximate == {"bf16 200x100 (from 100x100)"}
