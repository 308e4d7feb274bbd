"""TensorRT-LLM serving: LLM-API options sized from the workloads, deployment warnings, and a smoke test
that loads the checkpoint with ``tensorrt_llm.LLM`` where it is installed."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from advisor.deploy.checkpoint._sizes import ServingSizes, workloads_words
from advisor.formats import Format
from advisor.plan import Plan


def llm_api_options(workloads: list[dict[str, Any]], kv_cache: Format = Format.BF16) -> dict[str, Any]:
    """TensorRT-LLM LLM-API options (``--extra_llm_api_options``) sized for the workloads; an FP8 KV
    cache is asked for explicitly (``kv_cache_config.dtype: fp8``), not left to the checkpoint."""
    size = ServingSizes.of(workloads)
    return {
        "max_batch_size": size.batch,
        "max_num_tokens": size.num_tokens,
        "max_seq_len": size.seq,
        "kv_cache_config": {"free_gpu_memory_fraction": 0.9, "enable_block_reuse": True,
                            **({"dtype": "fp8"} if kv_cache == Format.FP8 else {})},
        "cuda_graph_config": {"enable_padding": True, "max_batch_size": size.batch},
    }


def options_yaml(options: dict[str, Any], workloads: list[dict[str, Any]]) -> str:
    import yaml

    wl = workloads_words(workloads)
    head = ("# TensorRT-LLM LLM-API options written by precision-advisor export.\n"
            f"# Sized for the run's workloads ({wl}).\n"
            "# Use: trtllm-serve <this folder> --extra_llm_api_options llm_api_options.yaml\n")
    return head + yaml.safe_dump(options, sort_keys=False)


def deployment_warnings(quant_algo: str | None, plan: Plan) -> list[str]:
    """Warnings about the checkpoint itself; what each engine makes of it is ``advisor.serving``'s."""
    out = []
    if quant_algo is None and plan.kv_cache == Format.BF16:
        out.append("the plan is all-BF16: the checkpoint is unquantized (no hf_quant_config.json).")
    return out


def smoke_test_trtllm(out_dir: Path, prompt: str = "Once upon a time", tokens: int = 8) -> str:
    """Load the checkpoint with TensorRT-LLM's LLM class and generate a few tokens, if installed."""
    try:
        from tensorrt_llm import LLM, SamplingParams
    except ImportError:
        return "not run: tensorrt_llm not installed"
    try:
        llm = LLM(model=str(out_dir))
        res = llm.generate([prompt], SamplingParams(max_tokens=tokens))
        text = res[0].outputs[0].text
        with contextlib.suppress(Exception):
            llm.shutdown()
        return f"passed: {prompt!r} -> {text!r}"
    except Exception as exc:  # any engine failure is a finding to report, not a crash
        return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
