"""Accuracy on a CPU in BF16 arithmetic and in float32 (advisor/models/arithmetic.py): time and KL.

On the same model and the same held-out tokens (read from a text file, so both arithmetics score the
same tokens; a self-sampled set would differ with the arithmetic that samples it), prepares a run in
each arithmetic (load, FP8 and NVFP4 calibration, BF16 reference) and scores all-FP8 and all-NVFP4, each
arithmetic in a fresh process. Writes a JSON + Markdown pair.

Usage:  python benchmarks/studies/cpu_arithmetic.py --text ../shared/data/text/tinystories_val.txt \
            --out reports/benchmarks/cpu_arithmetic.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _report import command_line, read_notes, write_report  # noqa: E402

ARITHMETICS = ("bfloat16", "float32")


def score(arithmetic: str, model: str, text: str, samples: int, seq_len: int, out_dir: str) -> dict:
    """One arithmetic, in this process: seconds per stage and KL of the uniform plans."""
    from advisor.formats import Format
    from advisor.models import arithmetic as arith
    from advisor.plan import Plan
    from advisor.recipe.schema import validate_recipe
    from advisor.workflows.context import prepare

    arith.cpu_has_bf16_matmul = lambda: arithmetic == "bfloat16"  # float32 where the CPU lacks BF16 products
    recipe = validate_recipe({
        "name": arithmetic, "model": {"source": model}, "target": "b200", "formats": ["bf16", "fp8", "nvfp4"],
        "calibration": {"source": text, "num_samples": samples, "seq_len": seq_len, "heldout_samples": samples,
                        "heldout_seq_len": seq_len},
        "energy": "predicted", "out": out_dir, "device": "cpu"})
    t = time.perf_counter()
    ctx = prepare(recipe)
    prepare_s = time.perf_counter() - t
    kl, trial_s = {}, {}
    for f in (Format.FP8, Format.NVFP4):
        t = time.perf_counter()
        kl[f.value] = ctx.evaluate(Plan.uniform(ctx.loaded.shape.groups, f)).kl
        trial_s[f.value] = time.perf_counter() - t
    return {"arithmetic": ctx.arithmetic, "scoring_place": ctx.scoring_place, "prepare_s": prepare_s,
            "timings_s": ctx.timings_s, "trial_s": trial_s, "kl": kl, "heldout_tokens": int(ctx.tokens.heldout.numel())}


def render(d: dict) -> str:
    rows = {r["arithmetic"]: r for r in d["runs"]}
    bf16, f32 = rows["bfloat16"], rows["float32"]
    lines = [
        "# Accuracy on a CPU: BF16 arithmetic against float32",
        "",
        f"Measured {d['date']} on {d['machine']} ({d['cpu']}; BF16 matrix instructions: {d['cpu_has_bf16']}), "
        f"torch {d['torch']}; command `{d['command']}`. Model `{d['model']}`, {bf16['heldout_tokens']} held-out "
        "tokens from the text file (the same tokens in both arithmetics), each arithmetic in its own process.",
        "",
        "| | BF16 arithmetic | float32 arithmetic | float32 / BF16 |",
        "|---|---:|---:|---:|",
        f"| prepare: load, calibrate FP8 and NVFP4, BF16 reference (s) | {bf16['prepare_s']:.1f} | "
        f"{f32['prepare_s']:.1f} | {f32['prepare_s'] / bf16['prepare_s']:.2f} |",
    ]
    for f in bf16["kl"]:
        lines.append(f"| one all-{f} trial (s) | {bf16['trial_s'][f]:.2f} | {f32['trial_s'][f]:.2f} | "
                     f"{f32['trial_s'][f] / bf16['trial_s'][f]:.2f} |")
    for f in bf16["kl"]:
        lines.append(f"| KL of all-{f} | {bf16['kl'][f]:.5f} | {f32['kl'][f]:.5f} | "
                     f"{f32['kl'][f] / bf16['kl'][f]:.3f} |")
    lines += ["", "## Notes", ""] + [f"- {n}" for n in d.get("notes", [])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo:smollm2-135m")
    ap.add_argument("--text", required=True, help="a .txt file: calibration and held-out tokens for both")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--notes", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--one", choices=ARITHMETICS, help=argparse.SUPPRESS)  # the child process's part
    ap.add_argument("--work", default="/tmp/cpu_arithmetic", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        args.out.write_text(json.dumps(score(args.one, args.model, args.text, args.samples, args.seq_len,
                                             f"{args.work}/{args.one}")))
        return 0
    import torch

    from advisor.models.arithmetic import cpu_has_bf16_matmul

    runs = []
    for a in ARITHMETICS:
        part = Path(f"{args.work}/{a}.json")
        part.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, __file__, "--one", a, "--model", args.model, "--text", args.text,
                        "--samples", str(args.samples), "--seq-len", str(args.seq_len), "--work", args.work,
                        "--out", str(part)], check=True)
        runs.append(json.loads(part.read_text()))
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").is_file() else ""
    d = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": f"{platform.machine()}, "
         f"{os.cpu_count()} CPUs", "cpu": cpu, "cpu_has_bf16": cpu_has_bf16_matmul(), "torch": torch.__version__,
         "command": command_line(argv), "model": args.model, "runs": runs, "notes": read_notes(args.notes)}
    write_report(args.out, d, render)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
