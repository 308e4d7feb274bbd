"""What `advisor verify`'s served KL over the whole vocabulary costs at a 128k-token vocabulary (GPU, vLLM).

A random-weight Llama-3.2-1B shape in BF16 is written to WORK, its log-probabilities on 16 random sequences of 256
tokens become the reference file, and `serve()` scores the served KL in its child process as verify does. Writes
``$OUT/kl1b.json``: the reference's time, its file's size, the child's time and the engine's start, the served KL
(BF16 against BF16: the engine's floor) and the largest resident process. Run from the repository root with vLLM
and the project's wheels on PYTHONPATH (``benchmarks/device/vllm_verify.sh``'s setup).

reports/benchmarks/vllm_verify_data/smollm2_2026-11-28/kl1b.json came from this code on an H200 (2026-11-28; run
then from a session copy that read the code from /tmp/v38/code, the same lines otherwise).
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

VOCAB, SEQUENCES, LENGTH = 128256, 16, 256
WORK = Path(os.environ.get("WORK", "/tmp/v38"))


def main() -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from advisor.deploy.vllm import ServeJob, logprobs_per_sequence, run_in_child, write_reference

    out: dict[str, float | int] = {}
    cfg = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=VOCAB, tie_word_embeddings=True, rope_theta=500000.0,
                      max_position_embeddings=4096, torch_dtype="bfloat16")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).cuda().eval()
    path = WORK / "l1b"
    model.save_pretrained(path)
    g = torch.Generator().manual_seed(1)
    seqs = [tuple(torch.randint(0, VOCAB, (LENGTH,), generator=g).tolist()) for _ in range(SEQUENCES)]
    t = time.perf_counter()
    ref = logprobs_per_sequence(model, seqs)
    out["reference_s"] = time.perf_counter() - t
    reference = write_reference(WORK / "ref1b.pt", ref)
    out["reference_file_bytes"] = reference.stat().st_size
    del model
    torch.cuda.empty_cache()
    t = time.perf_counter()
    job = ServeJob(str(path), vocab_size=VOCAB, sequences=tuple(seqs), reference_logprobs=str(reference),
                   formats=False, llm_options={"skip_tokenizer_init": True})  # served from token ids
    served = run_in_child(job)
    out["child_s"] = time.perf_counter() - t
    out["load_s"] = served["load_s"]
    out["served_kl"] = served["served_kl"]["kl"]
    out["positions"] = sum(served["served_kl"]["positions"])
    out["child_max_rss_gib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    print(json.dumps(out))
    (Path(os.environ["OUT"]) / "kl1b.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
