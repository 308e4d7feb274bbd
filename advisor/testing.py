"""Fakes for tests and demos, in one place: a virtual clock, NVML counters and a GPU that are
simulated, an evaluator with additive damage and energy, and tiny random-weight models built
from a config (no download).

Nothing in the product imports this module.
"""

from __future__ import annotations

import math
import queue
import types
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from advisor.energy.meter import GPUState
from advisor.estimate import EnergyEstimate
from advisor.formats import FORMAT_SPECS, Format
from advisor.plan import Plan
from advisor.search.measured import MeasuredTier
from advisor.search.study import Evaluation


class VirtualClock:
    """Time that moves only when read (``tick_s`` per read) or slept."""

    def __init__(self, tick_s: float = 1e-4) -> None:
        self.t = 0.0
        self.tick_s = tick_s

    def __call__(self) -> float:
        self.t += self.tick_s
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


_FAKE_STATE = GPUState("Fake GPU", 0, "0.0", 700.0, 1980, 2619, 40, 0.0)


class ReplayCounter:
    """Replays recorded ``(time_s, energy_mj)`` samples against a clock."""

    def __init__(self, samples: Sequence[tuple[float, int]], clock: Callable[[], float]) -> None:
        self.samples = sorted(samples)
        self.clock = clock
        self._i = 0

    def energy_mj(self) -> int:
        t = self.clock.t if isinstance(self.clock, VirtualClock) else self.clock()
        while self._i + 1 < len(self.samples) and self.samples[self._i + 1][0] <= t:
            self._i += 1
        return int(self.samples[self._i][1])

    def state(self) -> GPUState:
        return _FAKE_STATE


class _SimHandle:
    def __init__(self, gpu: SimulatedGPU, finish: float) -> None:
        self.gpu, self.finish = gpu, finish

    def query(self) -> bool:
        return self.gpu.clock.t >= self.finish


class SimulatedGPU:
    """A GPU that runs steps of ``step_s`` at ``busy_w`` and idles at ``idle_w``.

    Its counter ticks every ``tick_s`` (like NVML's ~100 ms); ``power_noise`` scales
    each tick's busy power by a factor drawn from ``noise`` (a callable returning a
    multiplier), so tests can make stable or unstable runs.
    """

    def __init__(
        self,
        clock: VirtualClock,
        step_s: float = 0.01,
        busy_w: float = 500.0,
        idle_w: float = 80.0,
        tick_s: float = 0.1,
        noise: Callable[[int], float] | None = None,
    ) -> None:
        self.clock, self.step_s, self.busy_w, self.idle_w, self.tick_s = clock, step_s, busy_w, idle_w, tick_s
        self.noise = noise or (lambda _tick: 1.0)
        self.busy_until = 0.0
        self._intervals: deque[tuple[float, float]] = deque()
        self._acc_t = 0.0
        self._acc_j = 0.0
        self.launched = 0

    def launch(self, step_s: float | None = None) -> _SimHandle:
        start = max(self.clock.t, self.busy_until)
        self.busy_until = start + (self.step_s if step_s is None else step_s)
        self._intervals.append((start, self.busy_until))
        self.launched += 1
        return _SimHandle(self, self.busy_until)

    def _advance(self, t: float) -> None:
        """Integrate power from ``_acc_t`` to ``t`` tick by tick."""
        while self._acc_t < t:
            tick = int(self._acc_t / self.tick_s + 1e-9)
            seg_end = min(t, (tick + 1) * self.tick_s)
            if seg_end <= self._acc_t:  # float edge: step to the next tick
                seg_end = min(t, self._acc_t + self.tick_s)
            busy = 0.0
            for s, f in self._intervals:
                if s >= seg_end:
                    break
                busy += max(0.0, min(f, seg_end) - max(s, self._acc_t))
            while self._intervals and self._intervals[0][1] <= seg_end:
                self._intervals.popleft()
            dt = seg_end - self._acc_t
            self._acc_j += self.idle_w * dt + (self.busy_w * self.noise(tick) - self.idle_w) * busy
            self._acc_t = seg_end

    def energy_mj(self) -> int:
        tick_edge = int(self.clock.t / self.tick_s) * self.tick_s
        self._advance(tick_edge)
        return int(self._acc_j * 1000)

    def state(self) -> GPUState:
        return _FAKE_STATE


