"""Large model shapes end to end with random weights: the memory plan beside the memory a run takes, and the
packed bank's trials against the folded bank's.

``search`` saves a random-weight checkpoint of a published shape (safetensors, made on the device), prints
the plan (``advisor search --dry-run --json``), runs ``advisor search`` on it and records the wall clock, the
exit code, the per-stage seconds of its summary, the peak GPU memory (NVML, sampled) and the peak CPU memory.
``identical`` builds the folded and the packed bank of one shape, each in its own process, scores the same plans
with both (torch.equal on the logits, equal proxy scores) and records each bank's peak GPU memory.
Each run appends a record to OUT/large_models.json and rewrites OUT/large_models.md.

The search scores BF16, FP8 and NVFP4 accuracy (NVFP4 by ModelOpt's fake quantization, which also runs on
Hopper) and prices every trial for ``--target`` (b200: where NVFP4 runs natively; a search for an H100 target
refuses NVFP4). ``--measure-here`` then measures, with `advisor measure` on the GPU here (NVML, the serving
runtime), the J/token of the baselines and front plans that GPU can run natively (no NVFP4 group on Hopper),
and lists the NVFP4 plans with the search's predicted J/token, labelled so (``measure --summary S`` does this
alone, for a search that ran before). ``--gpu-memory GB`` caps the GPU
memory the search may use: layers beyond it stream from CPU memory (the run is named SHAPE-capGB).

Usage (from the repository root; a tokenizer folder, by default ../shared/models/tinystories-656k):
    python benchmarks/large_models.py search --shape qwen2.5-14b --trials 12 --measure-here
    python benchmarks/large_models.py search --shape qwen2.5-14b --trials 12 --gpu-memory 24
    python benchmarks/large_models.py identical --shape llama-3.1-8b
    python benchmarks/large_models.py measure --shape qwen3-30b-a3b --summary RUN/summary.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

LLAMA_8B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
            "rope_theta": 500000.0, "tie_word_embeddings": False}
SHAPES = {
    "tiny": {**LLAMA_8B, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2048},
    "tiny-moe": {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 128,
                 "intermediate_size": 256, "moe_intermediate_size": 64, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "num_experts": 8,
                 "num_experts_per_tok": 2, "vocab_size": 2048, "tie_word_embeddings": False},
    "llama-3.2-1b": {**LLAMA_8B, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "head_dim": 64, "tie_word_embeddings": True},
    "llama-3.1-8b": LLAMA_8B,
    "qwen2.5-14b": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 5120,
                    "intermediate_size": 13824, "num_hidden_layers": 48, "num_attention_heads": 40,
                    "num_key_value_heads": 8, "vocab_size": 152064, "max_position_embeddings": 131072,
                    "rope_theta": 1000000.0, "tie_word_embeddings": False},
    "llama-3.1-70b": {**LLAMA_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                      "num_attention_heads": 64, "num_key_value_heads": 8},
    "qwen3-30b-a3b": {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048,
                      "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
                      "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
                      "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
                      "tie_word_embeddings": False},
}
SHAPES["qwen3-30b-a3b-4layers"] = {**SHAPES["qwen3-30b-a3b"], "num_hidden_layers": 4}  # its experts, fast to build
FORMATS = "bf16,fp8,nvfp4"
ADVISOR = [sys.executable, "-c", "from advisor.cli import main; main()"]  # the GPU machines have no console script


def make_checkpoint(shape: str, folder: Path, tokenizer: Path, device: str) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if (folder / "config.json").is_file():
        return folder
    values = dict(SHAPES[shape])
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder, max_shard_size="5GB")
    for f in tokenizer.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, folder / f.name)
    return folder


def visible_handles(pynvml: Any) -> list[Any]:
    """NVML handles of the GPUs ``CUDA_VISIBLE_DEVICES`` names (indices or UUIDs), in its order; every GPU where
    it is unset. NVML itself ignores the variable, so two runs side by side on one node would see each other."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    names = [v.strip() for v in visible.split(",") if v.strip()]
    return [pynvml.nvmlDeviceGetHandleByIndex(int(v)) if v.isdigit() else pynvml.nvmlDeviceGetHandleByUUID(v)
            for v in names]


