"""The fast accuracy proxy: KL(BF16 || plan) and perplexity on held-out tokens."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch


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


class ProxyEvaluator:
    """Holds the BF16 reference log-probs (computed once) and scores any model against them."""

    def __init__(self, reference_model: torch.nn.Module, heldout: torch.Tensor, batch_size: int = 4) -> None:
        self.heldout = heldout
        self.batch_size = batch_size
        self._ref_logprobs = [lp for lp in self._logprobs(reference_model)]
        nll = self._nll(self._ref_logprobs)
        self.ppl_bf16 = math.exp(nll)

    @torch.no_grad()
    def _logprobs(self, model: torch.nn.Module):
        device = next(model.parameters()).device
        for i in range(0, self.heldout.shape[0], self.batch_size):
            ids = self.heldout[i : i + self.batch_size].to(device)
            yield torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1).cpu()

    def _nll(self, logprobs: list[torch.Tensor]) -> float:
        total, count = 0.0, 0
        for i, lp in enumerate(logprobs):
            ids = self.heldout[i * self.batch_size : (i + 1) * self.batch_size]
            target = ids[:, 1:]
            picked = lp[:, :-1].gather(-1, target.unsqueeze(-1)).squeeze(-1)
            total -= picked.sum().item()
            count += target.numel()
        return total / count

    @torch.no_grad()
    def score(self, model: torch.nn.Module) -> ProxyScore:
        kl_sum, count, nll_sum = 0.0, 0, 0.0
        for i, lp in enumerate(self._logprobs(model)):
            ref = self._ref_logprobs[i]
            kl_sum += (ref.exp() * (ref - lp)).sum(-1).sum().item()
            count += ref.shape[0] * ref.shape[1]
            ids = self.heldout[i * self.batch_size : (i + 1) * self.batch_size]
            nll_sum -= lp[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).sum().item()
        ntok = self.heldout.shape[0] * (self.heldout.shape[1] - 1)
        return ProxyScore(
            kl=max(kl_sum / count, 0.0), ppl=math.exp(nll_sum / ntok), ppl_bf16=self.ppl_bf16, tokens=count
        )
