"""A Llama-3.1-70B-shaped model over the GPUs of one node: the search end to end, then its all-BF16 and all-FP8
plans served by vLLM with tensor parallelism over the same GPUs, beside the advisor's prediction for that count.

Steps (each its own call; state in ``--work``, the report rewritten after each, so a poll always finds a partial
one; ``large_models_multi_gpu.sh`` runs them in the background):

* ``checkpoint``: random BF16 weights of the shape saved as a checkpoint (benchmarks/large_models.py builds it);
* ``plan``: `advisor search --dry-run --gpus N --gpu-memory GB --json`: the memory plan per GPU;
* ``search``: `advisor search` on the checkpoint (trimmed trial budget, never the model), per-stage seconds from
  its summary, the peak memory NVML saw on each GPU beside the plan's;
* ``export``: the search's all-FP8 baseline exported (`advisor export`); all-BF16 is served from the checkpoint
  itself (an all-BF16 export writes the same weights, and the disk holds one copy);
* ``serve``: each served by vLLM over N GPUs (tp=N, every GPU metered) at each batch (512 tokens in, 256 out),
  beside the prediction for N GPUs, and what the prediction missed (time per token, power);
* ``all``: the steps in turn (``--dry-run``: the tiny shape on CPU, the fake vllm module, fake counters).

    python benchmarks/device/large_models_multi_gpu.py all --dry-run --work /tmp/mg --out /tmp/mg/out
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from _report import md_table, read_report, write_report  # noqa: E402
from large_models import SHAPES, GpuMemoryPeak, make_checkpoint  # noqa: E402

from advisor.energy.meter import MeterConfig  # noqa: E402

ADVISOR = [sys.executable, "-c", "from advisor.cli import main; main()"]
STEPS = ("checkpoint", "plan", "search", "export", "serve")
METER = MeterConfig(warmup_s=3.0, min_window_s=5.0, repeats=3, max_cv=0.02, attempts=2)
DRY_METER = MeterConfig(warmup_s=0.5, min_window_s=0.3, min_ticks=20, repeats=3, idle_s=0.05, max_cv=0.5)
REPORT = "large_models_multi_gpu"


def machine() -> dict[str, Any]:
    """``gpu``, GPU count and ``driver`` (nvidia-smi), or the CPU stand-in of a dry run."""
    try:
        rows = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, check=True).stdout.strip().splitlines()
    except (OSError, subprocess.CalledProcessError):
        return {"gpu": "none (dry run on CPU)", "gpu_count": 0, "driver": "none"}
    name, driver = (v.strip() for v in rows[0].split(","))
    return {"gpu": name, "gpu_count": len(rows), "driver": driver}


def load(out: Path) -> dict[str, Any]:
    return read_report(out / f"{REPORT}.json")


def save(out: Path, data: dict[str, Any]) -> None:
    write_report(out / f"{REPORT}.json", data, render, echo=False)


def _advisor(args: list[str], log: Path) -> tuple[int, float, str]:
    """(exit code, seconds, stdout) of one advisor command, its stderr in ``log``."""
    t = time.perf_counter()
    with log.open("a") as err:
        done = subprocess.run([*ADVISOR, *args], stdout=subprocess.PIPE, stderr=err, text=True)
    return done.returncode, round(time.perf_counter() - t, 1), done.stdout


def folder(args: argparse.Namespace) -> Path:
    return args.work / args.shape


def step_checkpoint(args: argparse.Namespace) -> dict[str, Any]:
    t = time.perf_counter()
    ck = make_checkpoint(args.shape, folder(args), args.tokenizer, "cpu")  # 141 GB: host memory, not one GPU
    size = sum(f.stat().st_size for f in ck.glob("*.safetensors"))
    return {"folder": str(ck), "weights_gib": round(size / 2**30, 2), "seconds": round(time.perf_counter() - t, 1)}


def search_args(args: argparse.Namespace) -> list[str]:
    return ["search", "--model", str(folder(args)), "--target", args.target, "--formats", args.formats,
            "--out", str(args.work / "runs"), "--name", args.shape, "--recipe", str(args.recipe)]


def step_plan(args: argparse.Namespace) -> dict[str, Any]:
    cmd = [*search_args(args), "--dry-run", "--gpus", str(args.gpus), "--gpu-memory", str(args.gpu_memory), "--json"]
    rc, seconds, stdout = _advisor(cmd, args.work / "plan.log")
    plan = json.loads(stdout) if rc in (0, 3) and stdout.strip() else {}
    return {"command": "advisor " + " ".join(cmd), "rc": rc, "seconds": seconds, "fits": plan.get("fits"),
            "used_gib_per_gpu": [round(d["used_bytes"] / 2**30, 2) for d in plan.get("devices", [])]}


def step_search(args: argparse.Namespace) -> dict[str, Any]:
    # energy predicted: the search's bank holds the GPUs vLLM would need for a measured tier (the served numbers
    # come from the serve step, on the same GPUs once the search has ended)
    cmd = [*search_args(args), "--device", args.device, "--trials", str(args.trials), "--energy", "predicted"]
    with GpuMemoryPeak() as peaks:
        rc, seconds, _ = _advisor(cmd, args.work / "search.log")
    summary_path = args.work / "runs" / args.shape / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    return {"command": "advisor " + " ".join(cmd), "rc": rc, "wall_s": seconds,
            "stages_s": summary.get("timings_s", {}), "trials": len(summary.get("trials", [])),
            "peak_gib_per_gpu": [round(b / 2**30, 2) for b in peaks.per_gpu_bytes]}


def _baseline(summary: dict[str, Any], fmt: str) -> dict[str, Any]:
    return next(t for t in summary["trials"] if set(t["formats"].values()) == {fmt})


def step_export(args: argparse.Namespace) -> dict[str, Any]:
    run = args.work / "runs" / args.shape
    fp8 = _baseline(json.loads((run / "summary.json").read_text()), "fp8")
    out = args.work / "exports" / "all-fp8"
    if (out / "config.json").is_file():
        return {"all-fp8": {"folder": str(out), "plan_id": fp8["plan_id"], "rc": 0, "seconds": 0.0, "reused": True}}
    cmd = ["export", str(run), "--plan", fp8["plan_id"], "--out", str(out), "--no-smoke-test"]
    rc, seconds, _ = _advisor(cmd, args.work / "export.log")
    return {"all-fp8": {"folder": str(out), "plan_id": fp8["plan_id"], "rc": rc, "seconds": seconds,
                        "command": "advisor " + " ".join(cmd)}}


def _runner(args: argparse.Namespace) -> Any:
    """Each checkpoint served in a process of its own; a dry run serves in this one, on fake counters."""
    if not args.dry_run:
        from advisor.deploy.vllm import run_in_child

        return lambda job: run_in_child(job, timeout_s=3000.0)
    from advisor.deploy.vllm import serve
    from advisor.energy.meter import SummedCounter
    from advisor.testing_vllm import ConstantPowerCounter

    return lambda job: serve(job, make_counter=lambda: SummedCounter(
        [ConstantPowerCounter(300.0) for _ in range(job.tensor_parallel_size)]))


def step_serve(args: argparse.Namespace, data: dict[str, Any]) -> list[dict[str, Any]]:
    from advisor.cli.energy import shape_from_model
    from advisor.deploy.vllm import ServeJob
    from advisor.energy.prediction import predicted_for_gpus
    from advisor.formats import GPU, Format
    from advisor.plan import Plan
    from advisor.recipe.schema import Workload

    shape = shape_from_model(str(folder(args)))
    kind = GPU(args.serve_target)
    model = predicted_for_gpus(shape, kind, args.gpus)
    workloads = [Workload(name=f"b{b}", batch_size=b, input_tokens=512, output_tokens=256) for b in args.batches]
    served = {"all-bf16": folder(args), "all-fp8": Path(data["export"]["all-fp8"]["folder"])}
    rows = []
    for name, ck in served.items():
        job = ServeJob(str(ck), vocab_size=shape.vocab_size, workloads=tuple(w.model_dump() for w in workloads),
                       formats=True, tensor_parallel_size=args.gpus,
                       meter=asdict(DRY_METER if args.dry_run else METER))
        t = time.perf_counter()
        try:
            out = _runner(args)(job)
        except Exception as exc:  # noqa: BLE001 (recorded: the next plan is still served)
            rows.append({"plan": name, "error": f"{type(exc).__name__}: {exc}"})
            continue
        methods = sorted({v["method"] for v in out.get("served", {}).values()})
        plan = Plan.uniform(shape.groups, Format.BF16 if name == "all-bf16" else Format.FP8)
        for w in workloads:
            r, p = out["energy"][w.name], model.estimate(plan, w)
            rows.append({"plan": name, "batch": w.batch_size, "gpus": args.gpus,
                         "vllm_j_per_token": r["j_per_token"], "vllm_tokens_per_s": r["tokens_per_s"],
                         "vllm_power_w": r["j_per_token"] * r["tokens_per_s"], "batch_full": r["batch_full"],
                         "unstable": r["measurement"]["unstable"], "tpot_ms_p50": r.get("tpot_ms_p50"),
                         "gpu_state": r["measurement"]["gpu_after"],
                         "predicted_j_per_token": p.j_per_token, "predicted_tokens_per_s": p.decode_tokens_per_s,
                         "predicted_source": p.source, **missed(r, p.j_per_token, p.decode_tokens_per_s),
                         "served_methods": methods, "load_s": round(out["load_s"], 1),
                         "seconds": round(time.perf_counter() - t, 1), "vllm_version": out["vllm_version"]})
    return rows


def missed(row: dict[str, Any], j_pred: float, tps_pred: float) -> dict[str, float]:
    """How far the prediction is from vLLM (+: above), split into the time per token and the power: J/token is
    power over tokens/s, so (1 + J miss) = (1 + power miss) / (1 + tokens/s miss)."""
    power_pred = j_pred * tps_pred
    power = row["j_per_token"] * row["tokens_per_s"]
    return {"j_miss_pct": 100 * (j_pred / row["j_per_token"] - 1),
            "tokens_per_s_miss_pct": 100 * (tps_pred / row["tokens_per_s"] - 1),
            "power_miss_pct": 100 * (power_pred / power - 1)}


def render(d: dict[str, Any]) -> str:
    lines = [f"# A Llama-3.1-70B shape over the GPUs of one node ({d.get('gpu_count', '?')}x {d.get('gpu', '?')})", "",
             f"Measured on **{d.get('gpu_count', '?')}x {d.get('gpu', '?')}**, driver {d.get('driver', '?')}, "
             f"{d.get('date', '?')}; random weights; `{d.get('command', '')}`.", ""]
    if "plan" in d:
        p = d["plan"]
        lines += [f"- Memory plan (`{p['command']}`): fits {p['fits']}, per GPU {p['used_gib_per_gpu']} GiB."]
    if "search" in d:
        s = d["search"]
        lines += [f"- Search (`{s['command']}`): rc {s['rc']}, {s['wall_s']} s, {s['trials']} trials; stages (s): "
                  f"{s['stages_s']}; peak per GPU (NVML) {s['peak_gib_per_gpu']} GiB beside the plan's "
                  f"{d.get('plan', {}).get('used_gib_per_gpu')}."]
    if "export" in d:
        lines += [f"- Export all-FP8: rc {d['export']['all-fp8']['rc']}, {d['export']['all-fp8']['seconds']} s; "
                  "all-BF16 served from the checkpoint itself."]
    rows = [r for r in d.get("serve", []) if "error" not in r]
    if rows:
        lines += ["", "## Served by vLLM with tensor parallelism (512 in / 256 out)", ""]
        lines += md_table(["plan", "batch", "GPUs", "vLLM J/token", "predicted J/token", "J miss", "tokens/s miss",
                           "power miss", "batch full", "stable"],
                          [[r["plan"], str(r["batch"]), str(r["gpus"]), f"{r['vllm_j_per_token']:.4f}",
                            f"{r['predicted_j_per_token']:.4f}", f"{r['j_miss_pct']:+.1f}%",
                            f"{r['tokens_per_s_miss_pct']:+.1f}%", f"{r['power_miss_pct']:+.1f}%",
                            str(r["batch_full"]), str(not r["unstable"])] for r in rows], "lllrrrrrll")
        lines += ["", f"Prediction: {rows[0]['predicted_source']}", "",
                  "A miss splits into time and power: J/token is power over tokens/s (vLLM's tokens/s counts the "
                  "prefills that ride along; the prediction's is decode only)."]
    for r in d.get("serve", []):
        if "error" in r:
            lines += [f"- {r['plan']}: not served ({r['error']})"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=[*STEPS, "all", "render"])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-70b")
    ap.add_argument("--gpus", type=int, default=4, help="GPUs of the node: the memory plan's and vLLM's tp")
    ap.add_argument("--gpu-memory", type=float, default=80.0, help="GiB per GPU, for the memory plan")
    ap.add_argument("--trials", type=int, default=8, help="the search's trial budget (trimmed; the model never)")
    ap.add_argument("--target", default="b200", help="what the search prices for (b200: NVFP4 native)")
    ap.add_argument("--serve-target", default="h100", help="the GPU kind the served numbers are predicted for")
    ap.add_argument("--formats", default="bf16,fp8,nvfp4")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--recipe", type=Path, default=ROOT / "benchmarks" / "device" / "large_models_multi_gpu.yaml")
    ap.add_argument("--tokenizer", type=Path, default=ROOT.parent / "shared" / "models" / "tinystories-656k")
    ap.add_argument("--work", type=Path, default=Path("/tmp/mg"))
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    ap.add_argument("--dry-run", action="store_true", help="the tiny shape on CPU, the fake vllm module")
    args = ap.parse_args(argv)
    if args.dry_run:
        from advisor.testing_vllm import fake_vllm

        sys.modules["vllm"] = fake_vllm(step_s=0.001)
        args.shape, args.device, args.formats, args.target = "tiny", "cpu", "bf16,fp8", "h100"
    args.work.mkdir(parents=True, exist_ok=True)
    data = load(args.out)
    data.update(machine(), date=time.strftime("%Y-%m-%d"), shape=args.shape,
                command="python benchmarks/device/large_models_multi_gpu.py " + " ".join(argv or sys.argv[1:]))
    for step in STEPS if args.step == "all" else [] if args.step == "render" else [args.step]:
        print(f"{step} start {time.strftime('%H:%M:%S')}", flush=True)
        data[step] = {"checkpoint": step_checkpoint, "plan": step_plan, "search": step_search,
                      "export": step_export}[step](args) if step != "serve" else step_serve(args, data)
        save(args.out, data)
    save(args.out, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
