"""The search: an Optuna study over per-group formats, sensitivity-guided proposals, the
multi-fidelity policy, and the Pareto front with the recommendation rule.

In wings, each ``__init__`` its public face and the rest private: ``study`` (the study: opened, keyed, run),
``storage`` (storage URLs, ownership, recovery, the trial budget), ``operating`` (operating points, predicted and
measured; payback), ``measured`` (the engine contract, the measurement queue, the energy tiers). Beside them:
``stats``, ``acceptance``, ``frontier``, ``trial_record``, ``policy``, ``proposals``, ``sensitivity``. Import
order: ``stats`` < ``acceptance`` < ``frontier``, ``trial_record``; ``storage`` and ``operating`` < ``measured`` <
``study`` < ``policy``.

Pure logic over Optuna: nothing here imports torch, ModelOpt, lm-eval or pynvml.
"""

from advisor.search.frontier import Candidate, Recommendation, hypervolume, pareto_front, recommend
from advisor.search.study import Evaluation, PlanEvaluator, open_study, run_search

__all__ = [
    "Candidate", "Evaluation", "PlanEvaluator", "Recommendation", "hypervolume", "open_study", "pareto_front",
    "recommend", "run_search",
]
