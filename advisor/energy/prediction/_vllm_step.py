"""One vLLM step as it serves: the time and energy of B decoding sequences at context C with the prefill chunks
that join the step, from the built-in step model's own costs plus the engine's terms. torch-free.

vLLM 0.26 runs each scheduler step as one forward pass over every scheduled token: the B decodes and, under
chunked prefill, the prompt tokens admitted to the step, up to ``max_num_batched_tokens`` (decodes are scheduled
first; a prompt that does not fit is cut into chunks over the next steps). The pass is a CUDA graph where its
token count fits the captured sizes, padded up to the next size: a FULL graph for a step of decodes only, a
PIECEWISE one (attention launched between the graph's pieces) for a step with prompt tokens; above the largest
size it runs eagerly. The sizes and the padding rule are vLLM 0.26.0's own (:func:`capture_sizes`).

From the built-in model ``M`` (a predicted tier's ``decode_step`` and ``prefill``):

* ``R(n)``, a pass over ``n`` tokens: ``M.decode_step(n, context=0)`` (the weights read once, the launch floors
  and what grows with the rows; a MoE layer's experts as ``n`` tokens touch them,
  :mod:`advisor.energy.prediction._routing`), or, where ``M``'s decode steps were profiled at decode batches only
  (``M.pass_is_decode_step`` false: a per-model profile), the slower of it and ``M.prefill(n)`` (the pass where its
  multiply-adds bound it: such a decode profile never reaches that regime, a prompt's does). The GPU profile's
  decode step reads its GEMMs at ``n`` rows from a table measured into that regime already, and its prefill's
  non-GEMM floor, fitted on prompts, is no decode pass's;
* the decodes' attention ``M.decode_step(B, C) - M.decode_step(B, 0)``;
* a chunk of ``l`` tokens of an ``L``-token prompt carries ``l / L`` of ``M.prefill(L) - R(L)`` (what the prompt
  costs beyond a pass over as many tokens: zero where the prefill bounds ``R``);
* the step's device cost is ``R(padded tokens) + decodes' attention + chunks' shares``: one pass for every
  token of the step, so a prompt that joins a decode step reads the weights once with it, and the experts it
  touches are counted once with the decodes' (``R`` at the merged count).

The engine adds what the built-in runtime has not (:class:`EngineTerms`, fitted per GPU from vLLM-served
measurements): time per step beyond the device's (scheduling, input preparation, sampling: ``host_ms`` plus
``per_seq_us`` a sequence), the launches of a PIECEWISE or eager pass (``piecewise_us_per_layer``,
``eager_us_per_layer``), and scales on the device's time and its energy over idle (vLLM's kernels are not the
runtime's). The fixed part and the launches are time the GPU waits: they cost ``gap_power_w``. The per-sequence
part is time the GPU is busy (sampling runs on it, and vLLM's asynchronous scheduling prepares the next step
under the current one; NVML's busy share against the steady state's, ``SteadyState.busy_share``:
reports/energy_model.md, "The per-sequence time keeps the GPU busy"): it costs the device's power of the step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from advisor.formats import GPUSpec
from advisor.plan import Plan
from advisor.search.operating import StepModel
from advisor.serving import vllm_token_budget

#: vLLM's default capture bound: min(2 x max_num_seqs, 512) (vllm/config/vllm.py, VllmConfig._set_cudagraph_sizes)
DEFAULT_CAPTURE_CEILING = 512


@lru_cache(maxsize=256)
def capture_sizes(max_capture_size: int, max_num_batched_tokens: int) -> tuple[int, ...]:
    """The token counts vLLM 0.26.0 captures CUDA graphs for: 1, 2, 4, every 8 below 256, every 16 from 256, up to
    ``min(max_capture_size, max_num_batched_tokens)``, and ``max_num_batched_tokens`` itself where it fits
    (vllm/config/vllm.py, VllmConfig._set_cudagraph_sizes, vLLM 0.26.0)."""
    bound = min(max_capture_size, max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= bound]
    if bound >= 8:
        sizes += range(8, min(bound + 1, 256), 8)
    if bound >= 256:
        sizes += range(256, bound + 1, 16)
    if max_num_batched_tokens <= bound:
        sizes.append(max_num_batched_tokens)
    return tuple(sorted(set(sizes)))


def padded(tokens: int, sizes: Sequence[int]) -> int | None:
    """The captured size a pass of ``tokens`` runs at: the smallest size at or above it; None above the largest
    (the pass runs eagerly, unpadded) (vllm/v1/cudagraph_dispatcher.py, CudagraphDispatcher.dispatch and
    _compute_bs_to_padded_graph_size, vLLM 0.26.0)."""
    if not sizes or tokens > sizes[-1]:
        return None
    lo, hi = 0, len(sizes) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if sizes[mid] < tokens else (lo, mid)
    return sizes[lo]


@dataclass(frozen=True)
class VllmServing:
    """How one vLLM engine is sized: requests in flight, tokens per step (the chunked-prefill budget) and the
    largest CUDA-graph size (None: vLLM's default, ``min(2 x max_num_seqs, 512)``), or the sizes themselves where
    the engine was told which to capture (``cudagraph_capture_sizes``)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_capture_size: int | None = None
    capture_sizes: tuple[int, ...] | None = None

    @property
    def sizes(self) -> tuple[int, ...]:
        if self.capture_sizes is not None:
            return tuple(sorted({s for s in self.capture_sizes if s <= self.max_num_batched_tokens}))
        bound = self.max_capture_size
        if bound is None:
            bound = min(2 * self.max_num_seqs, DEFAULT_CAPTURE_CEILING)
        return capture_sizes(bound, self.max_num_batched_tokens)

    @classmethod
    def as_advisor_serves(cls, batch: int, input_tokens: int, output_tokens: int, gpu: GPUSpec) -> VllmServing:
        """The engine the advisor's own vLLM serving starts for ``batch`` requests (``advisor verify``, the
        measured tier; advisor/deploy/vllm_serve.py): ``max_num_seqs`` the batch, graphs captured up to
        ``16 ceil((batch + prompt) / 16)`` tokens so a step with a prompt in it is captured
        (advisor/deploy/checkpoint/_vllm_config.py, capture_bound), the token budget vLLM's ``LLM``-class default."""
        return cls(batch, _llm_class_budget(gpu, batch, input_tokens + output_tokens),
                   16 * math.ceil((batch + input_tokens) / 16))

    @classmethod
    def vllm_defaults(cls, max_num_seqs: int, max_num_batched_tokens: int) -> VllmServing:
        """An engine left to vLLM's own CUDA-graph bound (e.g. ML.ENERGY's runs)."""
        return cls(max_num_seqs, max_num_batched_tokens, None)


def _llm_class_budget(gpu: GPUSpec, max_num_seqs: int, max_model_len: int) -> int:
    return vllm_token_budget(gpu.memory_gb, max_num_seqs, max_model_len)


@dataclass(frozen=True)
class EngineTerms:
    """What vLLM adds to the built-in runtime's device cost (the profile's ``params``; module docstring)."""

    host_ms: float = 0.0
    per_seq_us: float = 0.0
    piecewise_us_per_layer: float = 0.0
    eager_us_per_layer: float = 0.0
    device_time_scale: float = 1.0
    device_energy_scale: float = 1.0
    #: extra steps a new request waits before its prefill is scheduled (asynchronous scheduling)
    admission_steps: float = 0.0
    gap_power_w: float = 0.0  # what the GPU draws while it waits for the host

    NAMES = ("host_ms", "per_seq_us", "piecewise_us_per_layer", "eager_us_per_layer", "device_time_scale",
             "device_energy_scale", "admission_steps")


@dataclass(frozen=True)
class Chunk:
    """``length`` tokens of an ``of``-token prompt scheduled in one step."""

    length: int
    of: int


@dataclass(frozen=True)
class StepCost:
    """One step: wall ms and J, the device's part of them, the tokens it ran at and how (full, piecewise, eager)."""

    ms: float
    joules: float
    device_ms: float
    device_j: float
    tokens: int
    ran_at: int
    graph: str
    busy_ms: float = 0.0  # the part of ``ms`` the GPU is busy: the device's and the per-sequence time

    @property
    def busy_share(self) -> float:
        return self.busy_ms / self.ms if self.ms > 0 else 0.0


@dataclass
class VllmSteps:
    """The cost of vLLM steps of one model: ``builtin`` gives the device's costs (a predicted tier's step model),
    ``terms`` the engine's, ``layers`` the decoder layers a PIECEWISE or eager pass launches."""

    builtin: StepModel
    terms: EngineTerms
    layers: int
    _calls: dict[tuple, tuple[float, float]] = field(default_factory=dict, repr=False)
    _ids: dict[int, tuple[Plan, str]] = field(default_factory=dict, repr=False)
    _passes: dict[tuple, bool] = field(default_factory=dict, repr=False)

    def _id(self, plan: Plan) -> str:
        """``plan.id`` (a hash of its content, costly at thousands of calls), remembered with the plan itself so
        that the object's identity is not reused while it is cached."""
        known = self._ids.get(id(plan))
        if known is None or known[0] is not plan:
            known = self._ids[id(plan)] = (plan, plan.id)
        return known[1]

    def _cached(self, key: tuple, fn: Callable[[], tuple[float, float]]) -> tuple[float, float]:
        if key not in self._calls:
            self._calls[key] = fn()
        return self._calls[key]

    def _on_grid(self, key: tuple, n: int, fn: Callable[[int], tuple[float, float]]) -> tuple[float, float]:
        """``fn(n)`` read at the powers of two and their midpoints and linear between them: the built-in models
        are piecewise linear in the batch between their profiled batches (which lie on that grid), and a served
        steady state asks for hundreds of token counts."""
        lo, hi = _grid_neighbours(n)
        a = self._cached((*key, lo), lambda: fn(lo))
        if hi == lo:
            return a
        b = self._cached((*key, hi), lambda: fn(hi))
        t = (n - lo) / (hi - lo)
        return a[0] + t * (b[0] - a[0]), a[1] + t * (b[1] - a[1])

    def _decode(self, plan: Plan, n: int, context: float) -> tuple[float, float]:
        return self._on_grid(("decode", self._id(plan), context), n,
                             lambda m: self.builtin.decode_step(plan, m, context))

    def _prefill(self, plan: Plan, n: int) -> tuple[float, float]:
        return self._on_grid(("prefill", self._id(plan)), n, lambda m: self.builtin.prefill(plan, m))

    def rows(self, plan: Plan, n: int) -> tuple[float, float]:
        """``R(n)``: a pass over ``n`` tokens with no KV cache read (ms, J): a decode step at no context, or, where
        the built-in model's decode steps stop short of the compute-bound regime (``pass_is_decode_step``), the
        slower of it and a prompt of ``n`` tokens; never below zero."""
        if n <= 0:
            return 0.0, 0.0
        ms, j = self._decode(plan, n, 0.0)
        if not self._pass_is_decode_step(plan):
            ms, j = max((ms, j), self._prefill(plan, n))
        return max(ms, 0.0), max(j, 0.0)

    def _pass_is_decode_step(self, plan: Plan) -> bool:
        key = ("pass", self._id(plan))
        if key not in self._passes:
            self._passes[key] = self.builtin.pass_is_decode_step(plan)
        return self._passes[key]

    def decode_attention(self, plan: Plan, batch: int, context: float) -> tuple[float, float]:
        """What reading the KV cache of ``batch`` sequences at ``context`` adds to a pass (ms, J)."""
        ms, j = self._decode(plan, batch, context)
        r_ms, r_j = self._decode(plan, batch, 0.0)
        return max(ms - r_ms, 0.0), max(j - r_j, 0.0)

    def prompt_beyond_rows(self, plan: Plan, length: int) -> tuple[float, float]:
        """``M.prefill(L) - R(L)``: what a prompt costs beyond a pass over as many tokens (ms, J)."""
        ms, j = self._prefill(plan, length)
        r_ms, r_j = self.rows(plan, length)
        return max(ms - r_ms, 0.0), max(j - r_j, 0.0)

    def step(self, plan: Plan, batch: int, context: float, chunks: Sequence[Chunk],
             serving: VllmServing) -> StepCost:
        """One step of ``batch`` decodes at ``context`` with ``chunks`` of prompts in it (module docstring)."""
        tokens = batch + sum(c.length for c in chunks)
        ran_at = padded(tokens, serving.sizes)
        graph = "eager" if ran_at is None else ("piecewise" if chunks else "full")
        rows_ms, rows_j = self.rows(plan, tokens if ran_at is None else ran_at)
        att_ms, att_j = self.decode_attention(plan, batch, context) if batch else (0.0, 0.0)
        dev_ms, dev_j = rows_ms + att_ms, rows_j + att_j
        for c in chunks:
            more_ms, more_j = self.prompt_beyond_rows(plan, c.of)
            dev_ms += more_ms * c.length / c.of
            dev_j += more_j * c.length / c.of
        t = self.terms
        launches = {"piecewise": t.piecewise_us_per_layer, "eager": t.eager_us_per_layer}.get(graph, 0.0)
        wait_ms = t.host_ms + launches * self.layers / 1e3
        per_seq_ms = t.per_seq_us * batch / 1e3
        device_ms = t.device_time_scale * dev_ms
        device_j = t.gap_power_w * device_ms / 1e3 + t.device_energy_scale * (dev_j - t.gap_power_w * dev_ms / 1e3)
        device_w = device_j / (device_ms / 1e3) if device_ms > 0 else t.gap_power_w
        joules = device_j + (t.gap_power_w * wait_ms + device_w * per_seq_ms) / 1e3
        return StepCost(device_ms + per_seq_ms + wait_ms, joules, device_ms, device_j, tokens,
                        tokens if ran_at is None else ran_at, graph, device_ms + per_seq_ms)


def _grid_neighbours(n: int) -> tuple[int, int]:
    """The neighbours of ``n`` on 1, 2, 3, 4, 6, 8, 12, ... (``n`` twice where it lies on it)."""
    if n <= 4:
        return n, n
    p = 1 << (n.bit_length() - 1)  # p <= n < 2p
    for lo, hi in ((p, p + p // 2), (p + p // 2, 2 * p)):
        if lo <= n <= hi:
            return (n, n) if n in (lo, hi) else (lo, hi)
    raise AssertionError(n)  # pragma: no cover


def split_prompts(prompts: int, length: int, room: int) -> list[list[Chunk]]:
    """``prompts`` prompts of ``length`` tokens admitted together, as the steps vLLM's scheduler runs them in when
    ``room`` prompt tokens fit a step (max_num_batched_tokens less the decodes): whole prompts while they fit,
    the one that does not cut at the budget and continued in the next step (chunked prefill). At least one step."""
    if prompts <= 0 or length <= 0:
        return [[]]
    room = max(room, 1)
    steps: list[list[Chunk]] = [[]]
    left = room
    for _ in range(prompts):
        todo = length
        while todo > 0:
            if left == 0:
                steps.append([])
                left = room
            take = min(todo, left)
            steps[-1].append(Chunk(take, length))
            todo -= take
            left -= take
    return steps
