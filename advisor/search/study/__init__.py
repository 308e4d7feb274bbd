"""The Optuna study over per-group formats: its objective and its run (``_study``); the study opened for a run,
created or resumed and claimed for it (``_open``); its key, the settings that make two trials' numbers comparable
(``_key``); what it has scored and queued, read from the study itself (``_plan_queue``); an interrupt inside a
trial logged as one line (``_interrupt_log``).

Import order inside: ``_key``, ``_plan_queue`` and ``_interrupt_log`` < ``_open`` < ``_study``.
"""

from advisor.search.study._interrupt_log import silence_interrupt_tracebacks
from advisor.search.study._key import (
    KEY_ATTR,
    absolute_local_path,
    check_same_key,
    check_same_model,
    check_same_scoring,
    key_differences,
    study_key,
)
from advisor.search.study._open import make_sampler, open_owned_study, open_study
from advisor.search.study._plan_queue import enqueue_baselines
from advisor.search.study._study import (
    Evaluation,
    PlanEvaluator,
    Proposer,
    baseline_plans,
    benchmark_budget,
    candidates,
    enqueue_opening,
    finished_trials,
    run_search,
    save_run_meta,
)

__all__ = [
    "KEY_ATTR", "Evaluation", "PlanEvaluator", "Proposer", "absolute_local_path", "baseline_plans",
    "benchmark_budget", "candidates", "check_same_key", "check_same_model", "check_same_scoring",
    "enqueue_baselines", "enqueue_opening", "finished_trials", "key_differences", "make_sampler",
    "open_owned_study", "open_study",
    "run_search", "save_run_meta", "silence_interrupt_tracebacks", "study_key",
]
