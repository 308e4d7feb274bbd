"""The fast meter against the classic one on the same engine (GPU, vLLM): one exported checkpoint served once, each
batch metered with ``deploy.vllm.STEADY_LOAD_METER`` (2 s windows until three agree) and ``MeterConfig()`` (three 5 s
windows, the series taken again when unstable), alternating fast, classic, fast (``--rounds N``: N classic meterings
a batch, each between two fast ones), so that drift shows. Writes JSON
for ``benchmarks/device/verify_time_collect.py`` (reports/benchmarks/verify_time.md).

``--around RUN`` is the slow path beside ``advisor verify``'s fast one (issue 57: speed must not buy different
numbers): for each TPOT objective of a verified plan (``--plan``, default the recommendation), the operating batch
verify found and the CUDA-graph sizes either side of it, each metered with the meters of ``--meters`` (default
``classic``) in an engine of the plan's own export with verify's own options for it (its ``max_num_seqs`` and CUDA
graphs: an engine sized otherwise served the same batch 6-11% apart, verify_time.md round 3), so no batch above its
``max_num_seqs``. The collector then reads the largest batch that met by the slow path beside verify's, and the
J/token at verify's batch by both.

    python3 benchmarks/device/meter_ab.py CHECKPOINT --batches 16 64 128 --out meter_ab.json
    python3 benchmarks/device/meter_ab.py --around RUN --out slow_path.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from advisor.deploy.checkpoint import decode_graph_sizes
from advisor.deploy.vllm import ENGINE_ENV, STEADY_LOAD_METER, exported_options, measure_load, static_heap
from advisor.energy.meter import MeterConfig, open_gpus_counter


def around(run: Path, plan_id: str | None) -> tuple[str, dict[str, Any], list[int]]:
    """(checkpoint, {objective: verify's search and its TPOT bound, and verify's engine options}, the batches to
    meter) of a verified plan: each objective's found batch and the graph sizes below and above it, up to the
    engine's ``max_num_seqs``."""
    verify = json.loads((run / "verify.json").read_text())
    plan = next(p for p in verify["plans"] if (p["plan_id"] == plan_id if plan_id else p["role"] == "recommendation"))
    summary = json.loads((run / "summary.json").read_text())
    bounds = {w["name"]: w.get("tpot_ms") for w in summary["workloads"]}
    options = plan["vllm_options"]
    objectives, batches = {}, set()
    for o in plan["operating"]:
        found = (o.get("vllm_search") or {}).get("batch")
        if not found or not bounds.get(o["workload"]):
            continue
        # the engine's own decode graph sizes (verify captured those its loads need), else vLLM's grid up to its bound
        captured = (options.get("compilation_config") or {}).get("cudagraph_capture_sizes")
        grid = sorted({b for b in captured or decode_graph_sizes(options["max_num_seqs"])
                       if b <= options["max_num_seqs"]} | {found})
        i = grid.index(found)
        near = grid[max(i - 1, 0):i + 2]
        objectives[o["workload"]] = {"tpot_ms": bounds[o["workload"]], "found": found, "batches": list(near),
                                     "fast": o["vllm_search"]}
        batches.update(near)
    return plan["checkpoint"], {"plan_id": plan["plan_id"], "role": plan["role"], "objectives": objectives,
                                "options": options}, sorted(batches)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint", nargs="?")
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64, 128])
    ap.add_argument("--around", type=Path, metavar="RUN", help="a run verified in vLLM: meter each objective's found "
                    "operating batch and the graph sizes either side (the slow path)")
    ap.add_argument("--plan", help="with --around: the plan id (default: the recommendation)")
    ap.add_argument("--meters", nargs="+", choices=["fast", "classic"], help="the meters a batch is metered with, "
                    "in turn (default: fast classic fast; with --around: classic)")
    ap.add_argument("--input-tokens", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=1, help="classic meterings a batch, each between two fast ones "
                    "(more rounds tell the meters apart from the engine's drift)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    checkpoint, batches, slow = args.checkpoint, args.batches, None
    if args.around:
        checkpoint, slow, batches = around(args.around, args.plan)
    if not checkpoint:
        ap.error("give a CHECKPOINT or --around RUN")
    order = args.meters or (["classic"] if args.around else ["fast", "classic"] * args.rounds + ["fast"])
    for name, value in ENGINE_ENV.items():  # as verify's engine processes run
        os.environ.setdefault(name, value)
    import vllm

    prompt = args.input_tokens
    if slow:  # verify's own engine for this plan
        options = dict(slow["options"])
    else:
        options = {"max_num_seqs": max(batches), **exported_options(checkpoint, max(batches), prompt, tuple(batches))}
    llm = vllm.LLM(model=checkpoint, enable_prefix_caching=False, seed=0, max_model_len=prompt + args.output_tokens,
                   max_logprobs=1, gpu_memory_utilization=0.85, disable_log_stats=True, **options)
    with open(f"{checkpoint}/config.json") as f:
        vocab = int(json.load(f)["vocab_size"])
    counter = open_gpus_counter(1)
    meters = {"fast": STEADY_LOAD_METER, "classic": MeterConfig()}
    rows = []
    with static_heap():  # as verify's engines meter (advisor/deploy/vllm/_serve.py)
        for b in batches:
            for name in order:
                t = time.perf_counter()
                m, fewest, latency = measure_load(vllm, llm, counter, replace(meters[name]), b, prompt,
                                                  args.output_tokens, vocab, f"{name} b{b}")
                rows.append({"batch": b, "meter": name, "seconds": time.perf_counter() - t,
                             "j_per_token": m.j_per_token, "tokens_per_s": m.tokens_per_s, "cv": m.cv,
                             "unstable": m.unstable, "windows": len(m.windows), "windows_taken": m.windows_taken,
                             "batch_full": fewest >= b, **latency})
                print(json.dumps(rows[-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump({"checkpoint": checkpoint, "vllm_version": vllm.__version__, "llm_options": options,
                   "meters": {k: asdict(v) for k, v in meters.items()}, "rows": rows, "slow_path": slow,
                   "date": time.strftime("%Y-%m-%d")}, f, indent=2)


if __name__ == "__main__":
    main()
