"""lm-eval per-item results of a plan and of BF16 on the same items, for the sequential judge.

Both sides of a pair are the first ``n`` items of the task's seeded order; each plan's
items are scored once and cached (``advisor.accuracy.harness.score_plan``), so growing
``n`` scores only the new items, and BF16 is scored once for every plan it is paired with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from advisor.plan import Plan
from advisor.search.acceptance import PlanAcceptance, TaskAcceptance
from advisor.search.policy import PairedItems

if TYPE_CHECKING:
    from advisor.accuracy.score_cache import TaskScore


class PairedScorer:
    def __init__(
        self,
        assemble: Callable[[Plan], Any],
        tokenizer: Any,
        model_hash: str,
        reference: Plan,
        tasks: Sequence[str],
        n_docs: Mapping[str, int],
        seed: int,
        data_dir: str | Path | None,
        cache_dir: Path,
        batch_size: int | None = None,  # None: harness.default_batch_size
    ) -> None:
        from advisor.accuracy.harness import task_key

        self.assemble, self.tokenizer, self.model_hash = assemble, tokenizer, model_hash
        self.reference = reference
        self.spec_of = {task_key(t): t for t in tasks}  # name in results -> name as given
        self.n_docs = dict(n_docs)
        self.seed, self.data_dir, self.cache_dir, self.batch_size = seed, data_dir, cache_dir, batch_size
        self.largest: dict[tuple[str, str], TaskScore] = {}  # (plan id, task) -> the score of the most items
        self.items_used = 0

    def score(self, plan: Plan, task: str, n: int) -> TaskScore:
        """The TaskScore of ``plan`` on the first ``n`` items of ``task``."""
        from advisor.accuracy.harness import score_plan

        before = self.largest.get((plan.id, task))
        (score,) = score_plan(
            self.assemble(plan), self.tokenizer, plan.id, self.model_hash, [self.spec_of[task]],
            limit=n, seed=self.seed, data_dir=self.data_dir, cache_dir=self.cache_dir,
            batch_size=self.batch_size, n_docs=self.n_docs,
        ).values()
        if before is None or score.n > before.n:
            self.items_used += score.n - (before.n if before is not None else 0)
            self.largest[(plan.id, task)] = score
        return score

    def paired(self, plan: Plan, task: str, n: int) -> PairedItems:
        ref = self.score(self.reference, task, n)
        got = self.score(plan, task, n)
        order = sorted(got.items)
        if order != sorted(ref.items):
            raise RuntimeError(f"{task}: BF16 and plan {plan.id} were scored on different items")
        return PairedItems(got.metric, [ref.items[i] for i in order], [got.items[i] for i in order],
                           got.higher_is_better)

    def scores_of(self, plan: Plan) -> dict[str, dict[str, Any]]:
        """The plan's largest scored subset per task, without per-item values (for the study)."""
        return {task: s.to_dict(with_items=False) for (pid, task), s in self.largest.items() if pid == plan.id}

    def judge(self, plan: Plan, n_available: Mapping[str, int], first_batch: int, max_drop: float,
              confidence: float, on_look: Callable[[str, TaskAcceptance], None] | None = None) -> PlanAcceptance:
        from advisor.search.policy import judge_sequentially

        return judge_sequentially(lambda task, n: self.paired(plan, task, n), dict(n_available), first_batch,
                                  max_drop, confidence, on_look)
