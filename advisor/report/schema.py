"""summary.json: the typed, versioned record of a run that `show`, `export`, `recheck` and CI read.

Bump :data:`SCHEMA_VERSION` whenever a field changes meaning or shape; readers refuse
other versions with a clear message (rebuild with `advisor report RUN_DIR`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from advisor.errors import InputError
from advisor.estimate import DriftCheck, EnergyEstimate, MeasuredUnit
from advisor.formats import Format
from advisor.plan import Plan
from advisor.search.operating import Payback

FIT_STATISTICS = ("spearman", "spearman_ci", "slope", "slope_ci", "intercept")  # as advisor.search.stats
NON_FINITE = ("NaN", "Infinity", "-Infinity")  # how summary.json writes a float that is not finite

SCHEMA_VERSION = 3
# 1: the untyped summary.json written before 2026-11-22 (no schema_version)
# 2: benchmark scores as {task: {acc, acc_stderr, ...}} and a mean drop over tasks (benchmark_drop)
# 3: benchmark scores of any primary metric ({task: {metric, value, stderr, ...}}), per-task paired
#    intervals and verdicts against BF16 (acceptance), proxy calibration per task


class _Record(BaseModel):
    # a float that is not finite is written "NaN" / "Infinity" (and read back as such), never as null,
    # which no float field would accept
    model_config = ConfigDict(ser_json_inf_nan="strings")


class BenchmarkScore(_Record):
    """A plan's primary metric on one task (the items it was scored on)."""

    model_config = ConfigDict(extra="allow")

    task: str
    metric: str  # lm-eval result key, e.g. "acc,none", "exact_match,flexible-extract"
    value: float
    stderr: float | None
    n: int
    n_docs: int = 0
    higher_is_better: bool = True


Verdict = Literal["passes", "fails", "undecided"]


class TaskVerdict(_Record):
    """A plan's drop against BF16 on one task, paired on the same items, and the verdict."""

    task: str
    metric: str
    verdict: Verdict
    n_items: int  # items the sequential judge needed
    n_available: int  # items it could have used
    looks: int  # looks of its schedule (the interval level corrects for them)
    drop: float  # BF16 minus plan (positive: worse), a fraction
    ci_low: float
    ci_high: float
    confidence: float  # level of this interval
    method: str


class Acceptance(_Record):
    verdict: Verdict
    tasks: list[TaskVerdict]


class ProxyCalibrationRecord(_Record):
    """Benchmark drop against proxy KL over the scored plans of one task. A statistic that cannot be
    computed (too few plans, ties) is null, and ``undefined`` names it with the reason."""

    task: str
    n_plans: int
    spearman: float | None
    spearman_ci: tuple[float, float] | None
    slope: float | None  # drop per nat of KL
    slope_ci: tuple[float, float] | None
    intercept: float | None
    contradicted_pairs: list[tuple[str, str]]  # (proxy's better plan, benchmark's clearly better plan)
    disagrees: bool
    confidence: float
    undefined: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _undefined_as_null(cls, data: Any) -> Any:
        """Summaries written before ``undefined`` existed held NaN as null, e.g. a slope interval
        ``[null, null]`` for tied drops: read such a statistic as undefined, not as a broken file."""
        if not isinstance(data, dict):
            return data
        data = {**data, "undefined": dict(data.get("undefined") or {})}
        for key in FIT_STATISTICS:
            value = data.get(key)
            parts = value if isinstance(value, list | tuple) else [value]
            if any(p is None or (isinstance(p, float) and not math.isfinite(p)) or p in NON_FINITE for p in parts):
                data[key] = None
                data["undefined"].setdefault(key, "undefined (this summary does not say why)")
        return data


class TrialRecord(_Record):
    model_config = ConfigDict(extra="allow")

    trial: int
    plan_id: str
    label: str
    formats: dict[str, str]
    kv_cache: str = "bf16"  # KV-cache format (absent in summaries written before it was searched)
    effective_bits: float
    kl: float
    ppl: float
    ppl_increase_pct: float
    energy: list[EnergyEstimate]  # what the front and the recommendation use: measured where it exists
    predicted_energy: list[EnergyEstimate] = Field(default_factory=list)
    energy_measured: bool = False
    prediction_error_pct: dict[str, float] | None = None  # (predicted - measured) / measured per workload
    feasible: bool
    benchmark: dict[str, BenchmarkScore] = Field(default_factory=dict)
    acceptance: Acceptance | None = None  # None: not judged against BF16 (or BF16 itself)

    def energy_by_workload(self) -> dict[str, float]:
        return {e.workload: e.j_per_token for e in self.energy}


