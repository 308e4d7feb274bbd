"""What `advisor verify` and `advisor recheck` check and report: a stored recommendation re-checked on a new model
version and the run's ``summary.json`` read back (``_recheck``), whether a model is a new version of the run's at
all (``_model_identity``), verify.md and the "Verified in vLLM" section of report.md (``_verify_report``), and each
plan's vLLM serving kept the moment it finishes so a verify cut off resumes (``_served_store``).

Torch-free at import. The four import none of each other; ``_served_store`` and ``_verify_report`` import
:mod:`advisor.deploy.vllm`.
"""

from advisor.deploy.verification._model_identity import architecture, check_new_version, tokenizer_fingerprint
from advisor.deploy.verification._recheck import (
    Check,
    RecheckResult,
    neighbours,
    objective_checks,
    operating_batches,
    read_summary,
    recheck_checks,
    render_markdown,
    score_benchmark,
    stored_numbers,
    stored_plan,
    summary_recipe,
)
from advisor.deploy.verification._served_store import FOLDER, read_serving, serving_key, write_serving
from advisor.deploy.verification._verify_report import (
    BUSY_BELOW,
    num,
    over_budget,
    render_verify,
    served_decision,
    served_operating_summary,
    shown_role,
    write_report_section,
)

__all__ = [
    "BUSY_BELOW", "FOLDER", "Check", "RecheckResult", "architecture", "check_new_version", "neighbours", "num",
    "objective_checks", "operating_batches", "over_budget", "read_serving", "read_summary", "recheck_checks",
    "render_markdown", "render_verify", "score_benchmark", "served_decision", "served_operating_summary",
    "serving_key", "shown_role", "stored_numbers", "stored_plan", "summary_recipe", "tokenizer_fingerprint",
    "write_report_section", "write_serving",
]
