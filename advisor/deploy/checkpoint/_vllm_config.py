"""vLLM serving options (``vllm serve <checkpoint> --config vllm_config.yaml``) sized from the run's workloads.

vLLM captures CUDA graphs only for steps of at most ``max_cudagraph_capture_size`` tokens, by default twice
``max_num_seqs`` (at most 512). In continuous batching a step where a new request's prefill joins the decode
batch holds ``batch + prompt`` tokens, above that bound, and runs without CUDA graphs; the options here raise
the bound to cover it (measured in ``reports/benchmarks/operating_points_8b.md``).

On Hopper, vLLM 0.26 runs a ModelOpt FP8 checkpoint's per-tensor GEMMs with its CUTLASS kernel; cuBLASLt
(``linear-backend: torch``, ``torch._scaled_mm``) served the same checkpoints at fewer J/token
(``reports/benchmarks/vllm_verify.md``), so the options pick it there (the rule:
:func:`advisor.serving.vllm_linear_backend`). A mixture-of-experts model's FP8 experts run vLLM's Triton kernel there
(:func:`advisor.serving.vllm_moe_backend`: vLLM's default compiles for most of an hour on its first start).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from advisor.deploy.checkpoint._sizes import ServingSizes, workloads_words
from advisor.formats import GPU, GPU_SPECS, Format
from advisor.serving import vllm_kernels, vllm_token_budget


def vllm_options(workloads: list[dict[str, Any]], kv_cache: Format = Format.BF16,
                 formats: Iterable[Format] = (), gpu: GPU | str | None = None, moe: bool = False) -> dict[str, Any]:
    """Keys are ``vllm serve`` flags without their dashes, as vLLM's ``--config`` YAML takes them. ``formats``:
    the plan's weight formats; ``gpu``: the GPU kind it is served on (None: not known); ``moe``: the model has routed
    experts. The token budget is the one the plan was priced and verified with
    (:func:`advisor.serving.vllm_token_budget`) where the GPU is known."""
    size = ServingSizes.of(workloads)
    kind = next((g for g in GPU if g.value == gpu), None)
    budget = vllm_token_budget(GPU_SPECS[kind].memory_gb, size.batch, size.seq) if kind else size.num_tokens
    return {
        "max-num-seqs": size.batch,
        "max-model-len": size.seq,
        "max-num-batched-tokens": budget,
        **({"kv-cache-dtype": "fp8"} if kv_cache == Format.FP8 else {}),
        **{key.replace("_", "-"): value for key, value in vllm_kernels(formats, gpu, moe).items()},
        "compilation-config": {"max_cudagraph_capture_size": min(capture_bound(size.batch, size.prompt), budget)},
    }


def capture_bound(batch: int, prompt: int) -> int:
    """The CUDA-graph capture bound that covers a step of ``batch`` decodes and one ``prompt``-token prefill
    (vLLM captures multiples of 16 above 256 tokens, and lowers the bound to its max_num_batched_tokens)."""
    return 16 * math.ceil((batch + prompt) / 16)


def decode_graph_sizes(bound: int) -> tuple[int, ...]:
    """The batch sizes vLLM 0.26 captures CUDA graphs for under a capture bound (``vllm/config/vllm.py``'s
    default list: 1, 2, 4, every 8 to 248, every 16 from 256). A decode step of ``b`` requests runs padded to
    the smallest of them at or above ``b``: batches 225-232 cost one step time, and 232 serves the most."""
    sizes = [1, 2, 4] + list(range(8, min(bound + 1, 256), 8)) + list(range(256, bound + 1, 16))
    return tuple(b for b in sizes if b <= bound)


def graph_sizes_for(batches: Iterable[int], prompt: int, bound: int) -> tuple[int, ...]:
    """The CUDA-graph sizes (of :func:`decode_graph_sizes` under ``bound``) that the steady loads of ``batches``
    run: a decode step of ``b`` requests pads to the grid size at or above ``b``, and a step where one
    ``prompt``-token prefill joins ``b - 1`` decodes to the one at or above ``b - 1 + prompt``. Captured alone,
    they give those steps the graph the whole grid would have given them (the grid's other sizes lie between
    none of them and their padded size), at a fraction of the capture."""
    grid = decode_graph_sizes(bound)
    needed = set()
    for b in batches:
        for tokens in (b, b - 1 + prompt) if prompt else (b,):
            padded = next((g for g in grid if g >= tokens), None)
            if padded is not None:
                needed.add(padded)
    return tuple(sorted(needed))


def vllm_options_yaml(options: dict[str, Any], workloads: list[dict[str, Any]]) -> str:
    import yaml

    wl = workloads_words(workloads)
    head = ("# vLLM serving options written by precision-advisor export.\n"
            f"# Sized for the run's workloads ({wl}).\n"
            "# compilation-config captures CUDA graphs for steps where a prefill joins the decode batch\n"
            "# (vLLM's default bound leaves them eager).\n"
            + ("# linear-backend: torch runs the FP8 GEMMs with cuBLASLt, not vLLM's CUTLASS kernel (fewer J/token\n"
               "# on Hopper, measured with vLLM 0.26.0 in precision-advisor's reports/benchmarks/vllm_verify.md).\n"
               "# The flag came with vLLM PR 39538 (April 2026): an older vLLM refuses it; delete the line there.\n"
               if "linear-backend" in options else "")
            + ("# moe-backend: triton runs the FP8 experts with vLLM's Triton kernel: its default on Hopper,\n"
               "# FlashInfer's CUTLASS MoE, is compiled on the first start without flashinfer-jit-cache (most of an\n"
               "# hour).\n"
               if "moe-backend" in options else "")
            + "# Use: vllm serve <this folder> --config vllm_config.yaml\n")
    return head + yaml.safe_dump(options, sort_keys=False)