class RecommendationRecord(TrialRecord):
    reason: str
    accuracy_metric: str


class MeteredBatch(_Record):
    """A plan's numbers at one batch in flight: the one operating-point record that every other form extends (a batch
    a search metered, :mod:`advisor.search.operating`; what an engine served, verify.json)."""

    batch: int
    tpot_ms: float | None = None  # at the objective's percentile; None: the engine does not time it
    ttft_ms: float | None = None
    j_per_token: float | None = None
    tokens_per_s: float | None = None
    meets: bool | None = None  # the objective as measured; None: not known
    gpu_busy_pct: float | None = None  # NVML's utilization over the load; None: not read


class MeasuredPointRecord(MeteredBatch):
    """An operating point as a measured tier or an engine found it (:mod:`advisor.search.operating`): the largest
    batch metered that meets the objective as measured (where none met, the smallest metered), from the
    predicted point's batch (``predicted_batch``) down; ``trail``: every batch metered; ``search``: what the
    search concluded, in words; ``not_measured`` says why a point has no numbers."""

    plan_id: str | None = None  # named where the record travels alone (verify.json); in summary.json its point says
    workload: str | None = None
    predicted_batch: int | None = None  # None: a summary written before the search (batch is the predicted one)
    trail: list[MeteredBatch] = Field(default_factory=list)
    search: str | None = None
    prediction_error_pct: dict[str, float] | None = None  # (predicted - measured) / measured at predicted_batch
    source: str = ""
    measured_at: str | None = None
    decode_step_ms: float | None = None
    not_measured: str | None = None


class OperatingPointRecord(MeteredBatch):
    """A plan's largest batch under a workload's latency objective (:mod:`advisor.search.operating`); predicted
    from the step times of the predicted tier, labelled in ``source``."""

    plan_id: str
    plan: str
    workload: str
    meets: bool  # False: not even batch 1 meets the objective (the numbers are batch 1's)
    bound: str  # what stopped the batch: objective, memory or max_concurrency
    tpot_ms: float
    ttft_ms: float
    j_per_token: float
    tokens_per_s: float
    power_w: float
    source: str
    power_cap_w: float | None = None
    curve: list[tuple[int, float, float]] = Field(default_factory=list)  # (batch, TPOT ms, J/token)
    tpot_margin: float = 0.0  # the share of the TPOT objective the predicted batch was kept under
    measured: MeasuredPointRecord | None = None  # the same plan as measured, from this batch (measured tier)


class OperatingBasisRecord(_Record):
    """What the recommendation compared under one objective (:mod:`advisor.search.operating._basis`)."""

    measured: bool
    label: str
    note: str = ""


class Labels(_Record):
    accuracy: str
    energy: list[str]


