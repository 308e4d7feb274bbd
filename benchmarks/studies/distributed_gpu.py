"""Distributed search on one host with one worker per GPU, measured energy in every trial (a study: the
product meters only the front, through the measurement queue; benchmarks/device/distributed_gpu.py times that
path). Its report: reports/benchmarks/distributed_gpu_every_trial.{json,md}.

Checks two things on a machine with >= 2 GPUs (run where they are; writes JSON + Markdown):

1. Each worker reads its own GPU's energy counter: in a process pinned with
   ``CUDA_VISIBLE_DEVICES=i``, the UUID of torch's ``cuda:0`` equals the UUID of the GPU the
   NVML meter opened (found by UUID), and the workers' UUIDs differ.
2. Trials per hour with 2 workers (one per GPU, journal-file storage, one shared budget)
   against 1 worker on the same kind of study (target: >= 1.8x).

Every trial here measures its energy (NVML, the serving runtime, short meter windows), as
``--energy measured`` did before the two-tier search; that is the expensive case that makes
several GPUs worth having. The model is a random-weight Llama of SmolLM2-135M's layer shapes
with the tokenizer of a small real model (``--tokenizer DIR``; vocabulary 2048).

    python benchmarks/studies/distributed_gpu.py --tokenizer .gpu_carry/tinystories-656k --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SHAPE = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
         "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 2048, "max_position_embeddings": 8192,
         "tie_word_embeddings": True, "rms_norm_eps": 1e-5}
FAST_METER = {"warmup_s": 0.5, "min_window_s": 1.0, "min_ticks": 10, "repeats": 3}


def build_model(tokenizer_dir: Path, dest: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE)).to(torch.bfloat16)
    model.save_pretrained(dest)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(dest)
    return dest


def recipe_for(model_dir: Path, storage: str, trials: int, target: str, out: Path):
    from advisor.recipe import validate_recipe

    return validate_recipe({
        "name": "dist", "model": {"source": str(model_dir)}, "target": target, "formats": ["bf16", "fp8"],
        "workloads": [{"name": "chat", "batch_size": 16, "input_tokens": 256, "output_tokens": 128}],
        "calibration": {"num_samples": 4, "seq_len": 64, "heldout_samples": 4, "heldout_seq_len": 64},
        "search": {"trials": trials, "seed": 0, "sampler": "random", "heartbeat_s": 5},
        "storage": storage, "out": str(out), "device": "cuda", "energy": "predicted",
    })


def worker_main(args: argparse.Namespace) -> None:
    """One process: prepare, swap in the measured energy model, run trials from the shared budget."""
    import optuna

    from advisor.energy.measure import MeasuredEnergyModel
    from advisor.energy.meter import MeterConfig
    from advisor.formats import GPU
    from advisor.search.storage import open_storage
    from advisor.search.study import make_sampler, open_study, run_search
    from advisor.workflows.context import prepare

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    recipe = recipe_for(Path(args.model), args.storage, args.trials, args.target, Path(args.work))
    recipe.run_dir.mkdir(parents=True, exist_ok=True)
    if args.role == "coordinator":
        study = open_study(recipe, resume=False)
    else:
        storage = open_storage(args.storage, heartbeat_s=5)
        while True:
            try:
                study = optuna.load_study(study_name="dist", storage=storage,
                                          sampler=make_sampler("random", os.getpid()))
                break
            except KeyError:
                time.sleep(0.5)
    ctx = prepare(recipe)
    ctx.energy_model = MeasuredEnergyModel(ctx.loaded.shape, GPU(args.target), MeterConfig(**FAST_METER))
    study.set_user_attr(f"ready:{os.getpid()}", time.time())
    run_search(study, ctx, recipe, ctx.loaded.shape.groups, coordinator=args.role == "coordinator",
               worker=ctx.worker())


def uuid_probe() -> None:
    import torch

    from advisor.energy.meter import open_meter

    meter = open_meter(0)
    state = meter.counter.state()
    print(json.dumps({"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                      "torch_uuid": str(torch.cuda.get_device_properties(0).uuid),
                      "nvml_uuid": state.uuid, "nvml_index": state.index, "name": state.name}))


def spawn(role: str, gpu: int, storage: str, trials: int, model: Path, target: str, work: Path, log: Path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, __file__, "--_worker", role, "--storage", storage, "--trials", str(trials),
           "--model", str(model), "--target", target, "--work", str(work)]
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def run_phase(workers: int, trials: int, model: Path, target: str, tmp: Path, logs: Path) -> dict:
    import optuna

    from advisor.search.storage import open_storage

    storage = f"journal:{tmp / f'study-{workers}.journal'}"
    procs = [spawn("coordinator" if i == 0 else "worker", i, storage, trials, model, target, tmp / f"w{workers}-{i}",
                   logs / f"phase{workers}-worker{i}.log") for i in range(workers)]
    codes = [p.wait() for p in procs]
    study = optuna.load_study(study_name="dist", storage=open_storage(storage))
    done = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE]
    start = min(t.datetime_start for t in done)
    end = max(t.datetime_complete for t in done)
    wall = (end - start).total_seconds()
    by_worker: dict[str, int] = {}
    for t in done:
        w = t.user_attrs.get("worker", {})
        key = f"pid {w.get('pid')} gpu {w.get('gpu_uuid')}"
        by_worker[key] = by_worker.get(key, 0) + 1
    return {"workers": workers, "trials": len(done), "wall_s": round(wall, 1),
            "trials_per_hour": round(3600 * len(done) / wall, 1), "exit_codes": codes, "trials_by_worker": by_worker,
            "sources": sorted({e["source"] for t in done for e in t.user_attrs["energy"]})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", type=Path, default=ROOT / ".gpu_carry/tinystories-656k")
    ap.add_argument("--out", type=Path, default=ROOT / "reports/benchmarks")
    ap.add_argument("--trials-per-worker", type=int, default=8)
    ap.add_argument("--_worker", dest="role")
    ap.add_argument("--storage")
    ap.add_argument("--trials", type=int)
    ap.add_argument("--model")
    ap.add_argument("--target")
    ap.add_argument("--work")
    ap.add_argument("--_uuid", action="store_true")
    args = ap.parse_args()
    if args._uuid:
        return uuid_probe()
    if args.role:
        return worker_main(args)

    import torch

    from advisor.energy.meter import NvmlDevice
    from advisor.formats import gpu_from_device_name

    gpus = torch.cuda.device_count()
    if gpus < 2:
        raise SystemExit(f"needs >= 2 GPUs, found {gpus}")
    nv = NvmlDevice(0)
    target = gpu_from_device_name(nv.name).value
    tmp = Path("/tmp/distributed_gpu")
    logs = args.out / "distributed_logs"
    logs.mkdir(parents=True, exist_ok=True)
    model = build_model(args.tokenizer, tmp / "model")
    uuid_rows = []
    for i in range(2):
        out = subprocess.run([sys.executable, __file__, "--_uuid"], capture_output=True, text=True,
                             env={**os.environ, "CUDA_VISIBLE_DEVICES": str(i)})
        uuid_rows.append(json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0
                         else {"error": out.stderr[-500:]})
    norm = [r.get("torch_uuid", "").lower().removeprefix("gpu-") for r in uuid_rows]
    uuid_ok = all(r.get("nvml_uuid", "").lower().removeprefix("gpu-") == n for r, n in zip(uuid_rows, norm,
                                                                                             strict=True))
    uuid_check = {"per_process": uuid_rows, "torch_equals_nvml": uuid_ok, "distinct": len(set(norm)) == 2}
    n = args.trials_per_worker
    runs = [run_phase(1, n, model, target, tmp, logs), run_phase(2, 2 * n, model, target, tmp, logs)]
    speedup = runs[1]["trials_per_hour"] / runs[0]["trials_per_hour"]
    result = {
        "gpu": f"{gpus} x {nv.name}", "driver": nv.driver,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/studies/distributed_gpu.py " + " ".join(sys.argv[1:]),
        "model": f"random-weight Llama, SmolLM2-135M layer shapes, vocab 2048 ({SHAPE})",
        "meter": FAST_METER, "runs": runs, "speedup_trials_per_hour": round(speedup, 2), "target_speedup": 1.8,
        "uuid_check": uuid_check,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "distributed_gpu.json").write_text(json.dumps(result, indent=2))
    lines = [f"# Distributed search on {result['gpu']} ({result['date']})", "",
             f"Command: `{result['command']}`; driver {nv.driver}. Every trial measures its energy with NVML "
             f"(meter windows {FAST_METER}); one worker per GPU; Optuna journal-file storage.", "",
             "| workers | trials | wall s | trials/hour |", "|---|---|---|---|",
             *[f"| {r['workers']} | {r['trials']} | {r['wall_s']} | {r['trials_per_hour']} |" for r in runs], "",
             f"Speed-up: {speedup:.2f}x (target 1.8x).", "",
             f"UUID check: torch's device == the meter's NVML device in each process: {uuid_ok}; "
             f"the two workers' GPUs differ: {uuid_check['distinct']}.", ""]
    (args.out / "distributed_gpu.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
