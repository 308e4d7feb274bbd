"""Search efficiency: hypervolume against trials for the guided search and baselines.

On SmolLM2-135M (the demo model) with the KL proxy and predicted (roofline) energy for
a B200 target, runs each method for N trials and several seeds, on one shared model
side (each distinct plan is scored once and reused across methods; every method is
charged for each of its trials):

* guided: sensitivity + knapsack proposals, then TPE (this project);
* tpe: plain Optuna TPE over per-group categoricals;
* random: Optuna RandomSampler;
* uniform plans (points), and ModelOpt AutoQuantize (method kl_div) at matched
  effective bits (points).

Hypervolume is over plans within the KL budget, objectives normalized to
(KL / budget, J/token / all-BF16 J/token) with reference point (1, 1). The reference
front is the union of every plan any method evaluated plus an exhaustive search of a
coarse grouping (one format per projection role across all layers: 3^4 plans).

Writes reports/benchmarks/search_efficiency.json and .png. Usage:
    python benchmarks/studies/search_efficiency.py [--trials 40] [--seeds 0 1] [--out reports/benchmarks]
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import shlex
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from advisor.formats import Format
from advisor.plan import Plan
from advisor.recipe.schema import validate_recipe
from advisor.search.frontier import hypervolume
from advisor.search.proposals import KnapsackProposer  # noqa: E402
from advisor.search.study import Evaluation, open_study, run_search
from advisor.workflows.context import prepare


class SharedEvaluator:
    def __init__(self, ctx) -> None:
        self.ctx, self.cache, self.time_s = ctx, {}, 0.0

    def evaluate(self, plan: Plan) -> Evaluation:
        if plan.id not in self.cache:
            t = time.perf_counter()
            self.cache[plan.id] = self.ctx.evaluate(plan)
            self.time_s += time.perf_counter() - t
        return self.cache[plan.id]


def normalized(ev: Evaluation, max_kl: float, e_bf16: float) -> tuple[float, float]:
    return ev.kl / max_kl, ev.energy[0].j_per_token / e_bf16


def hv_curve(points: list[tuple[float, float]]) -> list[float]:
    return [hypervolume([p for p in points[:k] if p[0] <= 1.0], (1.0, 1.0)) for k in range(1, len(points) + 1)]


def run_method(name, sampler, seed, trials, base, evaluator, groups, proposer, tmp) -> list[Plan]:
    recipe = validate_recipe({**base, "name": f"{name}-{seed}", "search": {"trials": trials, "seed": seed,
                              "sampler": sampler}, "storage": f"sqlite:///{tmp}/bench.db"})
    study = open_study(recipe, resume=False)
    run_search(study, evaluator, recipe, groups, proposer=proposer if sampler == "guided" else None)
    return [Plan(t.params) for t in sorted(study.trials, key=lambda t: t.number) if t.values]


def coarse_plans(groups) -> list[Plan]:
    roles = sorted({g.name.rsplit(".", 1)[-1] for g in groups})
    out = []
    for combo in itertools.product(list(Format), repeat=len(roles)):
        by_role = dict(zip(roles, combo, strict=True))
        out.append(Plan({g.name: by_role[g.name.rsplit(".", 1)[-1]] for g in groups}))
    return out


def autoquantize_plans(ctx, bits_targets: list[float]) -> tuple[list[dict], list[str]]:
    """ModelOpt AutoQuantize (kl_div scores) at each effective-bits target, read back as plans.

    Targets are in our effective bits (quantizable layers only); AutoQuantize counts the
    BF16 lm_head too, so each target is converted to its accounting first.
    """
    import copy
    import warnings

    import modelopt.torch.quantization as mtq

    groups = ctx.loaded.shape.groups
    batches = [ctx.tokens.calibration[i : i + 4] for i in range(0, ctx.tokens.calibration.shape[0], 4)]
    out, errors = [], []
    ckpt = Path(tempfile.mkdtemp()) / "aq.pt"
    q, lm = ctx.loaded.shape.quantizable_weights, ctx.loaded.shape.lm_head_weights
    for bits in bits_targets:
        aq_bits = (bits * q + 16 * lm) / (q + lm)
        try:
            model = copy.deepcopy(ctx.loaded.model)
            t = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model, _ = mtq.auto_quantize(
                    model, constraints={"effective_bits": aq_bits},
                    quantization_formats=[mtq.FP8_DEFAULT_CFG, mtq.NVFP4_DEFAULT_CFG],
                    data_loader=batches, forward_step=lambda m, b: m(input_ids=b).logits,
                    disabled_layers=["*lm_head*"], num_calib_steps=len(batches), num_score_steps=len(batches),
                    method="kl_div", checkpoint=str(ckpt),
                )
            formats = {}
            for g in groups:
                wq = model.get_submodule(g.members[0]).weight_quantizer
                if not wq.is_enabled:
                    formats[g.name] = Format.BF16
                else:
                    formats[g.name] = Format.NVFP4 if tuple(wq.num_bits) == (2, 1) else Format.FP8
            out.append({"effective_bits_target": bits, "autoquantize_effective_bits": aq_bits,
                        "plan": Plan(formats), "time_s": time.perf_counter() - t})
        except Exception as exc:  # report, don't hide: AutoQuantize is a comparison point, not our code
            errors.append(f"target {bits:.2f} bits ({aq_bits:.2f} in AutoQuantize's accounting): "
                          f"{type(exc).__name__}: {exc}")
    return out, errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--model", default="demo:smollm2-135m")
    ap.add_argument("--max-kl", type=float, default=0.1)
    ap.add_argument("--out", type=Path, default=Path("reports/benchmarks"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    base = {
        "model": {"source": args.model}, "target": "b200", "device": "cpu", "out": tmp,
        "workloads": [{"name": "chat", "batch_size": 16, "input_tokens": 512, "output_tokens": 256}],
        "calibration": {"num_samples": 8, "seq_len": 128, "heldout_samples": 4, "heldout_seq_len": 128},
        "accuracy": {"max_kl": args.max_kl},
    }
    t0 = time.perf_counter()
    ctx = prepare(validate_recipe({**base, "name": "ctx"}), status=lambda m: print(m, file=sys.stderr))
    groups = ctx.loaded.shape.groups
    sens = ctx.sensitivity(on_step=lambda d, n: print(f"sensitivity {d}/{n}", file=sys.stderr) if d % 40 == 0 else None)
    proposer = KnapsackProposer(groups, list(Format), sens, args.max_kl)
    ev = SharedEvaluator(ctx)
    e_bf16 = ev.evaluate(Plan.uniform(groups, Format.BF16)).energy[0].j_per_token

    def norm(plan: Plan) -> tuple[float, float]:
        return normalized(ev.evaluate(plan), args.max_kl, e_bf16)

    methods: dict[str, dict] = {}
    all_plans: list[Plan] = []
    for name in ("guided", "tpe", "random"):
        per_seed = []
        for seed in args.seeds:
            t = time.perf_counter()
            plans = run_method(name, name, seed, args.trials, base, ev, groups, proposer, tmp)
            all_plans += plans
            curve = hv_curve([norm(p) for p in plans])
            per_seed.append(curve)
            print(f"{name} seed {seed}: hv@{args.trials} {curve[-1]:.4f} ({time.perf_counter() - t:.0f} s)",
                  file=sys.stderr)
        n = min(len(c) for c in per_seed)
        median = [sorted(c[k] for c in per_seed)[len(per_seed) // 2] for k in range(n)]
        mean = [sum(c[k] for c in per_seed) / len(per_seed) for k in range(n)]
        methods[name] = {"trials": list(range(1, n + 1)), "hv": mean, "hv_median": median, "hv_per_seed": per_seed}

    uniform = {f.value: norm(Plan.uniform(groups, f)) for f in Format}
    coarse = coarse_plans(groups)
    for p in coarse:
        norm(p)
    reference_points = [norm(p) for p in set(all_plans) | set(coarse)]
    reference_hv = hypervolume([p for p in reference_points if p[0] <= 1.0], (1.0, 1.0))

    guided_best = min((p for p in all_plans[: args.trials] if norm(p)[0] <= 1.0), key=lambda p: norm(p)[1])
    targets = sorted({round(guided_best.effective_bits(groups), 2), 6.0, 8.0})
    aq, aq_errors = autoquantize_plans(ctx, targets)
    aq_points = [{"effective_bits_target": a["effective_bits_target"], "plan_id": a["plan"].id,
                  "label": a["plan"].label(), "effective_bits": a["plan"].effective_bits(groups),
                  "kl_over_budget": norm(a["plan"])[0], "energy_over_bf16": norm(a["plan"])[1],
                  "time_s": a["time_s"]} for a in aq]

    guided_plans = [p for p in all_plans[: args.trials * len(args.seeds)]]
    for point in aq_points:
        kl = point["kl_over_budget"]
        at_most = [p for p in guided_plans if norm(p)[0] <= kl]
        best = min(at_most, key=lambda p: norm(p)[1]) if at_most else None
        point["guided_best_at_equal_or_lower_kl"] = None if best is None else {
            "plan_id": best.id, "label": best.label(), "kl_over_budget": norm(best)[0],
            "energy_over_bf16": norm(best)[1],
            "energy_at_most_autoquantize": norm(best)[1] <= point["energy_over_bf16"]}

    k40 = min(args.trials, 40) - 1
    result = {
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, CPU",
        "model": ctx.loaded.name,
        "proxy": f"KL vs BF16 on {ctx.tokens.heldout.numel()} held-out tokens (measured, CPU)",
        "energy": ctx.energy_model.label,
        "max_kl": args.max_kl,
        "objectives_normalization": "x = KL / max_kl, y = J/token / all-BF16 J/token; reference point (1, 1)",
        "reference": "union of every plan evaluated by any method and seed, plus exhaustive search over a coarse "
                     f"grouping (one format per projection role across all layers, {len(coarse)} plans)",
        "reference_hv": reference_hv,
        "seeds": args.seeds,
        "methods": methods,
        "at_40_trials": {m: {"hv": d["hv"][k40], "fraction_of_reference": d["hv"][k40] / reference_hv}
                         for m, d in methods.items() if len(d["hv"]) > k40},
        "uniform_points": uniform,
        "autoquantize_points": aq_points,
        "autoquantize_errors": aq_errors,
        "guided_best_at_budget": {"plan_id": guided_best.id, "label": guided_best.label(),
                                  "effective_bits": guided_best.effective_bits(groups),
                                  "kl_over_budget": norm(guided_best)[0], "energy_over_bf16": norm(guided_best)[1]},
        "sensitivity_time_s": sens.time_s,
        "distinct_plans_scored": len(ev.cache),
        "scoring_time_s": ev.time_s,
        "total_time_s": time.perf_counter() - t0,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "search_efficiency.json").write_text(json.dumps(result, indent=2))
    plot(result, args.out / "search_efficiency.png")
    print(json.dumps(result["at_40_trials"], indent=2))


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, d in result["methods"].items():
        ax.plot(d["trials"], d["hv"], label=f"{name} (mean of {len(d['hv_per_seed'])} seeds)")
    ax.axhline(result["reference_hv"], c="k", ls="--", lw=1, label="reference")
    ax.axhline(0.95 * result["reference_hv"], c="gray", ls=":", lw=1, label="95% of reference")
    ax.set_xlabel("trials")
    ax.set_ylabel("hypervolume (normalized)")
    ax.set_title("SmolLM2-135M, KL proxy + predicted B200 energy", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
