"""Measured energy of a plan on the GPU here: decode, prefill, and J per request.

Decode is measured at a fixed context (the step at context ``c`` attends to
``c + 1`` tokens and writes one); a request's decode energy is taken at its mean
context ``input + output / 2`` (a decode step's cost is linear in the context).
Prefill is one request of ``input`` tokens. All numbers come from the NVML meter
(energy) and CUDA-event / window timing of CUDA-graph replays.

torch is imported only inside functions.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from advisor.energy.meter import EnergyMeter, MeterConfig, open_meter
from advisor.errors import SetupError, UnsupportedError
from advisor.estimate import EnergyEstimate
from advisor.formats import GPU, Format, gpu_from_device_name
from advisor.models.shape import ModelShape
from advisor.plan import Plan
from advisor.recipe.schema import Workload
from advisor.search.measured import MeasuredTier

if TYPE_CHECKING:
    from advisor.search.operating import MeasuredPoint


@dataclass
class Bench:
    """A random-weight model on the GPU, its calibration, and converted weights shared by plans.

    Runtimes are not kept: each holds a KV cache (and its captured graphs hold memory),
    so callers free a runtime when its measurement is done (:meth:`DecoderRuntime.free`).
    The converted weights (``linear_cache``) stay: at most one FP8 copy per group.
    """

    dims: Any
    weights: Any
    amax: dict[str, float]
    linear_cache: dict = field(default_factory=dict)

    @classmethod
    def create(cls, dims, seed: int = 0, max_pos: int = 8192, std: float = 0.02) -> Bench:
        from advisor.energy.runtime import DecoderWeights, calibrate

        w = DecoderWeights.random(dims, max_pos=max_pos, seed=seed, std=std)
        return cls(dims, w, calibrate(w))

    def runtime(self, formats: dict[str, Format], key: str | None = None, kv_cache: Format = Format.BF16):
        """A new runtime of ``formats`` with a ``kv_cache`` KV cache (``key``: older callers, unused)."""
        from advisor.energy.runtime import DecoderRuntime

        return DecoderRuntime(self.weights, formats, self.amax, linear_cache=self.linear_cache, kv_cache=kv_cache)


def uniform_formats(dims, fmt: Format) -> dict[str, Format]:
    """Every group of ``dims`` (a MoE layer's routed experts are one) in ``fmt``."""
    from advisor.energy.runtime import layer_kinds

    return {f"layers.{i}.{k}": fmt for i, kinds in enumerate(layer_kinds(dims)) for k in kinds}


def decode_step(rt, batch: int, context: int, seed: int = 0):
    """A captured decode step of ``batch`` sequences at ``context`` (cache allocated here)."""
    import torch

    rt.allocate_cache(batch, context + 1)
    g = torch.Generator(device="cuda").manual_seed(seed)  # tokens do not change a step's cost
    tokens = torch.randint(0, rt.dims.vocab, (batch, 1), device="cuda", generator=g)
    return rt.capture(tokens, context)


def prefill_step(rt, length: int, batch: int = 1, seed: int = 0):
    import torch

    rt.allocate_cache(batch, length)
    g = torch.Generator(device="cuda").manual_seed(seed)
    tokens = torch.randint(0, rt.dims.vocab, (batch, length), device="cuda", generator=g)
    return rt.capture(tokens, 0)


def measure_step(meter: EnergyMeter | None, step, label: str) -> dict:
    """ms per step from CUDA events; J per token and power from the meter (when given)."""
    ms = step.time_ms()
    row: dict[str, Any] = {"ms_per_step_events": ms, "tokens_per_step": step.tokens_per_step}
    if meter is not None:
        m = meter.measure(step.launch, label, step.tokens_per_step)
        row.update(
            ms_per_step=m.s_per_step * 1e3,
            j_per_step=m.j_per_step,
            j_per_token=m.j_per_token,
            power_w=m.power_w,
            cv=m.cv,
            unstable=m.unstable,
            tokens_per_s=m.tokens_per_s,
            tokens_per_s_per_w=m.tokens_per_s_per_w,
            windows=[w.__dict__ for w in m.windows],
            sm_clock_mhz=m.gpu_after.sm_clock_mhz,
            temperature_c=m.gpu_after.temperature_c,
        )
    else:
        row["ms_per_step"] = ms
    return row


#: activations, captured graphs and cuBLAS workspaces beside the weights and the KV cache
WORKSPACE_BYTES = 2 << 30


def bench_bytes(shape: ModelShape, workloads: Sequence[Workload]) -> int:
    """GPU memory that measuring this model needs: its random BF16 weights (embedding and lm_head
    included), one FP8 copy of every quantizable group, the largest workload's BF16 KV cache, and
    :data:`WORKSPACE_BYTES`."""
    embeddings = shape.vocab_size * shape.hidden_size * (1 if shape.tied_embeddings else 2)
    bf16 = 2 * (shape.quantizable_weights + shape.router_weights + embeddings)
    kv = max((w.batch_size * shape.kv_bytes(w.input_tokens + w.output_tokens + 1) for w in workloads), default=0.0)
    return int(bf16 + shape.quantizable_weights + kv) + WORKSPACE_BYTES


def check_fits(shape: ModelShape, workloads: Sequence[Workload], free: int, total: int) -> None:
    """UnsupportedError when measuring ``shape`` (:func:`bench_bytes`) needs more than ``free`` bytes: the
    measured tier runs on one GPU, beside the model the search scores."""
    need = bench_bytes(shape, workloads)
    if need > free:
        raise UnsupportedError(
            f"measuring energy needs about {need / 2**30:.1f} GiB of GPU memory (random BF16 weights of the "
            f"model, an FP8 copy, the largest workload's KV cache), and {free / 2**30:.1f} of {total / 2**30:.1f} "
            "GiB are free on this GPU; the measured tier runs on one GPU: use --energy predicted (or a GPU "
            "with more memory)")


def torch_with_gpu():
    """torch, with a CUDA GPU and triton present, or a SetupError that says what is missing."""
    try:
        import torch
    except ImportError as exc:
        raise SetupError("measured energy needs PyTorch with CUDA (pip install torch)") from exc
    if not torch.cuda.is_available():
        raise SetupError("measured energy needs an NVIDIA GPU; none is visible (use --energy predicted)")
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        raise SetupError("the energy runtime needs triton (it ships with PyTorch's CUDA wheels)") from exc
    return torch


class MeasuredEnergyModel(MeasuredTier):
    """The built-in runtime's measured tier: a plan measured on the GPU here, with random weights of the model's
    architecture.

    Each estimate runs prefill (one request of ``input`` tokens) and decode (the
    workload's batch at the mean context) under the NVML meter; minutes per plan.
    With the model's transformers ``config`` the runtime runs that family's own layers;
    without it, Llama layers of the shape, and the label says so. The runtime, its KV
    cache and graphs are freed after each estimate; RoPE tables grow to the longest
    workload seen.
    """

    def __init__(
        self,
        shape: ModelShape,
        target: GPU | None = None,
        config: MeterConfig | None = None,
        model_config: Any = None,
    ) -> None:
        from advisor.energy.runtime import DecoderDims

        self.shape = shape
        # refused (partial rotary, MLP biases, ...) before looking for a GPU
        self.dims = DecoderDims.from_config(model_config) if model_config is not None else DecoderDims.from_shape(shape)
        torch = torch_with_gpu()
        self.meter = open_meter(torch.cuda.current_device(), config)
        state = self.meter.counter.state()
        here = gpu_from_device_name(state.name)
        if target is not None and here is not None and here != target:
            raise UnsupportedError(
                f"measured energy for {target.value} asked, but the GPU here is {state.name}; "
                "use --energy predicted or run on the target GPU"
            )
        self.gpu_uuid, self.gpu_name = state.uuid or None, state.name  # the unit each measurement names
        self._bench: Bench | None = None
        self._soaked = False
        self.label = (
            f"measured ({state.name}, driver {state.driver}, {time.strftime('%Y-%m-%d')}; {self.dims.label})"
        )

    def bench(self, positions: int) -> Bench:
        """The random-weight model on the GPU that every estimate (and this model's per-model profile) runs,
        created on first use with RoPE tables for at least ``positions`` positions."""
        if self._bench is None:
            self._bench = Bench.create(self.dims, max_pos=max(8192, positions))
        return self._bench

    def check_fits(self, workloads: Sequence[Workload]) -> None:
        """UnsupportedError when measuring does not fit the GPU memory free here (:func:`check_fits`)."""
        import torch

        if self._bench is None:
            check_fits(self.shape, workloads, *torch.cuda.mem_get_info())

    def estimate(self, plan: Plan, workload: Workload) -> EnergyEstimate:
        pre, dec = self.measure_steps(plan, workload)
        return EnergyEstimate.of_request(workload, pre["j_per_step"], dec["j_per_step"], dec["tokens_per_s"],
                                         self.label, measured=True)

    def measure_points(self, plan: Plan, workloads: Sequence[Workload]) -> list[MeasuredPoint]:
        """``plan`` at each workload's batch (an operating batch): its measured decode step and prefill,
        composed into the served steady state (:func:`advisor.search.operating.from_steps`)."""
        import torch

        from advisor.search.operating import from_steps

        out = []
        for w in workloads:
            need = w.batch_size * self.shape.kv_bytes(w.input_tokens + w.output_tokens + 1) + WORKSPACE_BYTES
            free, total = torch.cuda.mem_get_info()
            if need > free:
                raise UnsupportedError(f"batch {w.batch_size} of '{w.name}' needs about {need / 2**30:.1f} GiB of KV "
                                       f"cache and workspace; {free / 2**30:.1f} of {total / 2**30:.1f} GiB are free")
            pre, dec = self.measure_steps(plan, w)
            out.append(from_steps(plan, w, dec["ms_per_step"], dec["j_per_step"], pre["ms_per_step"],
                                  pre["j_per_step"], self.label))
        return out

    def measure_steps(self, plan: Plan, workload: Workload) -> tuple[dict[str, Any], dict[str, Any]]:
        """(prefill, decode) rows of :func:`measure_step`: one request's prefill of the workload's input, and
        one decode step of its batch at the mean context."""
        from advisor.energy.runtime import release_cuda_memory

        lin, lout, b = workload.input_tokens, workload.output_tokens, workload.batch_size
        positions = lin + lout + 1
        bench = self.bench(positions)
        bench.weights.ensure_positions(positions)
        rt = bench.runtime(dict(plan.formats), kv_cache=plan.kv_cache)
        try:
            if not self._soaked and self.meter.config.soak_s > 0:  # start warm, as the next ones do
                step = decode_step(rt, b, lin + lout // 2)
                self.meter.soak(step.launch, self.meter.config.soak_s)
                self._soaked = True
                del step
                rt.free()
            step = prefill_step(rt, lin)
            pre = measure_step(self.meter, step, f"prefill {plan.label()}")
            del step
            rt.free()
            step = decode_step(rt, b, lin + lout // 2)
            dec = measure_step(self.meter, step, f"decode {plan.label()}")
            del step
        finally:
            rt.free()
            del rt
            # Each graph capture runs on its own stream, and cuBLAS(Lt) keeps a workspace per
            # stream (32 MiB on Hopper) until told otherwise: two per estimate, never reused.
            release_cuda_memory()
        return pre, dec