class _FakeGenerationResult:
    """Shaped like TensorRT-LLM's ``GenerationResult``: ``finished`` turns true only once the result's
    queue is read (``result(timeout)``, which raises ``queue.Empty`` when nothing has arrived)."""

    def __init__(self, handle: _SimHandle, clock: VirtualClock) -> None:
        self._handle, self._clock, self._done = handle, clock, False

    @property
    def finished(self) -> bool:
        return self._done

    def result(self, timeout: float | None = None) -> _FakeGenerationResult:
        while not self._handle.query():
            if timeout is not None:
                raise queue.Empty
            self._clock.sleep(0.001)
        self._done = True
        return self


def fake_tensorrt_llm(gpu: SimulatedGPU, prefill_s_per_token: float = 1e-5, decode_s_per_token: float = 2e-3
                      ) -> types.ModuleType:
    """A module shaped like ``tensorrt_llm`` (``LLM``, ``SamplingParams``, ``llmapi.KvCacheConfig``,
    ``llmapi.CudaGraphConfig``) whose requests run on ``gpu``: one request takes
    ``prefill_s_per_token * prompt + decode_s_per_token * max_tokens``. ``module.instances`` keeps
    every LLM made, with its kwargs, requests and whether it was shut down."""
    module = types.ModuleType("tensorrt_llm")
    module.__version__ = "0.0-fake"
    module.instances = []

    class SamplingParams:
        def __init__(self, max_tokens: int = 16, ignore_eos: bool = False, temperature: float = 1.0) -> None:
            self.max_tokens, self.ignore_eos, self.temperature = max_tokens, ignore_eos, temperature

    class LLM:
        def __init__(self, model: str, **kwargs: Any) -> None:
            self.model, self.kwargs, self.requests, self.closed = model, kwargs, [], False
            module.instances.append(self)

        def generate_async(self, inputs: list[int], sampling_params: SamplingParams) -> _FakeGenerationResult:
            self.requests.append((list(inputs), sampling_params))
            duration = prefill_s_per_token * len(inputs) + decode_s_per_token * sampling_params.max_tokens
            return _FakeGenerationResult(gpu.launch(duration), gpu.clock)

        def shutdown(self) -> None:
            self.closed = True

    class _Config:
        def __init__(self, **kwargs: Any) -> None:
            self.__dict__.update(kwargs)

    llmapi = types.ModuleType("tensorrt_llm.llmapi")
    llmapi.KvCacheConfig = type("KvCacheConfig", (_Config,), {})
    llmapi.CudaGraphConfig = type("CudaGraphConfig", (_Config,), {})
    module.LLM, module.SamplingParams, module.llmapi = LLM, SamplingParams, llmapi
    return module


class AdditiveEvaluator:
    """Damage and energy additive over groups; optionally interrupts at a given call."""

    DAMAGE = {Format.BF16: 0.0, Format.FP8: 0.01, Format.NVFP4: 0.08}
    KV_DAMAGE = {Format.BF16: 0.0, Format.FP8: 0.005}  # an FP8 KV cache: small damage
    KV_SAVING_J = {Format.BF16: 0.0, Format.FP8: 0.3}  # ... and less energy

    def __init__(self, interrupt_at: int | None = None, workload: str = "chat") -> None:
        self.calls = 0
        self.interrupt_at = interrupt_at
        self.workload = workload

    def evaluate(self, plan: Plan) -> Evaluation:
        self.calls += 1
        if self.interrupt_at is not None and self.calls == self.interrupt_at:
            raise KeyboardInterrupt
        kl = sum(self.DAMAGE[f] for f in plan.formats.values()) + self.KV_DAMAGE[plan.kv_cache]
        j = 1.0 + sum(FORMAT_SPECS[f].weight_bytes_per_element for f in plan.formats.values())
        j -= self.KV_SAVING_J[plan.kv_cache]
        est = EnergyEstimate(self.workload, j, j, j / 10, 1 / j, "predicted (fake)", False)
        return Evaluation(kl=kl, ppl=10 * math.exp(kl), ppl_bf16=10.0, energy=[est])


