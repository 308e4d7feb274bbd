"""What the search cost in energy, and how long the recommendation takes to pay it back (the arithmetic;
:mod:`advisor.workflows.operating` meters the run)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

SECONDS_PER_DAY = 86_400


@dataclass(frozen=True)
class SearchEnergy:
    joules: float
    seconds: float
    source: str
    measured: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def plus(self, other: SearchEnergy | None) -> SearchEnergy:
        """This run's energy added to an earlier run's of the same study (a resumed search)."""
        if other is None:
            return self
        measured = self.measured and other.measured
        source = self.source if self.source == other.source else f"{self.source}; earlier: {other.source}"
        return SearchEnergy(self.joules + other.joules, self.seconds + other.seconds, source, measured)


@dataclass(frozen=True)
class Payback:
    """The recommendation's saving against BF16 at ``requests_per_s`` and the days it takes to repay the search
    (None: it saves nothing, so it never pays back)."""

    search_j: float
    search_source: str
    workload: str
    requests_per_s: float
    tokens_per_day: float
    saved_j_per_token: float
    saved_j_per_day: float
    days: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def payback(search: SearchEnergy, workload: str, requests_per_s: float, output_tokens: int,
            bf16_j_per_token: float, recommended_j_per_token: float) -> Payback:
    """Joules saved per day serving ``requests_per_s`` requests of ``output_tokens`` tokens with the
    recommendation instead of BF16, and the days until they equal the search's joules."""
    tokens_per_day = requests_per_s * SECONDS_PER_DAY * output_tokens
    saved = bf16_j_per_token - recommended_j_per_token
    per_day = saved * tokens_per_day
    days = search.joules / per_day if per_day > 0 else None
    return Payback(search.joules, search.source, workload, requests_per_s, tokens_per_day, saved, per_day, days)


def describe_days(days: float | None) -> str:
    if days is None:
        return "never (the recommendation saves no energy against BF16)"
    if days * 24 < 1:
        return f"{days * 24 * 60:.1f} minutes"
    if days < 2:
        return f"{days * 24:.1f} hours"
    return f"{days:.1f} days"
