"""Per-trial time on SmolLM2 (quickstart recipe, CPU): calibration reused vs calibrated in the trial.

Usage: python benchmarks/studies/trial_time.py   (prints the timings of three random mixed plans)
"""

from __future__ import annotations

import random
import time
import warnings

from advisor.calibration.tokens import forward_loop
from advisor.formats import Format
from advisor.plan import Plan
from advisor.quantize.modelopt_config import _share_weights_copy, quantize_plan
from advisor.recipe.schema import load_recipe
from advisor.workflows.context import prepare


def main() -> None:
    warnings.filterwarnings("ignore")
    overrides = {"name": "timing", "out": "/tmp/timing_runs", "benchmark.tasks": []}
    recipe = load_recipe("recipes/quickstart.yaml", overrides)
    ctx = prepare(recipe)
    groups = ctx.loaded.shape.groups
    rng = random.Random(0)
    choices = [Format.BF16, Format.FP8, Format.FP8, Format.NVFP4]
    for _ in range(3):
        plan = Plan({g.name: rng.choice(choices) for g in groups})
        t = time.perf_counter()
        ctx.proxy.score(ctx.bank.assemble(plan))
        reused = time.perf_counter() - t
        t = time.perf_counter()
        model = quantize_plan(_share_weights_copy(ctx.loaded.model), plan, groups, forward_loop(ctx.tokens.calibration))
        ctx.proxy.score(model)
        in_trial = time.perf_counter() - t
        print(f"{plan.label()}: trial with calibration reused {reused:.1f} s; "
              f"with calibration in the trial {in_trial:.1f} s")
    print("one-time calibration of both formats:", round(ctx.timings_s["calibration_s"], 1), "s")


if __name__ == "__main__":
    main()