class FakeMeasuredGPU(MeasuredTier):
    """A measured tier on one named fake GPU (a worker's unit): ``scale`` times :class:`AdditiveEvaluator`'s
    J/token (units may draw differently), ``delay_s`` per estimate, NVFP4 refused as on Hopper."""

    def __init__(self, gpu_uuid: str | None = "GPU-fake-0", scale: float = 1.0, delay_s: float = 0.0) -> None:
        self.gpu_uuid, self.gpu_name, self.scale, self.delay_s = gpu_uuid, "Fake GPU", scale, delay_s
        self.label = "measured (Fake GPU, driver 0, 2026-11-22)"
        self.calls: list[str] = []

    def estimate(self, plan: Plan, workload: Any) -> EnergyEstimate:
        import time

        from advisor.errors import UnsupportedError

        if Format.NVFP4 in plan.formats.values():
            raise UnsupportedError("NVFP4 cannot be measured on this GPU")
        time.sleep(self.delay_s)
        self.calls.append(plan.id)
        j = AdditiveEvaluator().evaluate(plan).energy[0].j_per_token * self.scale
        return EnergyEstimate(workload.name, j, j, j / 10, 1 / j, self.label, True)


def tiny_llama_config(**overrides: Any) -> Any:
    """A 2-layer Llama config small enough for CPU tests (transformers, no download)."""
    from transformers import LlamaConfig

    base = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512}
    return LlamaConfig(**{**base, **overrides})


def _families() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Every model type the adapter registry serves (each adapter's text model and its wrappers, such as the
    multimodal "gemma3"), and those with routed experts: tests take their families from here, so a family
    added to the registry is tested once ``tiny_config`` builds it."""
    from advisor.models.adapters import ADAPTERS

    every = tuple(dict.fromkeys(outer for a in ADAPTERS.values() for outer in (a.model_type, *a.stacks)))
    moe = tuple(outer for outer in every if any(outer in a.stacks and a.moe for a in ADAPTERS.values()))
    return every, moe


#: one tiny config per supported family (``tiny_config``); "gemma3" is the multimodal wrapper
FAMILIES, MOE_FAMILIES = _families()
DENSE_FAMILIES = tuple(f for f in FAMILIES if f not in MOE_FAMILIES)


def tiny_config(family: str, vocab: int = 256) -> Any:
    """A 2-layer, hidden-64 config of ``family`` (transformers classes, no download).

    Gemma configs get head_dim 32 (not hidden / heads) and a sliding window of 8; Mistral
    a window of 8; MoE configs 4 experts, top-2; Qwen3-MoE's layer 1 is dense
    (``mlp_only_layers``) and Qwen2-MoE has a shared expert. The Gemma-3 wrapper's vision
    tower is a 2-layer SigLIP whose linears are named like text ones
    (``encoder.layers.N.self_attn.q_proj``).
    """
    import transformers as tf

    base = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    gem = dict(base, head_dim=32, sliding_window=8)
    moe = dict(num_experts_per_tok=2, moe_intermediate_size=32)
    make = {
        "llama": lambda: tf.LlamaConfig(**base),
        "mistral": lambda: tf.MistralConfig(**base, sliding_window=8),
        "qwen2": lambda: tf.Qwen2Config(**base),
        "qwen3": lambda: tf.Qwen3Config(**base, head_dim=32),
        "gemma2": lambda: tf.Gemma2Config(**gem),
        "gemma3_text": lambda: tf.Gemma3TextConfig(**gem),
        "gemma3": lambda: tf.Gemma3Config(
            text_config=gem,
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                               image_size=28, patch_size=14),
            mm_tokens_per_image=4, image_token_index=vocab - 1, boi_token_index=vocab - 3, eoi_token_index=vocab - 2),
        "phi3": lambda: tf.Phi3Config(**base),
        "mixtral": lambda: tf.MixtralConfig(**dict(base, intermediate_size=32), num_local_experts=4,
                                            num_experts_per_tok=2),
        "qwen3_moe": lambda: tf.Qwen3MoeConfig(**base, num_experts=4, **moe, mlp_only_layers=[1]),
        "qwen2_moe": lambda: tf.Qwen2MoeConfig(**base, num_experts=4, **moe, shared_expert_intermediate_size=48),
    }
    return make[family]()


def random_model(config: Any, seed: int = 0) -> Any:
    """A causal LM with random weights from ``config`` (BF16, eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    model.config.architectures = [type(model).__name__]  # export needs it; a saved model has it
    return model


__all__ = ["DENSE_FAMILIES", "FAMILIES", "MOE_FAMILIES", "AdditiveEvaluator", "ReplayCounter", "SimulatedGPU",
           "VirtualClock", "random_model", "tiny_config", "tiny_llama_config"]