class GpuMemoryPeak:
    """The most memory NVML saw in use on each visible GPU (``per_gpu_bytes``, in torch's order; [] without NVML)
    and on any (``peak_bytes``; None without NVML), sampled every 0.2 s while the run lasts."""

    def __init__(self) -> None:
        self.per_gpu_bytes: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @property
    def peak_bytes(self) -> int | None:
        return max(self.per_gpu_bytes) if self.per_gpu_bytes else None

    def _sample(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handles = visible_handles(pynvml)
        except Exception:  # noqa: BLE001 (no NVML here: nothing to sample)
            return
        self.per_gpu_bytes = [0] * len(handles)
        while not self._stop.is_set():
            for i, h in enumerate(handles):
                self.per_gpu_bytes[i] = max(self.per_gpu_bytes[i], pynvml.nvmlDeviceGetMemoryInfo(h).used)
            time.sleep(0.2)

    def __enter__(self) -> GpuMemoryPeak:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_search(args: argparse.Namespace, folder: Path) -> dict:
    base = [*ADVISOR, "search", "--model", str(folder), "--target", args.target, "--formats", args.formats,
            "--device", args.device]
    cap = ["--gpu-memory", str(args.gpu_memory)] if args.gpu_memory else []
    dry = subprocess.run([*base, *cap, "--dry-run", "--json"], capture_output=True, text=True)
    plan = json.loads(dry.stdout) if dry.returncode in (0, 3) and dry.stdout.strip() else None
    name = f"{args.shape}-cap{args.gpu_memory:g}" if args.gpu_memory else args.shape
    command = [*base, *cap, "--trials", str(args.trials), "--energy", args.energy, "--out", str(args.work / "runs"),
               "--name", name]
    t = time.perf_counter()
    with GpuMemoryPeak() as gpu:
        rc = subprocess.run(command).returncode
    wall = round(time.perf_counter() - t, 1)
    summary_path = args.work / "runs" / name / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    record = {"model": name, "command": " ".join(command), "wall_s": wall,
              "rc": rc, "stages_s": summary.get("timings_s", {}),
              "peak_gpu_gib": gpu.peak_bytes / 2**30 if gpu.peak_bytes else None,
              "peak_gpu_gib_per_gpu": [b / 2**30 for b in gpu.per_gpu_bytes] or None,
              "peak_cpu_gib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20,
              "gpu_memory_cap_gib": args.gpu_memory,
              "plan_used_gib": [d["used_bytes"] / 2**30 for d in plan["devices"]] if plan else None,
              "plan_fits": plan["fits"] if plan else None,
              "plan_streams_from_cpu": plan.get("streams_from_cpu") if plan else None}
    if args.measure_here and summary:
        record["energy_here"] = measure_here(summary, folder)
    return record


def run_measure(args: argparse.Namespace, folder: Path) -> dict:
    """``--measure-here`` for a search that ran elsewhere (or ran out of its call's time): its summary, this
    shape's checkpoint (the weights' values do not change a BF16 or FP8 plan's energy)."""
    t = time.perf_counter()
    energy = measure_here(json.loads(args.summary.read_text()), folder)
    return {"model": args.shape, "command": " ".join(sys.argv), "rc": 0, "wall_s": round(time.perf_counter() - t, 1),
            "peak_gpu_gib": None, "peak_cpu_gib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20,
            "energy_here": energy}


def measure_here(summary: dict, folder: Path) -> list[dict]:
    """The baselines' and the front's J/token on the primary workload: measured on the GPU here (`advisor measure`)
    for the plans it runs natively, the search's predicted number (labelled so) for the others."""
    from advisor.energy.prediction import gpu_here
    from advisor.formats import GPU_SPECS, Format

    here, name = gpu_here()
    workload = summary["workloads"][0]
    trials = {t["trial"]: t for t in summary["trials"]}
    chosen = dict.fromkeys([*summary.get("baselines", {}).values(), *summary.get("front_trials", [])])
    out = []
    for number in chosen:
        trial = trials[number]
        primary = next(e for e in trial["energy"] if e["workload"] == workload["name"])
        formats = {Format(f) for f in trial["formats"].values()}
        row = {"plan_id": trial["plan_id"], "label": trial["label"], "kl": trial["kl"],
               "predicted_j_per_token": primary["j_per_token"], "predicted_source": primary["source"]}
        if here is None or not all(GPU_SPECS[here].supports(f) for f in formats):
            row["measured_j_per_token"] = None
            foreign = sorted(f.value for f in formats if here is not None and not GPU_SPECS[here].supports(f))
            row["why_not_measured"] = ("no NVIDIA GPU here: predicted only" if here is None else
                                       f"{', '.join(foreign)} does not run natively on {name}: predicted only")
            out.append(row)
            continue
        plan_file = folder.parent / f"plan-{trial['plan_id']}.json"
        plan_file.write_text(json.dumps({"formats": trial["formats"], "kv_cache": trial.get("kv_cache", "bf16")}))
        done = subprocess.run([*ADVISOR, "measure", "--plan", str(plan_file), "--model", str(folder), "--target",
                               here.value, "--batch", str(workload["batch_size"]), "--input-tokens",
                               str(workload["input_tokens"]), "--output-tokens", str(workload["output_tokens"])],
                              capture_output=True, text=True)
        measured = json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else {}
        row["measured_j_per_token"] = measured.get("j_per_token")
        row["measured_source"] = measured.get("source") or (done.stderr.strip().splitlines() or ["failed"])[-1]
        out.append(row)
    return out


def run_identical(args: argparse.Namespace, folder: Path) -> dict:
    """Each bank in its own process, so neither one's memory (nor its peak) is the other's."""
    import torch

    results, seconds, peaks = {}, {}, {}
    for kind in ("folded", "packed"):
        result = args.work / f"identical-{kind}.pt"
        subprocess.run([sys.executable, __file__, "bank", "--shape", args.shape, "--device", args.device, "--work",
                        str(args.work), "--kind", kind, "--result", str(result)], check=True)
        results[kind] = torch.load(result, weights_only=False)  # written by the child above
        seconds[kind], peaks[kind] = results[kind].pop("seconds"), results[kind].pop("peak_gpu_gib")
    print("packed bank:", results["packed"]["pack"], flush=True)
    same = all(a == b and torch.equal(la, lb) for (a, la), (b, lb) in
               zip(results["folded"]["scored"], results["packed"]["scored"], strict=True))
    return {"model": args.shape, "command": " ".join(sys.argv), "bit_identical": same, "rc": 0 if same else 1,
            "wall_s": round(sum(seconds.values()), 1), "stages_s": seconds, "peak_gpu_gib": peaks,
            "peak_cpu_gib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20,
            "packed_bank": results["packed"]["pack"]}


def score_one_bank(args: argparse.Namespace, folder: Path) -> None:
    """Scores the same four plans (three uniform, one mixed) with one bank; writes their proxy scores and
    logits, the seconds and the peak GPU memory to ``--result``."""
    import torch

    from advisor.accuracy.proxy import ProxyEvaluator
    from advisor.calibration.tokens import forward_loop
    from advisor.formats import Format
    from advisor.models.loading import load_model
    from advisor.plan import Plan
    from advisor.quantize.bank import FormatBank
    from advisor.quantize.modelopt_config import prepare_device
    from advisor.recipe.schema import ModelSpec

    prepare_device(args.device)
    loaded = load_model(ModelSpec(source=str(folder)), args.device)
    groups, formats = loaded.shape.groups, (Format.BF16, Format.FP8, Format.NVFP4)
    tokens = torch.randint(3, 2000, (8, 128), generator=torch.Generator().manual_seed(0))
    plans = [Plan.uniform(groups, f) for f in formats]
    plans.append(Plan({g.name: formats[i % 3] for i, g in enumerate(groups)}))
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    bank = FormatBank(loaded.model, groups, formats, forward_loop(tokens[:4]), packed=args.kind == "packed")
    proxy = ProxyEvaluator(bank.assemble(plans[0]), tokens[4:])
    with torch.no_grad():
        scored = [(proxy.score(bank.assemble(p)), bank.assemble(p)(input_ids=tokens[4:6].to(args.device)).logits.cpu())
                  for p in plans]
    stats = bank.pack_stats
    torch.save({"scored": scored, "seconds": round(time.perf_counter() - t, 1),
                "pack": {"packed": stats.packed, "patched_values": stats.patched, "kept_bf16": stats.kept_bf16},
                "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}, args.result)


STAGES = ("load_s", "tokens_s", "calibration_s", "bank_s", "sensitivity_s", "trials_s")


def _gib(value: float | list | dict | None) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v:.1f}" for k, v in value.items() if v is not None) or "-"
    if isinstance(value, list):
        return ", ".join(f"{v:.1f}" for v in value)
    return "-" if value is None else f"{value:.1f}"


def markdown(records: list[dict]) -> str:
    """The runs as tables: one row a run, then the J/token of each run that measured its baselines and front."""
    head = ["model", "gpu", "date", "rc", "wall s", *(s.removesuffix("_s") + " s" for s in STAGES), "peak GPU GiB",
            "plan GiB", "streamed", "peak CPU GiB", "bit-identical", "note"]
    lines = ["# Large model shapes, random weights", "", "Written by `benchmarks/large_models.py` (each record's "
             "command is in large_models.json). Peak GPU memory: NVML, sampled every 0.2 s (CUDA context included), "
             "except for `identical`, where it is torch's peak allocated memory of each bank's process; plan: the "
             "memory plan's GiB for each GPU (`advisor search --dry-run`), its 2 GiB reserve included.", "",
             "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in records:
        stages = r.get("stages_s") or {}
        cells = [f"{stages[s]:.0f}" if isinstance(stages.get(s), int | float) else "-" for s in STAGES]
        if "folded" in stages:  # identical: the seconds of each bank
            cells = ["-", "-", "-", f"folded {stages['folded']}, packed {stages['packed']}", "-", "-"]
        per_gpu = r.get("peak_gpu_gib_per_gpu") or []
        peak = _gib(per_gpu if len(per_gpu) > 1 else r["peak_gpu_gib"])  # a spread run: each GPU's, as the plan's
        if stages.get("peak_gpu_reserved_gib"):  # the search's own: torch's reserved and allocated peaks
            peak += (f" (torch: reserved {_gib(stages['peak_gpu_reserved_gib'])}, "
                     f"allocated {_gib(stages['peak_gpu_allocated_gib'])})")
        lines.append(f"| {r['model']} | {r['gpu']} | {r['date'][:16]} | {r['rc']} | {r['wall_s']} | "
                     f"{' | '.join(cells)} | {peak} | {_gib(r.get('plan_used_gib'))} | "
                     f"{', '.join(r.get('plan_streams_from_cpu') or []) or '-'} | {r['peak_cpu_gib']:.1f} | "
                     f"{r.get('bit_identical', '-')} | {r.get('note', '')} |")
    for r in (r for r in records if r.get("energy_here")):
        lines += ["", f"## {r['model']}: J/token of the baselines and the front ({r['gpu']})", "",
                  "| plan | id | KL | predicted J/token (for the search's target) | measured here | source |",
                  "|---|---|---|---|---|---|"]
        for e in r["energy_here"]:
            measured = e["measured_j_per_token"]
            lines.append(f"| {e['label']} | {e['plan_id']} | {e['kl']:.4f} | {e['predicted_j_per_token']:.4f} | "
                         f"{'-' if measured is None else f'{measured:.4f}'} | "
                         f"{e.get('measured_source') or e.get('why_not_measured')} |")
    return "\n".join(lines) + "\n"


def write(out: Path, record: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "large_models.json"
    records = json.loads(path.read_text())["runs"] if path.is_file() else []
    smi = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
    rows = (subprocess.run(smi, capture_output=True, text=True).stdout.strip().splitlines()
            if shutil.which(smi[0]) else [])
    gpu = (rows[0] + (f" ({len(rows)} GPUs on the host)" if len(rows) > 1 else "")) if rows else "none"
    records.append({**record, "gpu": gpu, "date": datetime.now(UTC).isoformat(timespec="seconds")})
    path.write_text(json.dumps({"runs": records}, indent=2) + "\n")
    (out / "large_models.md").write_text(markdown(records))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["search", "identical", "measure", "bank", "checkpoint"],
                    help="measure: --measure-here alone, for the search whose --summary is given; bank: one bank "
                         "of identical; checkpoint: the random-weight checkpoint (run by the others)")
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--energy", default="predicted")
    ap.add_argument("--target", default="b200", help="the GPU the search prices for (b200: NVFP4 native)")
    ap.add_argument("--formats", default=FORMATS)
    ap.add_argument("--gpu-memory", type=float, default=None, help="GiB cap per GPU: layers beyond it stream from CPU")
    ap.add_argument("--measure-here", action="store_true",
                    help="after the search, measure the plans the GPU here runs natively (advisor measure)")
    ap.add_argument("--summary", type=Path, help="measure mode: the summary.json of a search of this shape")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokenizer", type=Path, default=Path("../shared/models/tinystories-656k"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/large_models"))
    ap.add_argument("--out", type=Path, default=Path("reports/benchmarks"))
    ap.add_argument("--kind", choices=["folded", "packed"], help="bank mode: which bank")
    ap.add_argument("--result", type=Path, help="bank mode: where its scores go")
    args = ap.parse_args()
    folder = args.work / args.shape
    if args.mode == "bank":
        return score_one_bank(args, folder)
    if args.mode == "checkpoint":
        make_checkpoint(args.shape, folder, args.tokenizer, args.device)
        return
    # its own process: the CUDA memory that built the weights would stay cached in this one while the search runs
    subprocess.run([sys.executable, __file__, "checkpoint", "--shape", args.shape, "--device", args.device,
                    "--work", str(args.work), "--tokenizer", str(args.tokenizer)], check=True)
    runs = {"search": run_search, "identical": run_identical, "measure": run_measure}
    write(args.out, runs[args.mode](args, folder))


if __name__ == "__main__":
    main()
