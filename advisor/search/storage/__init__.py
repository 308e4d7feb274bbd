"""Where a study lives and who works on it: Optuna storage URLs opened, judged before use (``_driver``) and never
shown with their password (``_url``); the one `advisor search` that owns a study (``_ownership``) and the processes
of this host that records name (``_processes``); trials stranded by a dead process or an interrupt, retried
(``_recovery``); one trial budget however many workers share it, and the loop every worker runs (``_budget``); the
token sets every worker downloads from the study's artifact store (``_artifacts``).

Import order inside: ``_url`` and ``_processes`` < ``_driver``, ``_recovery``, ``_ownership`` < ``_storage``,
``_budget``; ``_artifacts`` stands alone.
"""

from advisor.search.storage._artifacts import fetch_tokens, share_tokens
from advisor.search.storage._budget import PLAN_ERRORS, TrialBudget, reap, work
from advisor.search.storage._driver import check_storage_reachable, check_storage_url
from advisor.search.storage._ownership import (
    OWNER_ATTR,
    SETTLE_S,
    STALE_S,
    StudyOwnership,
    claim_study,
    in_use_error,
    owner_is_live,
    read_owner,
)
from advisor.search.storage._processes import describe_holder, holder_is_running, is_running, this_process
from advisor.search.storage._recovery import (
    PLAN_ERROR_ATTR,
    WORKER_ATTR,
    requeue_failed_trials,
    retry_callback,
    retry_interrupted_trials,
    this_worker,
)
from advisor.search.storage._storage import absolute_url, default_url, open_storage, portable_url, resolve_url
from advisor.search.storage._url import (
    JOURNAL_PREFIX,
    ambiguous_password,
    redact_seen,
    redact_text,
    redact_url,
    remember_url,
    url_without_password,
)

__all__ = [
    "JOURNAL_PREFIX", "OWNER_ATTR", "PLAN_ERRORS", "PLAN_ERROR_ATTR", "SETTLE_S", "STALE_S", "WORKER_ATTR",
    "StudyOwnership", "TrialBudget", "absolute_url", "ambiguous_password", "check_storage_reachable",
    "check_storage_url", "claim_study", "default_url", "describe_holder", "fetch_tokens", "holder_is_running",
    "in_use_error", "is_running", "open_storage", "owner_is_live", "portable_url", "read_owner", "reap",
    "redact_seen", "redact_text", "redact_url", "remember_url", "requeue_failed_trials", "resolve_url",
    "retry_callback", "retry_interrupted_trials", "share_tokens", "this_process", "this_worker",
    "url_without_password", "work",
]
