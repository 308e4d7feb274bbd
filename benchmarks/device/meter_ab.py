"""The fast meter against the classic one on the same engine (GPU, vLLM): one exported checkpoint served once, each
batch metered with ``deploy.vllm.STEADY_LOAD_METER`` (2 s windows until three agree) and ``MeterConfig()`` (three 5 s
windows, the series taken again when unstable), alternating fast, classic, fast (``--rounds N``: N classic meterings
a batch, each between two fast ones), so that drift shows. Writes JSON
for ``benchmarks/device/verify_time_collect.py`` (reports/benchmarks/verify_time.md).

    python3 benchmarks/device/meter_ab.py CHECKPOINT --batches 16 64 128 --out meter_ab.json
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace

from advisor.deploy.vllm import STEADY_LOAD_METER, exported_options, measure_load
from advisor.energy.meter import MeterConfig, open_gpus_counter


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64, 128])
    ap.add_argument("--input-tokens", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=1, help="classic meterings a batch, each between two fast ones "
                    "(more rounds tell the meters apart from the engine's drift)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import vllm

    batch, prompt = max(args.batches), args.input_tokens
    options = exported_options(args.checkpoint, batch, prompt, tuple(args.batches))
    llm = vllm.LLM(model=args.checkpoint, enable_prefix_caching=False, seed=0, max_num_seqs=batch,
                   max_model_len=prompt + args.output_tokens, max_logprobs=1, gpu_memory_utilization=0.85, **options)
    with open(f"{args.checkpoint}/config.json") as f:
        vocab = int(json.load(f)["vocab_size"])
    counter = open_gpus_counter(1)
    meters = {"fast": STEADY_LOAD_METER, "classic": MeterConfig()}
    rows = []
    for b in args.batches:
        for name in ("fast", "classic") * args.rounds + ("fast",):
            t = time.perf_counter()
            m, fewest, latency = measure_load(vllm, llm, counter, replace(meters[name]), b, prompt,
                                              args.output_tokens, vocab, f"{name} b{b}")
            rows.append({"batch": b, "meter": name, "seconds": time.perf_counter() - t, "j_per_token": m.j_per_token,
                         "tokens_per_s": m.tokens_per_s, "cv": m.cv, "unstable": m.unstable,
                         "windows": len(m.windows), "windows_taken": m.windows_taken, "batch_full": fewest >= b,
                         **latency})
            print(json.dumps(rows[-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump({"checkpoint": args.checkpoint, "vllm_version": vllm.__version__, "llm_options": options,
                   "meters": {k: asdict(v) for k, v in meters.items()}, "rows": rows,
                   "date": time.strftime("%Y-%m-%d")}, f, indent=2)


if __name__ == "__main__":
    main()
