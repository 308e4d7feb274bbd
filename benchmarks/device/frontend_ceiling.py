"""How many output tokens a second vLLM's front end and the advisor's steady load can handle on one host core, with
no GPU in the way: the ceiling the host side of a metering would put on tokens/s if it were the bottleneck.

The advisor's own ``measure_load`` (its steady load, its meter's tickets and windows) runs against an engine whose
engine core answers at once: each step hands every running request one token, encoded and decoded as vLLM's engine
core pipe does (msgpack), through vLLM's own ``OutputProcessor``; a finished request is replaced through the
load's ``add_request`` as in a real metering. Runs wherever vLLM imports (a CPU with vLLM's source on PYTHONPATH:
this side of vLLM is plain Python).

    python benchmarks/device/frontend_ceiling.py --out reports/benchmarks/frontend_ceiling
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

INPUT_TOKENS, OUTPUT_TOKENS, VOCAB = 512, 256, 128256  # verify_time's workloads (an 8B's vocabulary)


class InstantEngine:
    """``LLMEngine``'s front end as the steady load drives it (``add_request``, ``step``, ``abort_request``,
    ``get_num_unfinished_requests``), over an engine core that produces every running request's next token at once."""

    def __init__(self) -> None:
        from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason
        from vllm.v1.engine.output_processor import OutputProcessor
        from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

        self.kinds = types.SimpleNamespace(output=EngineCoreOutput, outputs=EngineCoreOutputs,
                                           request=EngineCoreRequest, length=FinishReason.LENGTH)
        self.processor = OutputProcessor(tokenizer=None, log_stats=False)
        self.encoder, self.decoder = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs)
        self.left: dict[str, int] = {}
        self.token = 0

    def add_request(self, request_id: str, prompt: dict[str, Any], params: Any) -> None:
        request = self.kinds.request(request_id=request_id, prompt_token_ids=prompt["prompt_token_ids"],
                                     mm_features=None, sampling_params=params, pooling_params=None,
                                     arrival_time=time.time(), lora_request=None, cache_salt=None,
                                     data_parallel_rank=None, external_req_id=request_id)
        self.processor.add_request(request, None)
        self.left[request_id] = params.max_tokens

    def step(self) -> list[Any]:
        outs = []
        for rid in list(self.left):
            self.left[rid] -= 1
            self.token = (self.token + 7919) % VOCAB
            done = self.left[rid] == 0
            if done:
                del self.left[rid]
            outs.append(self.kinds.output(request_id=rid, new_token_ids=[self.token],
                                          finish_reason=self.kinds.length if done else None))
        got = self.decoder.decode(self.encoder.encode(self.kinds.outputs(outputs=outs)))  # the engine core's pipe
        return self.processor.process_outputs(got.outputs, got.timestamp).request_outputs

    def abort_request(self, request_ids: list[str]) -> None:
        for rid in self.processor.abort_requests(request_ids, internal=False):
            self.left.pop(rid, None)

    def get_num_unfinished_requests(self) -> int:
        return self.processor.get_num_unfinished_requests()


def host() -> dict[str, Any]:
    from advisor.deploy.vllm import host_facts

    return {**host_facts(), "python": platform.python_version()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="path stem: writes STEM.json and STEM.md")
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 136, 240])
    ap.add_argument("--note", default="", help="a sentence for the report: what else ran on the machine")
    args = ap.parse_args()
    import vllm

    from advisor.deploy.vllm import STEADY_LOAD_METER, measure_load
    from advisor.testing_vllm import ConstantPowerCounter

    rows = []
    for batch in args.batches:
        engine = InstantEngine()
        t = time.perf_counter()
        m, fewest, _ = measure_load(vllm, types.SimpleNamespace(llm_engine=engine), ConstantPowerCounter(300.0),
                                    STEADY_LOAD_METER, batch, INPUT_TOKENS, OUTPUT_TOKENS, VOCAB, f"batch {batch}")
        rows.append({"batch": batch, "tokens_per_s": m.tokens_per_s, "us_per_token": 1e6 / m.tokens_per_s,
                     "steps_per_s": m.tokens_per_s / batch, "windows": m.windows_taken, "cv": m.cv,
                     "fewest_inflight": fewest, "seconds": time.perf_counter() - t})
        print(f"batch {batch}: {m.tokens_per_s:,.0f} tokens/s ({1e6 / m.tokens_per_s:.1f} us a token)", flush=True)
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    data = {"what": "vLLM's front end and the advisor's steady load and meter over an engine core that answers at "
                    "once: the host side's ceiling on tokens/s, one core", "vllm_version": getattr(
                        vllm, "__version__", "unknown"), "host": host(), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                                time.gmtime()),
            "command": command, "note": args.note, "input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS,
            "rows": rows}
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(data, indent=1))
    lines = [f"# The host side's ceiling on a metering's tokens/s ({data['date']})", "",
             f"Host: {data['host']['cpu']}, {data['host']['cpus']} cores, Python {data['host']['python']}; vLLM "
             f"{data['vllm_version']} (its source, from the parts `device-vllm.sh` packs). Command: `{command}`. "
             + (args.note + " " if args.note else "")
             + f"{INPUT_TOKENS} input and {OUTPUT_TOKENS} output tokens a request, as verify_time's workloads.", "",
             "The advisor's `measure_load` (its steady load, the meter's tickets and 2 s windows) against vLLM's own "
             "`OutputProcessor`, fed by an engine core that hands every running request its next token at once "
             "(msgpack-encoded and decoded, as its pipe does). No GPU: what is measured is the host work a "
             "metering adds per output token.", "",
             "| batch | tokens/s | us a token | steps/s | windows | fewest in flight |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['batch']} | {r['tokens_per_s']:,.0f} | {r['us_per_token']:.1f} | {r['steps_per_s']:,.0f} | "
              f"{r['windows']} | {r['fewest_inflight']} |" for r in rows]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
