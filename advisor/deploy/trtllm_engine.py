"""TensorRT-LLM as a serving engine (``--engine tensorrt_llm``, one entry of ``advisor.engines``).

``tensorrt_llm`` serves the plan's
*exported checkpoint* (``advisor export``'s files) through TensorRT-LLM's LLM API, sized for
the workload (``deploy.checkpoint.llm_api_options``: batch, lengths, the plan's KV-cache dtype),
while the advisor's own NVML meter (:class:`advisor.energy.meter.EnergyMeter`) takes its
steady-state windows:

* requests: prompts of ``input_tokens`` random token ids (a fresh prompt per request, block
  reuse off, so no prefix is ever cached) with ``max_tokens = output_tokens`` and
  ``ignore_eos``; the meter keeps ``batch_size`` of them in flight (its ``depth``), so the
  engine runs at the workload's concurrency, and a "step" of the meter is one request;
* J/token = J per request / output_tokens (the request's prefill included, as every
  :class:`~advisor.estimate.EnergyEstimate`); prefill J per input token from requests of one
  output token at concurrency 1; decode J per token = (request - prefill) / output_tokens, an
  approximation (under continuous batching prefills overlap other requests' decode).

What this measures includes everything the engine does (scheduler, kernels chosen for the
checkpoint, fusions it turns off for mixed checkpoints), which a bits count cannot see. It is
tested in CI against a fake ``tensorrt_llm`` module that mimics the LLM API's shape
(``advisor.testing.fake_tensorrt_llm``); it has never run against the real package, so every
estimate it gives says "not verified on a GPU here".
"""

from __future__ import annotations

import contextlib
import queue
import random
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from advisor.deploy.checkpoint import llm_api_options
from advisor.energy.meter import EnergyMeter, Measurement
from advisor.errors import SetupError, UnsupportedError
from advisor.estimate import EnergyEstimate
from advisor.plan import Plan
from advisor.recipe.schema import Workload
from advisor.search.measured import MeasuredTier

NOT_VERIFIED = "not verified on a GPU here"


def import_tensorrt_llm() -> ModuleType:
    """The ``tensorrt_llm`` package, or a SetupError (exit 3) saying how to get it."""
    try:
        import tensorrt_llm
    except ImportError as exc:
        raise SetupError(f"--engine tensorrt_llm: tensorrt_llm is not importable ({exc}); install TensorRT-LLM "
                         "(pip install tensorrt_llm, on a machine with an NVIDIA GPU) or use --engine builtin"
                         ) from None
    return tensorrt_llm


class _Request:
    """One in-flight request as the meter sees it (``query()``: finished?).

    TensorRT-LLM fills a ``GenerationResult`` only when its queue is read, so ``query`` reads what
    has arrived, without waiting, and then reports ``finished``.
    """

    def __init__(self, result: Any) -> None:
        self.result = result

    def query(self) -> bool:
        if not self.result.finished:
            with contextlib.suppress(queue.Empty, TimeoutError):
                self.result.result(timeout=0)
        return bool(self.result.finished)


def llm_kwargs(trtllm: ModuleType, checkpoint: Path, plan: Plan, workload: Workload) -> dict[str, Any]:
    """``LLM(**kwargs)`` for measuring ``workload``: the export's options for this one workload, with
    block reuse off (a cached prefix would skip prefill work a real request does)."""
    options = llm_api_options([workload.model_dump()], plan.kv_cache)
    kv = {**options["kv_cache_config"], "enable_block_reuse": False}
    return {
        "model": str(checkpoint),
        "max_batch_size": options["max_batch_size"],
        "max_num_tokens": options["max_num_tokens"],
        "max_seq_len": options["max_seq_len"],
        "kv_cache_config": trtllm.llmapi.KvCacheConfig(**kv),
        "cuda_graph_config": trtllm.llmapi.CudaGraphConfig(**options["cuda_graph_config"]),
    }


