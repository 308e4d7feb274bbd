"""FP8 KV cache on a CPU: its accuracy effect (proxy KL, optionally LAMBADA) and its predicted energy effect.

Accuracy: the recipe's model, tokens and calibration (``prepare``), KV-cache formats [bf16, fp8],
on all-BF16 and all-FP8 weights, each with a BF16 and an FP8 KV cache (ModelOpt FP8_KV_CFG k/v
quantizers, as the search scores them). Energy: no GPU measurement (the built-in runtime has
no FP8 KV attention yet); the *predicted* J/token of a Llama-3.1-8B shape on the shipped H100
profile and the H100 datasheet roofline, all-FP8 weights, BF16 vs FP8 KV, at batch 16 and 64
and context 512 and 8192 (the grid the GPU run of issue 17 is to measure; requests of ``context``
prompt tokens and 256 generated), per request (prefill included) and per decode step alone,
labelled predicted.

Usage:
    python benchmarks/studies/kv_cache_accuracy.py --recipe recipes/quickstart.yaml [--lambada-limit N]
Writes reports/benchmarks/kv_cache_accuracy_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from advisor.energy.prediction import ProfileCostModel, RooflineEnergyModel
from advisor.energy.profiling import shipped_profile
from advisor.formats import GPU, Format
from advisor.models.shape import llama_shape
from advisor.plan import Plan
from advisor.recipe.schema import Workload, load_recipe
from advisor.versions import package_versions
from advisor.workflows.context import prepare

GRID = [(b, c) for b in (16, 64) for c in (512, 8192)]


def _kv_drop(rows: list[dict[str, Any]]) -> None:
    """Each FP8-KV row's LAMBADA drop against the BF16-KV row of the same weights, paired on the same items."""
    from advisor.search.stats import paired_drop

    by_plan = {(r["weights"], r["kv_cache"]): r for r in rows if "lambada_openai" in r}
    for (weights, kv), row in by_plan.items():
        ref = by_plan.get((weights, "bf16"))
        if kv == "bf16" or ref is None:
            continue
        mine, theirs = row["lambada_openai"]["items"], ref["lambada_openai"]["items"]
        common = sorted(set(mine) & set(theirs), key=int)
        interval = paired_drop([theirs[i] for i in common], [mine[i] for i in common], 0.95)
        row["lambada_drop_vs_bf16_kv"] = interval.to_dict()


def accuracy(recipe_path: str, out: Path, lambada_limit: int | None, data_dir: str,
             weight_formats: tuple[Format, ...] = (Format.BF16, Format.FP8)) -> dict[str, Any]:
    recipe = load_recipe(Path(recipe_path), {"name": "kv", "out": str(out), "kv_cache": ["bf16", "fp8"],
                                              "benchmark.tasks": [], "energy": "predicted"})
    t = time.perf_counter()
    ctx = prepare(recipe)
    groups = ctx.loaded.shape.groups
    rows = []
    for weights in weight_formats:
        for kv in (Format.BF16, Format.FP8):
            plan = Plan.uniform(groups, weights, kv)
            score = ctx.proxy.score(ctx.bank.assemble(plan))
            row = {"plan_id": plan.id, "label": plan.label(), "weights": weights.value, "kv_cache": kv.value,
                   "kl": score.kl, "ppl": score.ppl,
                   "ppl_bf16": score.ppl_bf16, "heldout_tokens": score.tokens}
            if lambada_limit is not None:
                from advisor.accuracy.harness import score_plan

                scores = score_plan(ctx.bank.assemble(plan), ctx.loaded.tokenizer, plan.id, ctx.fingerprint,
                                    ["lambada_openai"], limit=lambada_limit or None, seed=1234, data_dir=data_dir,
                                    cache_dir=out / "lm_eval_cache")
                row["lambada_openai"] = scores["lambada_openai"].to_dict()
            rows.append(row)
            print(f"{recipe_path} {plan.label()}: KL {score.kl:.5f}, ppl {score.ppl:.3f}", flush=True)
    _kv_drop(rows)
    return {"recipe": recipe_path, "model": ctx.loaded.name, "fingerprint": ctx.fingerprint,
            "calibration_s": ctx.timings_s.get("calibration_s"), "wall_s": time.perf_counter() - t, "plans": rows,
            "lambada_limit": lambada_limit}


def predicted_energy() -> list[dict[str, Any]]:
    shape = llama_shape("model.layers", 32, 4096, 14336, 32, 8, 128256, 128)
    models = [RooflineEnergyModel(shape, GPU.H100), ProfileCostModel(shipped_profile(GPU.H100), shape)]
    plan = Plan.uniform(shape.groups, Format.FP8)
    rows = []
    for model in models:
        for batch, context in GRID:
            # decode-dominated request: `context` prompt tokens, 256 generated
            w = Workload(name=f"b{batch}-c{context}", batch_size=batch, input_tokens=context, output_tokens=256)
            bf16, fp8 = (model.estimate(plan.with_kv_cache(kv), w) for kv in (Format.BF16, Format.FP8))
            rows.append({"model": model.label, "batch": batch, "context": context,
                         "j_per_token_bf16_kv": bf16.j_per_token, "j_per_token_fp8_kv": fp8.j_per_token,
                         "saving_pct": 100 * (1 - fp8.j_per_token / bf16.j_per_token),
                         "decode_j_per_token_bf16_kv": bf16.decode_j_per_token,
                         "decode_j_per_token_fp8_kv": fp8.decode_j_per_token,
                         "decode_saving_pct": 100 * (1 - fp8.decode_j_per_token / bf16.decode_j_per_token),
                         "source_fp8_kv": fp8.source})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", action="append", required=True)
    ap.add_argument("--lambada-limit", type=int, default=None, help="LAMBADA items (0: the full set); omit: skip")
    ap.add_argument("--data-dir", default="../shared/data/eval")
    ap.add_argument("--weights", default="bf16,fp8", help="weight formats of the uniform plans (comma list)")
    ap.add_argument("--out", default="reports/benchmarks/kv_cache_accuracy_cpu.json")
    args = ap.parse_args()
    weights = tuple(Format(w.strip()) for w in args.weights.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        acc = [accuracy(r, Path(tmp), args.lambada_limit, args.data_dir, weights) for r in args.recipe]
    data = {
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "versions": package_versions(),
        "accuracy": acc, "predicted_energy_llama31_8b_h100": predicted_energy(),
    }
    Path(args.out).write_text(json.dumps(data, indent=2, default=str))


if __name__ == "__main__":
    main()
