"""A MoE layer's routed experts in the measurement runtime: router, grouped GEMMs, weighted combine.

What fused-MoE serving kernels do, with PyTorch's grouped GEMMs:

* the router (BF16, never quantized) scores every expert; softmax, top-k, optionally
  renormalized (Mixtral, Qwen3-MoE);
* the token copies are sorted by expert (a fixed-size stable sort, so a CUDA graph captures
  it), and each expert's rows run as one group of ``torch._grouped_mm`` (BF16, CUTLASS
  grouped GEMM on Hopper) or ``torch._scaled_grouped_mm`` (FP8 E4M3: one static input
  scale per projection, one weight scale per expert, as ModelOpt exports fused experts);
  an expert no token chose has an empty group and its weights are not read;
* gate/up and down are two grouped GEMMs with the fused act*up kernel between them
  (which also quantizes to FP8); the outputs are weighted by the routing probabilities
  and summed per token in float32.

Without CUDA (tests, Triton's interpreter) the grouped GEMMs run as a loop over experts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from advisor.energy.runtime import kernels as K
from advisor.energy.runtime._dims import MoESpec
from advisor.errors import SetupError
from advisor.formats import Format

FP8_MAX = 448.0


def _per_expert_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, N, K] BF16 -> (E4M3 codes [E, N, K], scales [E]) with one amax/448 scale per expert."""
    scale = (w.abs().amax(dim=(1, 2)).float().clamp(min=1e-12) / FP8_MAX)
    codes = torch.empty_like(w, dtype=torch.float8_e4m3fn)
    for e in range(w.shape[0]):  # one expert at a time: no float32 copy of the whole layer
        codes[e] = (w[e].float() / scale[e]).clamp(-FP8_MAX, FP8_MAX)
    return codes, scale


class Dispatch(NamedTuple):
    """Token copies sorted by expert: ``xs`` [T*k, hidden] (FP8 codes for FP8 experts), ``offs``
    each expert's end row, ``order`` the sort (copy index of each row), ``weights`` [T, k]."""

    xs: torch.Tensor
    offs: torch.Tensor
    order: torch.Tensor
    weights: torch.Tensor