class Summary(_Record):
    """Everything a report shows, with every number's label; no secrets (storage is redacted)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[3] = SCHEMA_VERSION
    tool: Literal["precision-advisor"] = "precision-advisor"
    version: str | None
    generated: str
    run: str
    storage: str | None = None  # redacted URL
    model: dict[str, Any] | None
    target: str
    workloads: list[dict[str, Any]]
    accuracy_budget: dict[str, Any]
    benchmark: dict[str, Any] | None
    labels: Labels
    versions: dict[str, str]
    timings_s: dict[str, Any]
    trials: list[TrialRecord]
    front: list[str]
    front_trials: list[int]
    baselines: dict[str, int]
    recommendation: RecommendationRecord | None
    # each measured stage's drift check; the measured plans within the largest drift of the recommendation
    measured_drift: list[DriftCheck] = Field(default_factory=list)
    near_ties: list[int] = Field(default_factory=list)
    # the GPUs that measured; with two or more, whether their all-BF16 agree within the drift (search.measured._tiers)
    measured_units: list[MeasuredUnit] = Field(default_factory=list)
    unit_agreement: dict[str, Any] | None = None
    proxy_calibration: list[ProxyCalibrationRecord]
    # absent in summaries written before latency objectives: read as none
    operating_points: list[OperatingPointRecord] = Field(default_factory=list)
    # workload -> measured or predicted operating points compared (absent in older summaries: predicted)
    operating_basis: dict[str, OperatingBasisRecord] = Field(default_factory=dict)
    payback: Payback | None = None
    benchmark_status: str | None
    sensitivity: dict[str, Any] | None
    shape: dict[str, Any]
    recipe: dict[str, Any]

    def record(self, plan_id: str) -> TrialRecord | None:
        return next((r for r in self.trials if r.plan_id == plan_id), None)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


def load_summary(path: Path | str) -> Summary:
    """Read a summary.json; one InputError (exit 2) for each way it can be wrong, old versions included."""
    path = Path(path)
    if path.is_dir():
        path = path / "summary.json"
    if not path.is_file():
        study = any((path.parent / name).exists() for name in ("study.db", "study.journal"))
        raise InputError(f"{path} does not exist; " + (f"rebuild it with `advisor report {path.parent}` (its study "
                         "is there)" if study else "give the run folder or the summary.json `advisor search` wrote"))
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}); "
                         "rebuild it with `advisor report RUN_DIR`") from None
    if not isinstance(data, dict) or data.get("tool") != "precision-advisor":
        raise InputError(f"{path} is not a precision-advisor summary.json (no \"tool\": \"precision-advisor\"); "
                         "give the summary.json `advisor search` wrote, or rebuild it with `advisor report RUN_DIR`")
    version = data.get("schema_version", 1)
    if version != SCHEMA_VERSION:
        raise InputError(f"{path} has summary schema version {version}; this advisor reads version "
                         f"{SCHEMA_VERSION}: rebuild it with `advisor report RUN_DIR` (the study holds every number)")
    try:
        summary = Summary.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InputError(f"{path} is not a valid summary.json: {where}: {first['msg']} "
                         f"({exc.error_count()} problem(s)); rebuild it with `advisor report RUN_DIR`") from None
    problem = summary_problem(summary)
    if problem is not None:
        raise InputError(f"{path} is not a valid summary.json: {problem}; it was edited by hand or damaged: rebuild "
                         "it with `advisor report RUN_DIR` (the study holds every number)")
    return summary


def summary_problem(summary: Summary) -> str | None:
    """The first thing in ``summary`` that its shape allows but `advisor search` never writes, named by its field
    (``trials.2.kl: got nan; ...``), or None: every KL a finite number >= 0, every J/token a finite number > 0,
    every plan id the hash of its formats, and every trial the summary names (the recommendation, the front, the
    baselines, the near-ties) one of its trials, the recommendation equal to it."""
    records = [(f"trials.{i}", r) for i, r in enumerate(summary.trials)]
    if summary.recommendation is not None:
        records.append(("recommendation", summary.recommendation))
    for where, record in records:
        problem = _record_problem(record)
        if problem is not None:
            return f"{where}.{problem}"
    by_trial = {r.trial: (i, r) for i, r in enumerate(summary.trials)}
    plan_ids = {r.plan_id for r in summary.trials}
    rec = summary.recommendation
    if rec is not None:
        i, trial = by_trial.get(rec.trial, (None, None))
        if trial is None or trial.plan_id != rec.plan_id:
            return f"recommendation: trial {rec.trial} (plan {rec.plan_id}) is not among the trials"
        mine, theirs = json.loads(rec.model_dump_json()), json.loads(trial.model_dump_json())
        differ = next((key for key, value in theirs.items() if mine.get(key) != value), None)
        if differ is not None:
            return (f"recommendation.{differ}: {_short(mine.get(differ))}, but trials.{i}.{differ} (the recommended "
                    f"trial) is {_short(theirs[differ])}")
    named = [("front_trials", t) for t in summary.front_trials] + [("near_ties", t) for t in summary.near_ties] + [
        (f"baselines.{label}", t) for label, t in summary.baselines.items()]
    for where, number in named:
        if number not in by_trial:
            return f"{where}: trial {number} is not among the trials"
    if missing := next((p for p in summary.front if p not in plan_ids), None):
        return f"front: plan {missing} is not among the trials"
    return None


def _record_problem(record: TrialRecord) -> str | None:
    """The first field of one trial's record that no search writes (its name below the record), or None."""
    if not (math.isfinite(record.kl) and record.kl >= 0):
        return f"kl: got {record.kl!r}; a KL is a finite number >= 0"
    for key, estimates in (("energy", record.energy), ("predicted_energy", record.predicted_energy)):
        for j, e in enumerate(estimates):
            if not (math.isfinite(e.j_per_token) and e.j_per_token > 0):
                return f"{key}.{j}.j_per_token: got {e.j_per_token!r}; a J/token is a finite number > 0"
    try:
        plan = Plan({group: Format(f) for group, f in record.formats.items()}, Format(record.kv_cache))
    except ValueError as exc:
        return f"formats: {exc}"
    if plan.id != record.plan_id:
        return f"plan_id: {record.plan_id} does not match its formats (their id is {plan.id})"
    return None


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def plan_ids_listed(ids: Any, most: int = 10) -> str:
    """A summary's plan ids for a message: sorted, the first ``most``, and how many there are in all."""
    ids = sorted(set(ids))
    more = f", ... ({len(ids)} in all)" if len(ids) > most else ""
    return ", ".join(ids[:most]) + more
