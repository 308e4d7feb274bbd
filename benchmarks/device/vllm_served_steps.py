"""Each step of the advisor's steady load as vLLM 0.26 serves it, stamped with what it ran (the report prices each).

The step model (advisor/energy/prediction/_vllm_step.py) prices one vLLM step from what it runs: B decodes at a
context, the prompts that join it, and whether its token count fits a captured CUDA graph (full for decodes alone,
piecewise with prompts) or runs without one (``eager_us_per_layer``, fitted on three H100 rows, added to the
device's time). It was fitted and checked on steady states only: tokens/s, J/token and latency percentiles of a
whole load. This times the steps themselves.

In one process per engine: vLLM's scheduler is wrapped (before the engine's process is forked from this one) so
that every step's completion is stamped with what the step ran (prompts joining and their tokens, decodes, the
decodes' mean context); the advisor's own steady load (``SteadyLoad``, advisor/deploy/vllm/_load.py, read from this
checkout) keeps B requests of 512 random tokens in, 256 out, in flight, as ``advisor verify`` does; after it
settles, the steps completed over a window are kept (each with the interval since the stamp before it: which step
that interval times is the report's business, benchmarks/engine_true/served_steps_report.py), with NVML's energy and
the tokens over the window. ``--spread 0.5`` draws the later requests' output lengths from 128-384 instead: their
ends then fall at random, and prompts join the steps as traffic's do.

Engines: the fitted 8B's width and depth, or a held-out published shape (``--shape``), random weights (vLLM's
``dummy`` load), vLLM's offline ``LLM`` token budget, at each batch under three CUDA-graph bounds: the advisor's (a
step of the decodes and one prompt is captured; two prompts run without a graph), ``wide`` (up to four prompts
captured) and vLLM's default (``min(2 B, 512)``: every step a prompt joins runs without a graph).

    python3 benchmarks/device/vllm_served_steps.py --out steps.json [--spread 0.5]  # GPU and vLLM on the path
    python benchmarks/engine_true/served_steps_report.py steps.json ... --report reports/benchmarks/x  # no GPU
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_eager_steps import WIDTH as EIGHT_B_WIDTH  # noqa: E402 (the 8B's width, its depth varied there)

SHAPE = "Llama-3.1-8B"  # the reference shape of that config, which the H200 step profile was fitted on

INPUT_TOKENS, OUTPUT_TOKENS = 512, 256
BUDGET = 16384  # vLLM 0.26's LLM class on a GPU of >= 70 GiB (advisor.serving.LLM_CLASS_BATCHED_TOKENS)
BATCHES = (128, 256)
WINDOW_S = 15.0


def model_config(shape: str) -> dict[str, Any]:
    """The engine's config.json: the fitted 8B's (:data:`SHAPE`), or one of benchmarks/device/engine_true_sweep.py's
    published shapes (transformers builds it; the GPU machine has it)."""
    if shape == SHAPE:
        return {**EIGHT_B_WIDTH, "num_hidden_layers": 32}
    from engine_true_sweep import shape_config

    return {**shape_config(shape).to_dict(), "torch_dtype": "bfloat16"}


def capture_bound(bound: str, batch: int) -> int | None:
    """The engine's largest CUDA-graph size: the advisor's (decodes and one prompt), ``wide`` (and four), or None
    (vLLM's default)."""
    prompts = {"advisor": 1, "wide": 4}.get(bound)
    return None if prompts is None else min(16 * math.ceil((batch + prompts * INPUT_TOKENS) / 16), BUDGET)


def install_step_log(path: Path) -> None:
    """Stamp each step's completion (vLLM's ``Scheduler.update_from_output``, in the engine's process: forked from
    this one, so the wrapper goes with it) with what the step ran, a line of ``path`` each."""
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler.update_from_output

    def stamped(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
        now = time.perf_counter()
        new = {r.req_id for r in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        prompts = prompt_tokens = decodes = 0
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            if rid in new or cached.is_context_phase(rid):
                prompts, prompt_tokens = prompts + 1, prompt_tokens + n
            else:
                decodes += 1
        context = statistics.fmean(cached.num_computed_tokens) if cached.num_computed_tokens else 0.0
        with path.open("a") as f:
            f.write(f"{now:.6f} {prompts} {prompt_tokens} {decodes} {context:.1f}\n")
        return original(self, scheduler_output, model_runner_output)

    Scheduler.update_from_output = stamped


def advisors_steady_load() -> Any:
    """``SteadyLoad`` from this checkout's advisor/deploy/vllm/_load.py, read without the advisor package (whose
    dependencies the GPU machine lacks): the meter it imports is not used by the load."""
    meter = types.ModuleType("advisor.energy.meter")
    for name in ("EnergyCounter", "EnergyMeter", "Measurement"):
        setattr(meter, name, object)
    meter.MeterConfig = lambda **kw: kw
    sys.modules.setdefault("advisor.energy.meter", meter)
    spec = importlib.util.spec_from_file_location("advisor_steady_load", ROOT / "advisor/deploy/vllm/_load.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SteadyLoad


def spread_load(steady_load: Any, spread: float) -> Any:
    """``steady_load`` whose later requests ask for output lengths drawn uniformly within ``spread`` of the stated
    one (0.5: 128-384 for 256): their ends no longer fall one every ``L_out / B`` steps, so prompts join the steps
    at random, as traffic's do. The first, staggered round is the advisor's."""

    class Spread(steady_load):
        def _add(self, max_tokens: int) -> str:
            if max_tokens == self.output_tokens and spread:
                lo, hi = round(max_tokens * (1 - spread)), round(max_tokens * (1 + spread))
                max_tokens = self._rng.randint(lo, hi)
            return super()._add(max_tokens)

    return Spread


def engine_run(batch: int, bound: str, spread: float = 0.0, shape: str = SHAPE) -> dict[str, Any]:
    """In this process: one engine, the advisor's steady load at ``batch`` (its output lengths spread: ``spread``),
    the steps of a window after it settles."""
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # as the advisor serves (advisor/deploy/vllm/_serve.py)
    folder = Path(tempfile.mkdtemp())
    config = model_config(shape)
    (folder / "config.json").write_text(json.dumps(config))
    log = folder / "steps.txt"
    install_step_log(log)
    import vllm
    from vllm.third_party import pynvml

    steady_load = spread_load(advisors_steady_load(), spread)
    largest = capture_bound(bound, batch)
    started = time.perf_counter()
    llm = vllm.LLM(model=str(folder), load_format="dummy", skip_tokenizer_init=True, max_num_seqs=batch,
                   max_model_len=INPUT_TOKENS + math.ceil(OUTPUT_TOKENS * (1 + spread)),
                   max_num_batched_tokens=BUDGET, seed=0,
                   enable_prefix_caching=False, gpu_memory_utilization=0.85, max_logprobs=1,
                   compilation_config={"max_cudagraph_capture_size": largest} if largest else {})
    start_s = time.perf_counter() - started
    sizes = list(llm.llm_engine.vllm_config.compilation_config.cudagraph_capture_sizes or [])
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    load = steady_load(vllm, llm.llm_engine, batch, INPUT_TOKENS, OUTPUT_TOKENS, config["vocab_size"]).start()
    load.settle()
    time.sleep(1.0)
    t0, mj0, tok0 = time.perf_counter(), pynvml.nvmlDeviceGetTotalEnergyConsumption(handle), load.tokens
    time.sleep(WINDOW_S)
    t1, mj1, tok1 = time.perf_counter(), pynvml.nvmlDeviceGetTotalEnergyConsumption(handle), load.tokens
    latency = load.latency_ms()
    load.stop()
    stamps = [line.split() for line in log.read_text().splitlines()]
    steps = []
    for prev, cur in zip(stamps, stamps[1:], strict=False):
        if t0 <= float(cur[0]) <= t1:
            steps.append([round(1e3 * (float(cur[0]) - float(prev[0])), 3), int(cur[1]), int(cur[2]), int(cur[3]),
                          float(cur[4])])
    tokens = tok1 - tok0
    return {"batch": batch, "bound": bound, "spread": spread, "max_capture_size": largest, "capture_sizes": sizes,
            "engine_start_s": start_s, "window_s": t1 - t0, "output_tokens": tokens,
            "tokens_per_s": tokens / (t1 - t0), "j_per_token": (mj1 - mj0) / 1e3 / tokens, **latency,
            "steps_columns": ["ms", "prompts", "prompt_tokens", "decodes", "context"], "steps": steps}


def collect(out: Path, batches: tuple[int, ...], bounds: tuple[str, ...], spread: float = 0.0, shape: str = SHAPE
            ) -> None:
    import torch
    import vllm

    rows = []
    for batch in batches:
        for bound in bounds:  # one engine a process: vLLM keeps its memory after the engine is gone
            r = subprocess.run([sys.executable, __file__, "--one", str(batch), bound, "--spread", str(spread),
                                "--shape", shape],
                               capture_output=True, text=True)
            line = [x for x in r.stdout.splitlines() if x.startswith("{")]
            rows.append(json.loads(line[-1]) if r.returncode == 0 and line
                        else {"batch": batch, "bound": bound, "error": r.stderr[-3000:]})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "steps"}), flush=True)
            out.write_text(json.dumps(dict(meta(torch, vllm, shape), rows=rows)))
    out.write_text(json.dumps(dict(meta(torch, vllm, shape), rows=rows), indent=None))


def meta(torch: Any, vllm: Any, shape: str) -> dict[str, Any]:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,power.limit", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().splitlines()
    return {"gpu": torch.cuda.get_device_name(0), "driver": smi[0] if smi else "unknown",
            "vllm_version": vllm.__version__, "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.UTC).isoformat(), "command": " ".join(["python3", *sys.argv]),
            "shape": shape, "config": model_config(shape), "input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS,
            "budget": BUDGET}


def main(argv: list[str] | None = None) -> None:
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--out", type=Path)
    a.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    a.add_argument("--bounds", nargs="+", default=["advisor", "wide", "default"],
                   choices=["advisor", "wide", "default"])
    a.add_argument("--spread", type=float, default=0.0, help="later requests' output lengths drawn uniformly "
                   "within this share of the stated length (0: all the same, as the advisor's load)")
    a.add_argument("--shape", default=SHAPE, help=f"{SHAPE} (default) or a published shape of "
                   "benchmarks/device/engine_true_sweep.py (qwen3-4b, mistral-7b-v0.3, ...): random weights")
    a.add_argument("--one", nargs=2, metavar=("BATCH", "BOUND"), help=argparse.SUPPRESS)
    args = a.parse_args(argv)
    if args.one:
        print(json.dumps(engine_run(int(args.one[0]), args.one[1], args.spread, args.shape)), flush=True)
    elif args.out:
        collect(args.out, tuple(args.batches), tuple(args.bounds), args.spread, args.shape)
    else:
        a.error("--out: where the runs' JSON goes")


if __name__ == "__main__":
    main()