class RoutedExperts:
    """One layer's routed experts in one format (``Format.BF16`` or ``Format.FP8``)."""

    def __init__(self, spec: MoESpec, router: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, fmt: Format,
                 amax_in: float | None = None, amax_mid: float | None = None, activation: str = "silu") -> None:
        self.spec, self.router, self.fmt, self.activation = spec, router, fmt, activation
        self.num_experts = gate_up.shape[0]
        if fmt == Format.BF16:
            self.w1, self.w2 = gate_up, down
            self.inv_x1 = self.inv_x2 = None
        elif fmt == Format.FP8:
            if amax_in is None or amax_mid is None:
                raise SetupError("FP8 experts need the calibrated amax of their input and of the act*up output")
            self.w1, s1 = _per_expert_fp8(gate_up)
            self.w2, s2 = _per_expert_fp8(down)
            # scaled_grouped_mm takes row-wise scales: the per-tensor ones broadcast
            self.scale_w1 = s1[:, None].expand(-1, gate_up.shape[1]).contiguous()
            self.scale_w2 = s2[:, None].expand(-1, down.shape[1]).contiguous()
            self.scale_x1 = torch.tensor([max(amax_in, 1e-12) / FP8_MAX], device=gate_up.device)
            self.scale_x2 = torch.tensor([max(amax_mid, 1e-12) / FP8_MAX], device=gate_up.device)
            self.inv_x1, self.inv_x2 = 1.0 / self.scale_x1, 1.0 / self.scale_x2
        else:
            raise SetupError(f"{fmt.value} experts are not in the measurement runtime (BF16, FP8)")
        self.track = False  # set to record the experts each eager call touches (a host sync)
        self.touched: list[int] = []  # distinct experts of each tracked call
        self.load = torch.zeros(self.num_experts, dtype=torch.float64)  # choices per expert, tracked calls
        self.tokens_seen = 0
        self.loop = False  # run the grouped GEMMs as a loop over experts (the reference, also on a GPU)
        self._expert_ids: torch.Tensor | None = None
        self._row_scales: dict[tuple[int, int], torch.Tensor] = {}  # (projection, rows) -> FP8 input scales

    @property
    def weight_bytes(self) -> int:
        return sum(w.numel() * w.element_size() for w in (self.w1, self.w2))

    def expert_bytes(self) -> float:
        """Bytes of one expert's gate/up and down weights in this format."""
        return self.weight_bytes / self.num_experts

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(top-k expert ids [T, k], their weights [T, k] float32) of tokens ``x`` [T, hidden].

        The top-k of the logits is the top-k of the softmax, and the softmax renormalized over
        the top k is the softmax of their logits: one softmax of k values, not of E.
        """
        logits = F.linear(x, self.router).float()
        if self.spec.norm_topk_prob:
            top, ids = logits.topk(self.spec.top_k, dim=-1)
            return ids, torch.softmax(top, dim=-1)
        weights, ids = torch.softmax(logits, dim=-1).topk(self.spec.top_k, dim=-1)
        return ids, weights

    def dispatch(self, x: torch.Tensor) -> Dispatch:
        """Route tokens ``x`` [T, hidden] and sort their copies by expert: the grouped GEMMs' inputs."""
        ids, weights = self.route(x)
        flat = ids.reshape(-1)
        sorted_ids, order = flat.sort(stable=True)  # token copies grouped by expert
        if self._expert_ids is None or self._expert_ids.device != x.device:
            self._expert_ids = torch.arange(self.num_experts, device=x.device, dtype=sorted_ids.dtype)
        offs = torch.searchsorted(sorted_ids, self._expert_ids, right=True, out_int32=True)  # each group's end row
        if self.track:
            per_expert = torch.bincount(flat, minlength=self.num_experts).double().cpu()
            self.touched.append(int((per_expert > 0).sum()))
            self.load += per_expert
            self.tokens_seen += x.shape[0]
        rows = order // self.spec.top_k  # the token of each sorted copy
        if self.fmt == Format.FP8:
            x8 = K.quant_fp8(x, self.inv_x1)
            xs = x8.view(torch.uint8)[rows].view(torch.float8_e4m3fn)
        else:
            xs = x[rows]
        return Dispatch(xs, offs, order, weights)

    def expert_gemms(self, d: Dispatch, record: Callable[[str, torch.Tensor], None] | None = None,
                     key: str = "") -> torch.Tensor:
        """gate/up, the fused act*up, down: each sorted token copy's expert output [T*k, hidden]."""
        h = self._gemm(d.xs, 1, d.offs)
        a = K.gated_act(h, self.activation, self.inv_x2)
        if record is not None:
            record(f"{key}_down", a)
        return self._gemm(a, 2, d.offs)

    def __call__(self, x: torch.Tensor, record: Callable[[str, torch.Tensor], None] | None = None,
                 key: str = "") -> torch.Tensor:
        t, k = x.shape[0], self.spec.top_k
        if record is not None:
            record(f"{key}", x)
        d = self.dispatch(x)
        y = self.expert_gemms(d, record, key)
        out = torch.empty_like(y)
        out[d.order] = y  # back to token-major: copy j of token i at row i*k + j
        # weights in BF16, as transformers' routers return them; one batched GEMV sums the k copies
        return torch.bmm(d.weights.to(torch.bfloat16)[:, None, :], out.view(t, k, -1)).view(t, -1)

    def _gemm(self, xs: torch.Tensor, which: int, offs: torch.Tensor) -> torch.Tensor:
        w = self.w1 if which == 1 else self.w2  # [E, N, K]
        if not xs.is_cuda or self.loop:
            return self._loop(xs, w, which, offs)
        if self.fmt == Format.BF16:
            return torch._grouped_mm(xs, w.transpose(1, 2), offs=offs)
        key = (which, xs.shape[0])
        if key not in self._row_scales:  # made once per row count (in the warm-up before a capture)
            self._row_scales[key] = (self.scale_x1 if which == 1 else self.scale_x2).expand(xs.shape[0]).contiguous()
        scale_x = self._row_scales[key]
        scale_w = self.scale_w1 if which == 1 else self.scale_w2
        return torch._scaled_grouped_mm(xs, w.transpose(1, 2), scale_x, scale_w, offs=offs, out_dtype=torch.bfloat16)

    def _loop(self, xs: torch.Tensor, w: torch.Tensor, which: int, offs: torch.Tensor) -> torch.Tensor:
        """The grouped GEMM as a loop over experts (CPU): same rounding points, float32 accumulation."""
        out = torch.zeros(xs.shape[0], w.shape[1], dtype=torch.bfloat16, device=xs.device)
        start = 0
        for e, end in enumerate(offs.tolist()):
            if end > start:
                if self.fmt == Format.BF16:
                    out[start:end] = (xs[start:end].float() @ w[e].float().t()).to(torch.bfloat16)
                else:
                    sx = (self.scale_x1 if which == 1 else self.scale_x2).float()
                    sw = (self.scale_w1 if which == 1 else self.scale_w2)[e, 0]
                    out[start:end] = ((xs[start:end].float() @ w[e].float().t()) * sx * sw).to(torch.bfloat16)
            start = end
        return out
