"""The same `advisor search` of a random-weight Llama-3.1-8B shape on 1, 2 and 4 GPUs of one host (`--workers N`:
a node of N ranks, one replica per GPU, sharing every stage before the trials; issue 58), side by side.

Steps (each its own call; state in ``--work``, the report rewritten after each, so a poll always finds a partial
one; ``node_search.sh`` runs them in the background):

* ``checkpoint``: random BF16 weights of the shape saved as a checkpoint (benchmarks/large_models.py builds it);
* ``plan``: `advisor search --dry-run --gpus 1 --json`: the memory plan of one replica (each GPU holds one);
* ``search``: for each count of ``--counts``, `advisor search --workers N` on the checkpoint (the same recipe,
  trials and seed); per stage its seconds and each GPU's busy seconds (summary.json's timings), the peak memory
  NVML saw on each GPU beside the plan's, the recommendation and every trial's values, and whether the token
  sets, the sensitivity tables and each plan scored in both runs equal the 1-GPU run's;
* ``all``: the steps in turn (``--dry-run``: the tiny shape on the CPU, 1 and 2 ranks over gloo).

    python benchmarks/device/node_search.py all --dry-run --work /tmp/ns --out /tmp/ns/out
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from _report import md_table, read_report, write_report  # noqa: E402
from large_models import SHAPES, GpuMemoryPeak, make_checkpoint  # noqa: E402
from large_models_multi_gpu import machine  # noqa: E402  (this script's folder)

ADVISOR = [sys.executable, "-c", "from advisor.cli import main; main()"]
STEPS = ("checkpoint", "plan", "search")
REPORT = "node_search"
STAGES = ("load", "tokens", "calibration", "bank", "reference", "sensitivity", "trials")


def load(out: Path) -> dict[str, Any]:
    return read_report(out / f"{REPORT}.json")


def save(out: Path, data: dict[str, Any]) -> None:
    write_report(out / f"{REPORT}.json", data, render, echo=False)


def folder(args: argparse.Namespace) -> Path:
    return args.work / args.shape


def base_args(args: argparse.Namespace) -> list[str]:
    return ["search", "--model", str(folder(args)), "--target", args.target, "--formats", args.formats,
            "--recipe", str(args.recipe), "--device", args.device]


def step_checkpoint(args: argparse.Namespace) -> dict[str, Any]:
    t = time.perf_counter()
    ck = make_checkpoint(args.shape, folder(args), args.tokenizer, args.device)
    size = sum(f.stat().st_size for f in ck.glob("*.safetensors"))
    return {"folder": str(ck), "weights_gib": round(size / 2**30, 2), "seconds": round(time.perf_counter() - t, 1)}


def step_plan(args: argparse.Namespace) -> dict[str, Any]:
    cmd = [*base_args(args), "--dry-run", "--gpus", "1", "--json"]
    done = subprocess.run([*ADVISOR, *cmd], capture_output=True, text=True)
    plan = json.loads(done.stdout) if done.returncode in (0, 3) and done.stdout.strip() else {}
    return {"command": "advisor " + " ".join(cmd), "rc": done.returncode, "fits": plan.get("fits"),
            "replica_gib": [round(d["used_bytes"] / 2**30, 2) for d in plan.get("devices", [])]}


def _fingerprint(path: Path) -> str | None:
    """A digest of a run's token sets (the tensors' bytes), to tell whether two runs scored the same tokens."""
    if not path.is_file():
        return None
    import torch

    data = torch.load(path)
    digest = hashlib.sha256()
    for key in ("calibration", "heldout"):
        digest.update(data[key].numpy().tobytes())
    return digest.hexdigest()[:16]


def _trials(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"trial": t["trial"], "plan_id": t["plan_id"], "label": t["label"], "kl": t["kl"], "ppl": t["ppl"],
             "j_per_token": t["energy"][0]["j_per_token"]} for t in summary.get("trials", [])]


def search_once(args: argparse.Namespace, gpus: int) -> dict[str, Any]:
    name = f"{args.shape}-{gpus}gpu"
    cmd = [*base_args(args), "--trials", str(args.trials), "--energy", "predicted", "--workers", str(gpus),
           "--out", str(args.work / "runs"), "--name", name]
    t = time.perf_counter()
    with GpuMemoryPeak() as peaks, (args.work / f"{name}.log").open("w") as log:
        rc = subprocess.run([*ADVISOR, *cmd], stdout=log, stderr=subprocess.STDOUT).returncode
    run = args.work / "runs" / name
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else {}
    sens = run / "sensitivity.json"
    rec = summary.get("recommendation") or {}
    return {"gpus": gpus, "command": "advisor " + " ".join(cmd), "rc": rc,
            "wall_s": round(time.perf_counter() - t, 1), "timings_s": summary.get("timings_s", {}),
            "peak_gib_per_gpu": [round(b / 2**30, 2) for b in peaks.per_gpu_bytes[:gpus]],
            "recommendation": {k: rec.get(k) for k in ("plan_id", "label", "kl")} if rec else None,
            "trials": _trials(summary), "tokens_digest": _fingerprint(run / "tokens.pt"),
            "sensitivity_damage": json.loads(sens.read_text())["sensitivity"]["damage"] if sens.is_file() else None}


def compare(one: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """What the N-GPU run shares with the 1-GPU run: the token sets, the sensitivity tables, the KL of each plan
    both scored (bit for bit: the node's promise), and the recommendation."""
    kl_one = {t["plan_id"]: t["kl"] for t in one["trials"]}
    common = [t for t in other["trials"] if t["plan_id"] in kl_one]
    return {"same_tokens": one["tokens_digest"] == other["tokens_digest"],
            "same_sensitivity": one["sensitivity_damage"] == other["sensitivity_damage"],
            "plans_in_both": len(common), "same_kl_in_both": all(kl_one[t["plan_id"]] == t["kl"] for t in common),
            "same_recommendation": (one["recommendation"] or {}).get("plan_id")
            == (other["recommendation"] or {}).get("plan_id")}


def step_search(args: argparse.Namespace, data: dict[str, Any]) -> list[dict[str, Any]]:
    runs = {r["gpus"]: r for r in data.get("search", [])}
    for gpus in args.counts:
        print(f"search on {gpus} GPUs {time.strftime('%H:%M:%S')}", flush=True)
        runs[gpus] = search_once(args, gpus)
        if 1 in runs and gpus != 1:
            runs[gpus]["against_1_gpu"] = compare(runs[1], runs[gpus])
        data["search"] = [runs[g] for g in sorted(runs)]
        save(args.out, data)
    return data["search"]


def _cell(timings: dict[str, Any], stage: str) -> str:
    wall, busy = timings.get(f"{stage}_s"), timings.get(f"{stage}_busy_s")
    text = "-" if wall is None else f"{wall:.1f}"
    return text + (f" ({', '.join(f'{b:.1f}' for b in busy)})" if busy else "")


def render(d: dict[str, Any]) -> str:
    lines = [f"# One search on 1, 2 and 4 GPUs of a node ({d.get('gpu_count', '?')}x {d.get('gpu', '?')})", "",
             f"Measured on **{d.get('gpu_count', '?')}x {d.get('gpu', '?')}**, driver {d.get('driver', '?')}, "
             f"{d.get('date', '?')}; a random-weight {d.get('shape', '?')} shape; `{d.get('command', '')}`. "
             "`--workers N`: N ranks, one replica per GPU, sharing every stage before the trials "
             "([docs/distributed.md](../../docs/distributed.md#the-node-every-gpu-in-every-stage)).", ""]
    plan = d.get("plan", {})
    if plan:
        lines += [f"- Memory plan of one replica (`{plan['command']}`): fits {plan['fits']}, "
                  f"{plan['replica_gib']} GiB.", ""]
    runs = d.get("search", [])
    if runs:
        lines += ["Seconds per stage (rank 0's wall clock), with each GPU's busy seconds in brackets:", ""]
        lines += md_table(["GPUs", "rc", "wall s", *STAGES, "peak GiB per GPU (NVML)"],
                          [[str(r["gpus"]), str(r["rc"]), f"{r['wall_s']:.1f}",
                            *(_cell(r["timings_s"], s) for s in STAGES), str(r["peak_gib_per_gpu"])] for r in runs])
        lines += ["", "## Recommendation and trials", ""]
        for r in runs:
            rec = r["recommendation"] or {}
            same = r.get("against_1_gpu")
            lines += [f"- {r['gpus']} GPU(s): `{r['command']}`; recommendation `{rec.get('plan_id')}` "
                      f"({rec.get('label')}, KL {rec.get('kl')})" + (f"; against 1 GPU: {same}" if same else "")]
        lines += ["", *md_table(["GPUs", "trial", "plan", "label", "KL", "ppl", "J/token"],
                                [[str(r["gpus"]), str(t["trial"]), f"`{t['plan_id']}`", t["label"], f"{t['kl']:.6f}",
                                  f"{t['ppl']:.4f}", f"{t['j_per_token']:.6g}"] for r in runs for t in r["trials"]],
                                "llllrrr")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=[*STEPS, "all", "render"])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    ap.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4], help="GPUs (ranks) of each search")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--target", default="b200", help="what the search prices for (b200: NVFP4 native)")
    ap.add_argument("--formats", default="bf16,fp8,nvfp4")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--recipe", type=Path, default=ROOT / "benchmarks" / "device" / "node_search.yaml")
    ap.add_argument("--tokenizer", type=Path, default=ROOT.parent / "shared" / "models" / "tinystories-656k")
    ap.add_argument("--work", type=Path, default=Path("/tmp/ns"))
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    ap.add_argument("--dry-run", action="store_true", help="the tiny shape on the CPU, 1 and 2 ranks (gloo)")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        args.shape, args.device, args.formats, args.target, args.counts = "tiny", "cpu", "bf16,fp8", "h100", [1, 2]
        args.trials = min(args.trials, 4)
        recipe = yaml.safe_load(args.recipe.read_text())  # fewer, shorter token windows: a minute on 2 cores
        recipe["calibration"] = {"num_samples": 12, "seq_len": 32, "heldout_samples": 8, "heldout_seq_len": 32}
        args.recipe = args.work / "dry_run.yaml"
        args.recipe.write_text(yaml.safe_dump(recipe))
    data = load(args.out)
    data.update(machine(), date=time.strftime("%Y-%m-%d"), shape=args.shape,
                command="python benchmarks/device/node_search.py " + " ".join(argv or sys.argv[1:]))
    for step in STEPS if args.step == "all" else [] if args.step == "render" else [args.step]:
        print(f"{step} start {time.strftime('%H:%M:%S')}", flush=True)
        if step == "search":
            step_search(args, data)
        else:
            data[step] = {"checkpoint": step_checkpoint, "plan": step_plan}[step](args)
        save(args.out, data)
    save(args.out, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
