"""verify.json: what `advisor verify` served, typed. Each operating point is the run's predicted point beside what
the built-in runtime and the engine measured at its batch, all of them the summary's own point records
(:class:`~advisor.report.schema.MeteredBatch` and its extensions): one record of a point from the search to
summary.json, verify.json and the reports. :func:`load_verify` is the one reader of the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from advisor.errors import InputError
from advisor.report.schema import MeasuredPointRecord, MeteredBatch, _Record


class ItemAccuracy(_Record):
    n: int
    vllm_accuracy: float
    advisor_accuracy: float
    disagree: int


class ServedAccuracy(_Record):
    """The served model's full-vocabulary KL against the BF16 reference and the advisor's own model's on the same
    positions (``sequences`` of the run's ``heldout_sequences``); the items' greedy accuracy."""

    served_kl: float | None = None
    advisor_kl: float | None = None
    sequences: int = 0
    positions: int = 0
    heldout_sequences: int = 0  # 0: written before verify scored only some of them
    items: ItemAccuracy | None = None


class ServedEnergy(_Record):
    """A stated workload at its batch: the engine's J/token beside the run's measured (built-in) and predicted."""

    workload: str
    vllm_j_per_token: float
    vllm_unstable: bool
    batch_full: bool
    vllm_tokens_per_s: float
    runtime_j_per_token: float | None = None
    runtime_source: str | None = None
    predicted_j_per_token: float | None = None
    predicted_source: str | None = None
    predicted_run_j_per_token: float | None = None  # the run's own prediction, where re-priced for what served
    gpu_busy_pct: float | None = None  # NVML's utilization over the load (None: not read)
    other_gpus_busy_pct: float | None = None  # the busiest other GPU of the host over the load (None: none read)
    vllm_starved_windows: int = 0  # the meter's windows left out for a host stall (EnergyMeter's starved windows)


class PredictedAt(MeteredBatch):
    """The run's predicted operating point (:class:`~advisor.report.schema.OperatingPointRecord`) as verify.json
    keeps it: its numbers, what bounded its batch and its label."""

    bound: str | None = None
    source: str = ""


class ServedOperatingPoint(_Record):
    """An objective's operating point: the run's predicted point, the built-in runtime's at its batch (where the
    search measured it), the engine's serving at that batch and its own batch search (where it ran)."""

    workload: str
    batch: int
    predicted: PredictedAt
    runtime: MeasuredPointRecord | None = None
    vllm: MeasuredPointRecord
    vllm_unstable: bool
    batch_full: bool
    vllm_search: MeasuredPointRecord | None = None

    @property
    def as_served(self) -> MeasuredPointRecord:
        """The point as the engine served it: its batch search's outcome where it ran, else the predicted batch."""
        return self.vllm_search or self.vllm


class VerifiedPlan(_Record):
    role: str  # recommendation, bf16, a --plan's id, or several joined by "+" where they are one plan
    plan_id: str
    label: str
    checkpoint: str
    formats_match: bool | dict[str, str]  # True, or per layer group what served otherwise
    served_formats: dict[str, Any]
    proxy_kl: float | None
    acceptance: dict[str, Any] | None = None
    accuracy: ServedAccuracy
    energy: list[ServedEnergy] = Field(default_factory=list)
    operating: list[ServedOperatingPoint] = Field(default_factory=list)
    vllm_options: dict[str, Any] = Field(default_factory=dict)
    vllm_load_s: float | None = None
    read_back_from: str | None = None
    devices: list[Any] = Field(default_factory=list)


class VerifyResult(_Record):
    run: str
    engine: str
    vllm_version: str
    gpu: str
    gpus: int = 1
    date: str
    plans: list[VerifiedPlan]
    target: str | None = None  # None: written before verify recorded it (2026-11-28)
    gpu_kind: str | None = None
    lambada: dict[str, Any] | None = None
    verified: bool
    max_kl: float | None = None
    quick: bool = False
    timings_s: dict[str, Any] = Field(default_factory=dict)
    operating_plot: str | None = None

    def data(self) -> dict[str, Any]:
        """verify.json's data (what the Markdown renderers read)."""
        return self.model_dump(mode="json")

    def write(self, path: Path) -> None:
        path.write_text(self.model_dump_json(indent=2))


def load_verify(path: Path | str) -> VerifyResult:
    """verify.json read and checked; one ``Error:`` line (exit 2) naming the field where it is not verify's."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path} does not exist; `advisor verify RUN_DIR` writes it") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path} is not a readable verify.json ({exc}); run `advisor verify` again") from None
    try:
        return VerifyResult.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InputError(f"{path}: {where}: {first['msg']}; run `advisor verify` again to rewrite it") from None
