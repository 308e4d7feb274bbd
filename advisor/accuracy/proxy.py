"""The fast accuracy proxy: KL(BF16 || plan) and perplexity on held-out tokens.

With ``layers`` (the dotted path of the decoder-layer list), the reference pass also
records every decoder layer's output, and :meth:`ProxyEvaluator.score` can skip the
leading layers of a plan that leaves them as they were: ``reuse_layers=L`` runs the model
with layers ``[0, L)`` replaced by stand-ins that return the recorded outputs. The
sensitivity pass quantizes one group at a time, so it skips on average half the layers;
the result is the same number (tests/test_proxy.py compares every group).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import torch

from advisor.models.replicas import Ranks


@dataclass(frozen=True)
class ProxyScore:
    kl: float  # mean per-token KL(BF16 || plan), nats
    ppl: float  # perplexity of the plan on the held-out next tokens
    ppl_bf16: float
    tokens: int

    @property
    def ppl_increase_pct(self) -> float:
        return 100.0 * (self.ppl / self.ppl_bf16 - 1.0)

    def to_dict(self) -> dict:
        return {**asdict(self), "ppl_increase_pct": self.ppl_increase_pct}


class _RecordedLayer(torch.nn.Module):
    """Stands in for a decoder layer whose output on each held-out batch is already known.

    Attribute reads fall through to the real layer (model loops read e.g. a layer's
    ``attention_type``); its parameters are not registered here.
    """

    def __init__(self, layer: torch.nn.Module, outputs: list[Any]) -> None:
        super().__init__()
        object.__setattr__(self, "_layer", layer)
        self._outputs = outputs
        self.batch = 0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._outputs[self.batch]

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_layer"), name)


class ProxyEvaluator:
    """Holds the BF16 reference log-probs (computed once) and scores any model against them."""

    def __init__(
        self, reference_model: torch.nn.Module, heldout: torch.Tensor, batch_size: int = 4, layers: str | None = None,
        ranks: Ranks | None = None,
    ) -> None:
        """``ranks`` spread over a node: each rank computes every ``world``-th batch of the reference and receives
        the others' (the same batches as one process, so the same numbers, bit for bit)."""
        self.heldout = heldout
        self.batch_size = batch_size
        self.layers = layers
        self._layer_outputs: list[list[Any]] = []  # [layer][batch], when ``layers`` is given
        if ranks is not None and ranks.spread:
            if layers is not None:
                raise ValueError("a reference spread over ranks records no layer outputs; give layers=None")
            self._ref_logprobs = self._spread_reference(reference_model, ranks)
        else:
            with self._recording(reference_model):
                self._ref_logprobs = list(self._logprobs(reference_model))
        self.ppl_bf16 = math.exp(self._nll(self._ref_logprobs))

    def _spread_reference(self, model: torch.nn.Module, ranks: Ranks) -> list[torch.Tensor]:
        n = -(-self.heldout.shape[0] // self.batch_size)
        mine = ranks.indices(n)
        with ranks.busy("reference"):
            own = dict(zip(mine, self._logprobs(model, batches=mine), strict=True))
        shapes = ranks.merged({b: tuple(lp.shape) for b, lp in own.items()})
        return [ranks.broadcast_(own[b] if b in own else torch.empty(shapes[b], dtype=torch.float32), ranks.owner(b))
                for b in range(n)]

    @contextmanager
    def _recording(self, model: torch.nn.Module) -> Iterator[None]:
        if self.layers is None:
            yield
            return
        stack = model.get_submodule(self.layers)
        self._layer_outputs = [[] for _ in stack]
        hooks = [layer.register_forward_hook(lambda _m, _a, out, i=i: self._layer_outputs[i].append(out))
                 for i, layer in enumerate(stack)]
        try:
            yield
        finally:
            for h in hooks:
                h.remove()

    @contextmanager
    def _replaying(self, model: torch.nn.Module, count: int) -> Iterator[list[_RecordedLayer]]:
        if count <= 0:
            yield []
            return
        if not self._layer_outputs:
            raise ValueError("reuse_layers needs an evaluator built with layers= (the decoder-layer list)")
        stack = model.get_submodule(self.layers or "")
        originals = [stack[i] for i in range(count)]
        stand_ins = [_RecordedLayer(layer, self._layer_outputs[i]) for i, layer in enumerate(originals)]
        for i, stand_in in enumerate(stand_ins):
            stack[i] = stand_in
        try:
            yield stand_ins
        finally:
            for i, layer in enumerate(originals):
                stack[i] = layer

    @torch.no_grad()
    def _logprobs(self, model: torch.nn.Module, stand_ins: Sequence[_RecordedLayer] = (),
                  batches: Sequence[int] | None = None) -> Iterator[torch.Tensor]:
        device = next(model.parameters()).device
        starts = range(0, self.heldout.shape[0], self.batch_size)
        for batch in range(len(starts)) if batches is None else batches:
            i = starts[batch]
            for stand_in in stand_ins:
                stand_in.batch = batch
            ids = self.heldout[i : i + self.batch_size].to(device)
            logits = model(input_ids=ids, use_cache=False).logits
            yield torch.log_softmax(logits.float(), dim=-1).cpu()

    def _nll(self, logprobs: list[torch.Tensor]) -> float:
        total, count = 0.0, 0
        for i, lp in enumerate(logprobs):
            ids = self.heldout[i * self.batch_size : (i + 1) * self.batch_size]
            target = ids[:, 1:]
            picked = lp[:, :-1].gather(-1, target.unsqueeze(-1)).squeeze(-1)
            total -= picked.sum().item()
            count += target.numel()
        return total / count

    def reference_score(self) -> ProxyScore:
        """What :meth:`score` returns for the reference model itself, without running it again."""
        return ProxyScore(kl=0.0, ppl=self.ppl_bf16, ppl_bf16=self.ppl_bf16, tokens=int(self.heldout.numel()))

    @torch.no_grad()
    def score(self, model: torch.nn.Module, reuse_layers: int = 0) -> ProxyScore:
        """Score ``model``; ``reuse_layers=L`` takes layers ``[0, L)``'s outputs from the reference
        pass, which is exact only when those layers are unchanged from the reference model."""
        kl_sum, count, nll_sum = 0.0, 0, 0.0
        with self._replaying(model, reuse_layers) as stand_ins:
            for i, lp in enumerate(self._logprobs(model, stand_ins)):
                ref = self._ref_logprobs[i]
                kl_sum += (ref.exp() * (ref - lp)).sum(-1).sum().item()
                count += ref.shape[0] * ref.shape[1]
                ids = self.heldout[i * self.batch_size : (i + 1) * self.batch_size]
                nll_sum -= lp[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).sum().item()
        ntok = self.heldout.shape[0] * (self.heldout.shape[1] - 1)
        return ProxyScore(
            kl=max(kl_sum / count, 0.0), ppl=math.exp(nll_sum / ntok), ppl_bf16=self.ppl_bf16, tokens=count
        )
