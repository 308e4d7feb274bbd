"""Large model shapes end to end with random weights: the memory plan beside the memory a run takes, and the
packed bank's trials against the folded bank's.

``search`` saves a random-weight checkpoint of a published shape (safetensors, made on the device), prints
the plan (``advisor search --dry-run --json``), runs ``advisor search`` on it and records the wall clock, the
exit code, the per-stage seconds of its summary, the peak GPU memory (NVML, sampled) and the peak CPU memory.
``identical`` builds the folded and the packed bank of one shape in turn, scores the same plans with both
(torch.equal on the logits, equal proxy scores) and records each bank's peak GPU memory.
Each run appends a record to OUT/large_models.json and rewrites OUT/large_models.md.

Usage (from the repository root; a tokenizer folder, by default ../shared/models/tinystories-656k):
    python benchmarks/large_models.py search --shape qwen2.5-14b --trials 12
    python benchmarks/large_models.py identical --shape llama-3.1-8b
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

LLAMA_8B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
            "rope_theta": 500000.0, "tie_word_embeddings": False}
SHAPES = {
    "tiny": {**LLAMA_8B, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2048},
    "llama-3.1-8b": LLAMA_8B,
    "qwen2.5-14b": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 5120,
                    "intermediate_size": 13824, "num_hidden_layers": 48, "num_attention_heads": 40,
                    "num_key_value_heads": 8, "vocab_size": 152064, "max_position_embeddings": 131072,
                    "rope_theta": 1000000.0, "tie_word_embeddings": False},
    "qwen3-30b-a3b": {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048,
                      "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
                      "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
                      "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
                      "tie_word_embeddings": False},
}
FORMATS = "bf16,fp8,nvfp4"


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
    del model
    return folder


class GpuMemoryPeak:
    """The most memory NVML saw in use on any GPU, sampled every 0.2 s while the run lasts (None without NVML)."""

    def __init__(self) -> None:
        self.peak_bytes: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # no NVML here: nothing to sample
            return
        while not self._stop.is_set():
            used = max(pynvml.nvmlDeviceGetMemoryInfo(h).used for h in handles)
            self.peak_bytes = max(self.peak_bytes or 0, used)
            time.sleep(0.2)

    def __enter__(self) -> GpuMemoryPeak:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_search(args: argparse.Namespace, folder: Path) -> dict:
    advisor = [sys.executable, "-c", "from advisor.cli import main; main()"]  # no console script on the device
    base = [*advisor, "search", "--model", str(folder), "--target", "b200", "--formats", FORMATS,
            "--device", args.device]
    dry = subprocess.run([*base, "--dry-run", "--json"], capture_output=True, text=True)
    plan = json.loads(dry.stdout) if dry.returncode in (0, 3) and dry.stdout.strip() else None
    command = [*base, "--trials", str(args.trials), "--energy", args.energy, "--out", str(args.work / "runs"),
               "--name", args.shape]
    t = time.perf_counter()
    with GpuMemoryPeak() as gpu:
        rc = subprocess.run(command).returncode
    summary_path = args.work / "runs" / args.shape / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    return {"model": args.shape, "command": " ".join(command), "wall_s": round(time.perf_counter() - t, 1),
            "rc": rc, "stages_s": summary.get("timings_s", {}),
            "peak_gpu_gib": gpu.peak_bytes / 2**30 if gpu.peak_bytes else None,
            "peak_cpu_gib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20,
            "plan_used_gib": [d["used_bytes"] / 2**30 for d in plan["devices"]] if plan else None,
            "plan_fits": plan["fits"] if plan else None}


def run_identical(args: argparse.Namespace, folder: Path) -> dict:
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
    results, peaks, seconds = {}, {}, {}
    for packed in (False, True):
        cuda = args.device == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        bank = FormatBank(loaded.model, groups, formats, forward_loop(tokens[:4]), packed=packed)
        proxy = ProxyEvaluator(bank.assemble(plans[0]), tokens[4:])
        with torch.no_grad():
            results[packed] = [(proxy.score(bank.assemble(p)), bank.assemble(p)(input_ids=tokens[4:6].to(
                args.device)).logits.cpu()) for p in plans]
        seconds["packed" if packed else "folded"] = round(time.perf_counter() - t, 1)
        peaks["packed" if packed else "folded"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
        del bank, proxy
        if cuda:
            torch.cuda.empty_cache()
    same = all(a == b and torch.equal(la, lb) for (a, la), (b, lb) in zip(results[False], results[True], strict=True))
    return {"model": args.shape, "command": " ".join(sys.argv), "bit_identical": same, "rc": 0 if same else 1,
            "wall_s": round(sum(seconds.values()), 1), "stages_s": seconds, "peak_gpu_gib": peaks,
            "peak_cpu_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def write(out: Path, record: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "large_models.json"
    records = json.loads(path.read_text())["runs"] if path.is_file() else []
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip() if shutil.which("nvidia-smi") else "none"
    records.append({**record, "gpu": gpu, "date": datetime.now(UTC).isoformat(timespec="seconds")})
    path.write_text(json.dumps({"runs": records}, indent=2) + "\n")
    lines = ["# Large model shapes, random weights", "", "| model | gpu | rc | wall s | stages s | peak GPU GiB | "
             "peak CPU GiB | plan | bit-identical |", "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['model']} | {r['gpu']} | {r['rc']} | {r['wall_s']} | {r['stages_s']} | "
                     f"{r['peak_gpu_gib']} | {r['peak_cpu_gib']:.1f} | {r.get('plan_used_gib')} | "
                     f"{r.get('bit_identical', '')} |")
    (out / "large_models.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["search", "identical"])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--energy", default="predicted")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokenizer", type=Path, default=Path("../shared/models/tinystories-656k"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/large_models"))
    ap.add_argument("--out", type=Path, default=Path("reports/benchmarks"))
    args = ap.parse_args()
    folder = make_checkpoint(args.shape, args.work / args.shape, args.tokenizer, args.device)
    write(args.out, run_search(args, folder) if args.mode == "search" else run_identical(args, folder))


if __name__ == "__main__":
    main()
