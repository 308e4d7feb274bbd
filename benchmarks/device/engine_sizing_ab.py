"""Does an engine's sizing move what vLLM serves? In round 3 of reports/benchmarks/verify_time.md an 8B's FP8 plans
served batches 80, 136 and 240 6-11% slower in verify's engines (max_num_seqs 300, CUDA graphs to 304) than the
same plan in recheck's engine on the same GPU (max_num_seqs 240, graphs to 240). This serves one checkpoint in one
engine per arm, each in a fresh process, and meters the same batches with the fast meter
(``deploy.vllm.STEADY_LOAD_METER``):

    A  max_num_seqs LOW,  the graphs verify captures for LOW    (round 3's recheck engine)
    B  max_num_seqs HIGH, the graphs verify captures for HIGH   (round 3's verify engine)
    C  max_num_seqs LOW,  B's graphs                            (graphs above LOW alone)
    D  max_num_seqs HIGH, A's graphs                            (max_num_seqs above LOW alone)
    S  max_num_seqs LOW,  only the metered batches' graphs      (round 3's recheck engine exactly; not by default)

and A again at the end, for the drift over the run. Writes JSON after each arm (a run cut off keeps its arms).

    python3 benchmarks/device/engine_sizing_ab.py CHECKPOINT --batches 80 136 240 --low 240 --high 300 \
        --out engine_sizing_ab.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from advisor.deploy.checkpoint import capture_bound, graph_sizes_for  # noqa: E402


def graphs_for(size: int, batches: list[int], prompt: int) -> list[int]:
    """The CUDA-graph sizes verify captures for an engine sized ``size`` (every batch up to it, and each step where a
    prefill joins)."""
    return list(graph_sizes_for(sorted(set(range(1, size + 1)) | set(batches)), prompt, capture_bound(size, prompt)))


def arms(low: int, high: int, batches: list[int], prompt: int) -> dict[str, dict[str, object]]:
    small, large = graphs_for(low, batches, prompt), graphs_for(high, batches, prompt)
    only = list(graph_sizes_for(sorted(set(batches) | {1}), prompt, capture_bound(low, prompt)))
    return {"A": {"max_num_seqs": low, "graphs": small}, "B": {"max_num_seqs": high, "graphs": large},
            "C": {"max_num_seqs": low, "graphs": large}, "D": {"max_num_seqs": high, "graphs": small},
            "S": {"max_num_seqs": low, "graphs": only}}


def one_arm(args: argparse.Namespace, arm: dict[str, object]) -> dict[str, object]:
    """This process: one engine sized as ``arm`` says, every batch metered once."""
    import vllm

    from advisor.deploy.vllm import STEADY_LOAD_METER, exported_options, measure_load
    from advisor.energy.meter import open_gpus_counter

    prompt, size = args.input_tokens, int(arm["max_num_seqs"])  # type: ignore[call-overload]
    options = {**exported_options(args.checkpoint, size, prompt),
               "compilation_config": {"cudagraph_capture_sizes": arm["graphs"]}}
    t = time.perf_counter()
    llm = vllm.LLM(model=args.checkpoint, enable_prefix_caching=False, seed=0, max_num_seqs=size,
                   max_model_len=prompt + args.output_tokens, max_logprobs=1, gpu_memory_utilization=0.85, **options)
    start_s = time.perf_counter() - t
    vocab = int(json.loads((Path(args.checkpoint) / "config.json").read_text())["vocab_size"])
    counter = open_gpus_counter(1)
    rows = []
    for b in args.batches:
        t = time.perf_counter()
        m, fewest, latency = measure_load(vllm, llm, counter, STEADY_LOAD_METER, b, prompt, args.output_tokens,
                                          vocab, f"b{b}")
        rows.append({"batch": b, "seconds": time.perf_counter() - t, "j_per_token": m.j_per_token,
                     "tokens_per_s": m.tokens_per_s, "cv": m.cv, "unstable": m.unstable, "batch_full": fewest >= b,
                     **latency})
    return {"vllm_version": vllm.__version__, "llm_options": options, "engine_start_s": start_s, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--batches", type=int, nargs="+", default=[80, 136, 240])
    ap.add_argument("--low", type=int, default=240)
    ap.add_argument("--high", type=int, default=300)
    ap.add_argument("--arms", nargs="+", default=["A", "B", "C", "D", "A"])
    ap.add_argument("--input-tokens", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--out", required=True)
    ap.add_argument("--arm", help=argparse.SUPPRESS)  # the child's: one arm's JSON
    args = ap.parse_args()
    if args.arm:
        print("ARM " + json.dumps(one_arm(args, json.loads(args.arm))), flush=True)
        return
    from advisor.energy.prediction import gpu_here

    table = arms(args.low, args.high, args.batches, args.input_tokens)
    result: dict[str, object] = {"checkpoint": args.checkpoint, "gpu": gpu_here()[1], "date": time.strftime("%Y-%m-%d"),
                                 "command": " ".join(sys.argv), "arms": table, "runs": []}
    for name in args.arms:
        cmd = [sys.executable, __file__, *sys.argv[1:], "--arm", json.dumps(table[name])]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        sys.stderr.write(proc.stderr[-4000:])
        found = [line[4:] for line in proc.stdout.splitlines() if line.startswith("ARM ")]
        run = {"arm": name, **(json.loads(found[-1]) if found else {"error": f"exit {proc.returncode}"})}
        result["runs"].append(run)  # type: ignore[union-attr]
        print(json.dumps({"arm": name, "rows": run.get("rows"), "error": run.get("error")}), flush=True)
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
