"""What the served KL's output side costs a held-out sequence at a 128k-token vocabulary: vLLM's own lists against
the tensors the advisor reads (``advisor.deploy.vllm.served_kl``). Runs wherever vLLM imports (a GPU machine, or a
CPU with vLLM's source on PYTHONPATH: the output side is plain Python and no GPU is used).

The engine's part (the prefill, the top-k over the vocabulary) is done once beforehand; each timed ``served_kl``
hands the same tensors, per prefill chunk, to vLLM's own ``LogprobsProcessor`` as its front end does, and scores
the KL against a reference file: once through the seam, once with vLLM's lists (a vLLM stand-in without the seam).

    python benchmarks/device/served_kl_output_side.py --out reports/benchmarks/served_kl_output_side
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

VOCAB, POSITIONS, CHUNK = 128256, 127, 2048  # a 128-token held-out sequence; vLLM's prefill chunk is larger


class Replay:
    """``llm.generate`` of one prompt as vLLM's front end runs it: the engine's tensors to its LogprobsProcessor."""

    def __init__(self, tensors: tuple) -> None:
        import vllm.v1.engine.logprobs as logprobs
        from vllm.logprobs import create_prompt_logprobs
        from vllm.v1.outputs import LogprobsTensors

        self.logprobs, self.create, self.kind, self.tensors = logprobs, create_prompt_logprobs, LogprobsTensors, tensors

    def generate(self, prompts, params, use_tqdm=True):
        processor = self.logprobs.LogprobsProcessor(tokenizer=None, logprobs=None, cumulative_logprob=None,
                                                    num_logprobs=None, prompt_logprobs=self.create(True),
                                                    num_prompt_logprobs=-1)
        ids, values, ranks = self.tensors
        for s in range(0, ids.shape[0], CHUNK):
            processor._update_prompt_logprobs(self.kind(ids[s:s + CHUNK], values[s:s + CHUNK], ranks[s:s + CHUNK]))
        return [types.SimpleNamespace(prompt_logprobs=processor.pop_prompt_logprobs())]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="path stem: writes STEM.json and STEM.md")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--note", default="", help="a sentence for the report: what else ran on the machine")
    args = ap.parse_args()
    import torch
    import vllm

    from advisor.deploy.vllm import served_kl, write_reference

    gen = torch.Generator().manual_seed(0)
    lp = torch.log_softmax(torch.randn(POSITIONS, VOCAB, generator=gen) * 3, -1)
    seq = torch.randint(0, VOCAB, (POSITIONS + 1,), generator=gen)
    top = torch.topk(lp, VOCAB, dim=-1)
    nxt = seq[1:, None]
    tensors = (torch.cat([nxt, top.indices], 1), torch.cat([lp.gather(1, nxt), top.values], 1),
               (lp > lp.gather(1, nxt)).sum(1) + 1)
    no_seam = types.SimpleNamespace(SamplingParams=vllm.SamplingParams, __version__=vllm.__version__)
    timings: dict[str, list[float]] = {"tensors": [], "lists": []}
    kls = {}
    with tempfile.TemporaryDirectory() as tmp:
        reference = str(write_reference(Path(tmp) / "ref.pt", [torch.log_softmax(lp * 1.1, -1)]))
        for _ in range(args.repeats):
            for read, module in (("tensors", vllm), ("lists", no_seam)):
                t = time.perf_counter()
                out = served_kl(module, Replay(tensors), [tuple(seq.tolist())], reference, VOCAB)
                timings[read].append(time.perf_counter() - t)
                assert out["read"] == read
                kls[read] = out["kl"]
    assert kls["tensors"] == kls["lists"], kls  # the same KL either way
    result = {"vllm_version": vllm.__version__, "vocabulary": VOCAB, "positions": POSITIONS,
              "seconds_per_sequence": {k: sorted(v) for k, v in timings.items()}, "kl": kls,
              "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads, no GPU used",
              "note": args.note,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": shlex.join(["python", *sys.argv])}
    Path(args.out + ".json").write_text(json.dumps(result, indent=2))
    med = {k: sorted(v)[len(v) // 2] for k, v in timings.items()}
    Path(args.out + ".md").write_text("\n".join([
        "# The served KL's output side, per held-out sequence (vLLM's lists against its tensors)", "",
        f"vLLM {vllm.__version__}; {result['machine']}; {result['date']}. Command: `{result['command']}`.", "",
        f"One sequence of {POSITIONS} scored positions at a {VOCAB}-token vocabulary, the engine's tensors made "
        "beforehand: each `advisor.deploy.vllm.served_kl` hands them to vLLM's own `LogprobsProcessor` and scores the "
        f"KL against a reference file; median of {args.repeats}.", "",
        "| read from | seconds a sequence (median) | all |", "|---|---:|---|",
        *(f"| vLLM's {k} | {med[k]:.2f} | {', '.join(f'{x:.2f}' for x in sorted(timings[k]))} |" for k in timings),
        "", f"The same KL either way ({kls['tensors']:.3g}). The list path is the CPU work vLLM's front end does for "
        "every prompt log-probability (four list appends an entry); on a GPU host it ran beside the engine.",
        *(["", args.note] if args.note else []), ""]))


if __name__ == "__main__":
    main()
