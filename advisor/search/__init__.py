"""The search: an Optuna study over per-group formats, sensitivity-guided proposals, the
multi-fidelity policy, and the Pareto front with the recommendation rule.

Pure logic over Optuna: nothing here imports torch, ModelOpt, lm-eval or pynvml.
"""

from advisor.search.frontier import Candidate, Recommendation, hypervolume, pareto_front, recommend
from advisor.search.study import Evaluation, PlanEvaluator, open_study, run_search

__all__ = [
    "Candidate", "Evaluation", "PlanEvaluator", "Recommendation", "hypervolume", "open_study", "pareto_front",
    "recommend", "run_search",
]
