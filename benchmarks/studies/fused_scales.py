"""Fused scales: the quickstart-like search with one FP8 scale per member (as before) and with
q/k/v and gate/up sharing one input and one weight scale (as engines load them, now the default).

For each recipe the search runs twice on the same model, tokens and settings (the second run gets
the first's ``tokens.pt``, as a resumed study would; regenerating them gives the same bytes): ``untied`` patches
``advisor.quantize.modelopt_config.tie_fused_scales`` to tie NVFP4 groups only (what the advisor did
before: ModelOpt ties NVFP4's ``weight_scale_2`` at export and leaves FP8 alone), ``tied`` runs the
code as it is. It records the recommendation, the baselines and the KL of every plan both runs scored.

Usage (CPU; the quickstart takes ~15 min for both runs on 2 cores):
    python benchmarks/studies/fused_scales.py --recipe recipes/tiny.yaml --recipe recipes/quickstart.yaml
Writes reports/benchmarks/fused_scales.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from advisor.formats import Format
from advisor.plan import Plan
from advisor.quantize import modelopt_config
from advisor.recipe.schema import load_recipe
from advisor.versions import package_versions
from advisor.workflows.search import run


@contextmanager
def fp8_untied():
    """The behaviour before: only fused NVFP4 groups share scales (the FP8 groups keep one per member)."""
    tie = modelopt_config.tie_fused_scales

    def nvfp4_only(model, plan, infos):
        tie(model, Plan({g: Format.BF16 if f == Format.FP8 else f for g, f in plan.formats.items()}), infos)

    modelopt_config.tie_fused_scales = nvfp4_only
    try:
        yield
    finally:
        modelopt_config.tie_fused_scales = tie


def _plan_row(r: Any) -> dict[str, Any]:
    return {"plan_id": r.plan_id, "label": r.label, "kl": r.kl, "feasible": r.feasible,
            "j_per_token": r.energy_by_workload(), "benchmark_drop": r.benchmark_drop,
            "benchmark": {t: {k: v[k] for k in ("acc", "acc_stderr", "n")} for t, v in r.benchmark.items()}}


def _scored(summary: Any) -> list[dict[str, Any]]:
    """Every plan lm-eval scored in the run (distinct plans, in trial order)."""
    return [_plan_row(r) for r in {r.plan_id: r for r in summary.trials if r.benchmark}.values()]


def search_once(recipe_path: str, name: str, out: Path) -> tuple[Any, float]:
    recipe = load_recipe(Path(recipe_path), {"name": name, "out": str(out)})
    t = time.perf_counter()
    summary = run(recipe)
    return summary, time.perf_counter() - t


def compare(recipe_path: str, out: Path) -> dict[str, Any]:
    stem = Path(recipe_path).stem
    with fp8_untied():
        before, t_before = search_once(recipe_path, f"{stem}-untied", out)
    (out / f"{stem}-tied").mkdir()
    for name in ("tokens.pt", "tokens.key.json"):
        shutil.copy(out / f"{stem}-untied" / name, out / f"{stem}-tied" / name)
    after, t_after = search_once(recipe_path, f"{stem}-tied", out)
    kl_before = {r.plan_id: r for r in before.trials}
    common = [{"plan_id": r.plan_id, "label": r.label, "kl_untied": kl_before[r.plan_id].kl, "kl_tied": r.kl,
               "kl_change_pct": 100 * (r.kl / kl_before[r.plan_id].kl - 1) if kl_before[r.plan_id].kl else 0.0,
               "benchmark_drop_untied": kl_before[r.plan_id].benchmark_drop, "benchmark_drop_tied": r.benchmark_drop}
              for r in {r.plan_id: r for r in after.trials}.values() if r.plan_id in kl_before]
    return {
        "recipe": recipe_path,
        "model": after.model,
        "target": after.target,
        "accuracy_budget": after.accuracy_budget,
        "untied": {"recommendation": _plan_row(before.recommendation) if before.recommendation else None,
                   "front": before.front, "lm_eval": _scored(before), "wall_s": t_before},
        "tied": {"recommendation": _plan_row(after.recommendation) if after.recommendation else None,
                 "front": after.front, "lm_eval": _scored(after), "wall_s": t_after},
        "recommendation_changed": (before.recommendation.plan_id if before.recommendation else None)
        != (after.recommendation.plan_id if after.recommendation else None),
        "plans_scored_by_both": sorted(common, key=lambda c: c["kl_tied"]),
        "energy_label": after.labels.energy,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", action="append", required=True)
    ap.add_argument("--out", default="reports/benchmarks/fused_scales.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = [compare(r, Path(tmp)) for r in args.recipe]
    data = {
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "cpu": platform.processor() or platform.machine(),
        "versions": package_versions(),
        "results": results,
    }
    Path(args.out).write_text(json.dumps(data, indent=2, default=str))
    for r in results:
        for which in ("untied", "tied"):
            rec = r[which]["recommendation"]
            print(f"{r['recipe']} {which}: {rec['label'] if rec else None} {rec['plan_id'] if rec else ''} "
                  f"KL {rec['kl'] if rec else float('nan'):.4f}")


if __name__ == "__main__":
    main()