class TensorRTLLMEnergyModel(MeasuredTier):
    """The measured tier through TensorRT-LLM (a :class:`~advisor.search.measured._contract.MeasuredTier` that gives
    J/token and tokens/s only: its operating points leave TPOT and TTFT unknown, and say so).

    ``checkpoint_for(plan)`` gives the plan's exported checkpoint folder (the workflow exports it
    once per plan); ``make_meter(depth)`` an NVML meter that keeps ``depth`` requests in flight.
    """

    def __init__(self, checkpoint_for: Callable[[Plan], Path], make_meter: Callable[[int], EnergyMeter],
                 trtllm: ModuleType | None = None, vocab_size: int = 32000, seed: int = 0) -> None:
        self.trtllm = trtllm or import_tensorrt_llm()
        self.checkpoint_for, self.make_meter = checkpoint_for, make_meter
        self.vocab_size = vocab_size
        self._rng = random.Random(seed)
        state = make_meter(1).counter.state()
        version = getattr(self.trtllm, "__version__", "unknown")
        self.label = (f"measured (TensorRT-LLM {version}, {state.name}, driver {state.driver}, "
                      f"{time.strftime('%Y-%m-%d')}; {NOT_VERIFIED})")

    def _requests(self, llm: Any, prompt_len: int, max_tokens: int) -> Callable[[], _Request]:
        params = self.trtllm.SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)

        def launch() -> _Request:
            prompt = [self._rng.randrange(self.vocab_size) for _ in range(prompt_len)]
            return _Request(llm.generate_async(prompt, sampling_params=params))

        return launch

    def _measure(self, llm: Any, workload: Workload, depth: int, max_tokens: int, tokens: int, what: str,
                 plan: Plan) -> Measurement:
        step = self._requests(llm, workload.input_tokens, max_tokens)
        return self.make_meter(depth).measure(step, f"tensorrt_llm {what} {plan.label()}", tokens)

    def estimate(self, plan: Plan, workload: Workload) -> EnergyEstimate:
        kwargs = llm_kwargs(self.trtllm, self.checkpoint_for(plan), plan, workload)
        try:
            llm = self.trtllm.LLM(**kwargs)
        except Exception as exc:  # an engine that cannot load the checkpoint is a finding, not a crash
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise UnsupportedError(f"TensorRT-LLM could not load plan {plan.id}'s checkpoint "
                                   f"({type(exc).__name__}: {first}); see the export README's engine table") from None
        try:
            lin, lout, b = workload.input_tokens, workload.output_tokens, workload.batch_size
            full = self._measure(llm, workload, b, lout, lout, "requests", plan)
            pre = self._measure(llm, workload, 1, 1, lin, "prefill", plan)
        finally:
            with contextlib.suppress(Exception):
                llm.shutdown()
        return EnergyEstimate(
            workload=workload.name,
            j_per_token=full.j_per_step / lout,
            decode_j_per_token=max(full.j_per_step - pre.j_per_step, 0.0) / lout,
            prefill_j_per_input_token=pre.j_per_step / lin,
            decode_tokens_per_s=full.tokens_per_s,
            source=self.label,
            measured=True,
        )


def tensorrt_llm_tier(recipe: Any, loaded: Any, tokens: Any) -> TensorRTLLMEnergyModel:
    """The measured tier of a search run through TensorRT-LLM: each measured plan is exported once
    (``advisor export``'s code, into ``RUN_DIR/engine_checkpoints/<plan id>``), then served."""
    from advisor.deploy.checkpoint import checkpoint_exporter
    from advisor.energy.meter import MeterConfig, open_meter

    def make_meter(depth: int) -> EnergyMeter:
        import torch

        return open_meter(torch.cuda.current_device(), MeterConfig(depth=depth, queued_s=0.0))

    vocab = int(loaded.model.config.get_text_config().vocab_size)
    return TensorRTLLMEnergyModel(checkpoint_exporter(recipe, loaded, tokens), make_meter, vocab_size=vocab)
