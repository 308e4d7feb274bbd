"""Does a second GPU make `advisor search` faster? The product path, timed: `advisor search --energy measured`
(the command a user runs) with --workers 1, 2 (and 4) on one host, on a random-weight Llama of SmolLM2-135M's
layer shapes (vocabulary 2048: the tokenizer of ../shared/models/tinystories-656k). Writes
reports/benchmarks/distributed_gpu.{json,md} in two steps, since one device command runs at most 10 minutes:

    python benchmarks/device/distributed_gpu.py run --workers 2 --label warmup --work /tmp/q41 --out $OUT
    python benchmarks/device/distributed_gpu.py collect RUN_JSON... --out reports/benchmarks

``run`` times one search and keeps, from its summary.json, the per-stage seconds, the plans measured on each
GPU and whether the GPUs' all-BF16 agree; ``collect`` puts the runs side by side with the speed-up of each
warm N-worker run over the warm 1-worker run. benchmarks/device/distributed_gpu.sh is the device wrapper.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECIPE = Path(__file__).with_suffix(".yaml")
SHAPE = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
         "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 2048, "max_position_embeddings": 8192,
         "tie_word_embeddings": True, "rms_norm_eps": 1e-5}
STAGES = ("load_s", "tokens_s", "calibration_s", "reference_s", "energy_models_s", "sensitivity_s", "trials_s",
          "measured_s", "total_s")


def build_model(tokenizer_dir: Path, dest: Path) -> Path:
    """The random SmolLM2-135M-shaped model (seed 0), saved once per machine."""
    if (dest / "config.json").is_file():
        return dest
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**SHAPE)).to(torch.bfloat16).save_pretrained(dest)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(dest)
    return dest


def gpus() -> list[dict[str, str]]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,uuid,driver_version,power.limit",
                              "--format=csv,noheader"], capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:  # no NVIDIA driver here
        return []
    keys = ("index", "name", "uuid", "driver", "power_limit")
    return [dict(zip(keys, (v.strip() for v in line.split(",")), strict=False)) for line in out.splitlines() if line]


def meterings_per_gpu(summary: dict) -> dict[str, int]:
    """How many times each GPU ran the meter: its plans, its own all-BF16 where that plan was another GPU's
    (each GPU compares against its own) and its drift check (all-BF16 again at its end)."""
    trials = {t["trial"]: t for t in summary.get("trials", [])}
    reference = trials.get(summary.get("baselines", {}).get("all-bf16"), {}).get("plan_id")
    drifts = [d["source"].rsplit(" on ", 1)[-1] for d in summary.get("measured_drift", [])]
    return {u["gpu_uuid"] or u["gpu"]: len(u["plans"]) + (reference not in u["plans"]) + drifts.count(u["gpu_uuid"])
            for u in summary.get("measured_units", [])}


def run(args: argparse.Namespace) -> None:
    work, out = Path(args.work), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = build_model(Path(args.tokenizer), work / "model")
    name = f"w{args.workers}-{args.label}"
    here = gpus()
    target = "h200" if here and "H200" in here[0]["name"] else "h100"
    argv = ["search", "-r", str(RECIPE.relative_to(ROOT)), "--model", str(model), "--target", target,
            "--workers", str(args.workers), "--energy", "measured", "--trials", str(args.trials),
            "--out", str(work / "runs"), "--name", name]
    env = {**os.environ, "ADVISOR_PROFILE_DIR": str(work / "profiles"), "NCCL_NVLS_ENABLE": "0"}
    t0 = time.perf_counter()
    with open(out / f"log_{name}.txt", "w") as log:
        proc = subprocess.run([sys.executable, "-c", "from advisor.cli import main; main()", *argv], cwd=ROOT,
                              env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    wall = time.perf_counter() - t0
    run_dir = work / "runs" / name
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    timings = summary.get("timings_s", {})
    record = {
        "workers": args.workers, "label": args.label, "trials": args.trials, "wall_s": round(wall, 1),
        "exit_code": proc.returncode, "command": "advisor " + " ".join(argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "gpus": here,
        "stages_s": {k: round(float(timings[k]), 1) for k in STAGES if k in timings},
        "plans_measured_per_gpu": {u["gpu_uuid"] or u["gpu"]: len(u["plans"])
                                   for u in summary.get("measured_units", [])},
        "meterings_per_gpu": meterings_per_gpu(summary),
        "unit_agreement": summary.get("unit_agreement"),
        "drift_checks": [{"source": d["source"], "drift_pct": d["drift_pct"]}
                         for d in summary.get("measured_drift", [])],
        "recommendation": (summary.get("recommendation") or {}).get("label"),
    }
    (out / f"run_{name}.json").write_text(json.dumps(record, indent=2))
    for kept in [run_dir / "summary.json", *sorted((run_dir / "workers").glob("*.log"))]:
        if kept.is_file():  # the evidence beside the numbers
            shutil.copy(kept, out / f"{name}_{kept.name}")
    print(json.dumps({k: record[k] for k in ("workers", "label", "wall_s", "exit_code", "stages_s",
                                             "plans_measured_per_gpu")}, indent=1))
    if proc.returncode != 0:
        sys.exit(f"advisor search exited with {proc.returncode}; see {out / f'log_{name}.txt'}")


def host_gpus(run: dict) -> tuple[str, ...]:
    """The machine a run was made on: the UUIDs of the GPUs it saw."""
    return tuple(g["uuid"] for g in run["gpus"])


def collect(args: argparse.Namespace) -> None:
    runs = [json.loads(Path(p).read_text()) for p in args.runs]
    bases = {host_gpus(r): r for r in runs if r["workers"] == 1 and r["label"] != "warmup"}
    for r in runs:
        base = bases.get(host_gpus(r))  # rows are compared within one machine only
        r["speedup_vs_1_worker"] = round(base["wall_s"] / r["wall_s"], 2) if base and r["label"] != "warmup" else None
        measured = r["stages_s"].get("measured_s")
        base_measured = base["stages_s"].get("measured_s") if base else None
        r["measured_tier_speedup"] = round(base_measured / measured, 2) if measured and base_measured and \
            r["label"] != "warmup" else None
        # the busiest GPU's meterings against one GPU's: the measured tier's speed-up when every metering takes as long
        meterings, base_meterings = r.get("meterings_per_gpu"), base and base.get("meterings_per_gpu")
        r["meterings_bound_speedup"] = (round(sum(base_meterings.values()) / max(meterings.values()), 2)
                                        if meterings and base_meterings and r["label"] != "warmup" else None)
    first = runs[0]["gpus"][0] if runs and runs[0]["gpus"] else {}
    data = {"benchmark": "distributed_gpu", "path": "product (advisor search --energy measured)",
            "gpu": first.get("name"), "driver": first.get("driver"), "model": "random Llama, SmolLM2-135M shapes",
            "shape": SHAPE, "recipe": str(RECIPE.relative_to(ROOT)), "target_speedup_2_gpus": 1.8, "runs": runs}
    out = Path(args.out)
    (out / "distributed_gpu.json").write_text(json.dumps(data, indent=2) + "\n")
    stage_cols = [s for s in STAGES if any(s in r["stages_s"] for r in runs)]
    machines = " and ".join(dict.fromkeys(f"{len(r['gpus'])} x {r['gpus'][0]['name']}" for r in runs if r["gpus"]))
    lines = [f"# `advisor search --energy measured` on {machines}", "",
             f"Driver {data['driver']}; {data['model']}; recipe `{data['recipe']}`. Each row is one run of the "
             "command below (its own study); `warmup` runs first on each machine so that per-model profiles, Triton "
             "and the page cache are warm for the rows compared. Speed-up: the warm 1-worker run's wall time on the "
             "same machine over the row's (target 1.8x with 2 GPUs).", "",
             "Meterings: each GPU meters its plans, its own all-BF16 where that plan went to another GPU, and "
             "all-BF16 again at its end (its drift check); the measured tier's bound is the 1-worker run's meterings "
             "over the busiest GPU's.", "",
             "| GPUs here | workers | label | trials | wall s | speed-up | measured tier speed-up | plans per GPU | "
             "meterings per GPU | bound | " + " | ".join(stage_cols) + " |",
             "|" + "---|" * (10 + len(stage_cols))]
    for r in runs:
        per_gpu = ", ".join(f"{k[-8:]}: {v}" for k, v in r["plans_measured_per_gpu"].items())
        meter_cells = ", ".join(f"{k[-8:]}: {v}" for k, v in (r.get("meterings_per_gpu") or {}).items()) or "-"
        lines.append(f"| {len(r['gpus'])} | {r['workers']} | {r['label']} | {r['trials']} | {r['wall_s']:.1f} | "
                     f"{r['speedup_vs_1_worker'] or '-'} | {r['measured_tier_speedup'] or '-'} | {per_gpu} | "
                     f"{meter_cells} | {r.get('meterings_bound_speedup') or '-'} | "
                     + " | ".join(str(r["stages_s"].get(s, "-")) for s in stage_cols) + " |")
    lines += ["", "Commands:", ""] + [f"- `{r['command']}` (exit {r['exit_code']}, {r['date']})" for r in runs]
    lines += ["", "Units (all-BF16 per GPU, against the largest drift a GPU showed against itself):", ""]
    lines += [f"- {r['workers']} workers, {r['label']}: {json.dumps(r['unit_agreement'])}" for r in runs
              if r.get("unit_agreement")]
    (out / "distributed_gpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    r = sub.add_parser("run", help="time one `advisor search --energy measured` run")
    r.add_argument("--workers", type=int, required=True)
    r.add_argument("--label", default="warm", help="warmup (first on a machine) or warm")
    r.add_argument("--trials", type=int, default=6)
    r.add_argument("--tokenizer", default=str(ROOT.parent / "shared" / "models" / "tinystories-656k"))
    r.add_argument("--work", required=True, help="model, profiles and runs (kept between calls on one machine)")
    r.add_argument("--out", required=True)
    c = sub.add_parser("collect", help="the runs side by side: distributed_gpu.{json,md}")
    c.add_argument("runs", nargs="+")
    c.add_argument("--out", default=str(ROOT / "reports" / "benchmarks"))
    args = parser.parse_args()
    run(args) if args.step == "run" else collect(args)


if __name__ == "__main__":
    main()
