"""vLLM as a serving engine (``--engine vllm``): the plan's exported checkpoint served by vLLM's
offline ``LLM`` API in a child process (:mod:`advisor.deploy.vllm._serve` does the serving), and
what the parent makes of it:

* :class:`VllmEnergyModel`, the measured energy tier through vLLM: each plan's checkpoint is loaded
  once, in its own process, and metered at every workload's concurrency and lengths (steady state:
  the batch kept full with fresh random prompts, prefix caching off, the advisor's own NVML meter);
* :func:`served_formats`: the format vLLM built for every layer group, against the plan.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from advisor.deploy.checkpoint import decode_graph_sizes
from advisor.deploy.serving_gpus import engine_memory_share
from advisor.deploy.vllm._load import STEADY_LOAD_METER
from advisor.deploy.vllm._rounds import child_answer, one_child, processes_ahead, start_child
from advisor.deploy.vllm._serve import ServeJob, serve
from advisor.energy.meter import MeterConfig
from advisor.errors import AdvisorError, SetupError, UnsupportedError
from advisor.estimate import EnergyEstimate
from advisor.formats import Format
from advisor.plan import Plan
from advisor.recipe.schema import Workload
from advisor.search.measured import MeasuredTier, NextRound

if TYPE_CHECKING:
    from advisor.search.operating import MeasuredPoint

VLLM_INSTALL = ("pip install vllm==0.26.0 (its wheel pins torch 2.11; on the lent GPU machines, pack it with "
                "../shared/tools/device-vllm.sh)")

MAX_GRID_BATCH = 8192  # above any batch an engine here is sized for (vLLM caps a step at max_num_batched_tokens)

# vLLM's linear-method classes and the format each serves. Anything else is reported by its class name.
SERVED_FORMATS: dict[str, str] = {
    "UnquantizedLinearMethod": Format.BF16.value,
    "ModelOptFp8LinearMethod": Format.FP8.value,
    "Fp8LinearMethod": Format.FP8.value,
    "ModelOptNvFp4LinearMethod": Format.NVFP4.value,
}


def import_vllm() -> ModuleType:
    """The ``vllm`` package, or a SetupError (exit 3) saying how to install it."""
    try:
        import vllm
    except ImportError as exc:
        raise SetupError(f"--engine vllm: vllm is not importable ({exc}); {VLLM_INSTALL}") from None
    return vllm


# ----------------------------------------------------------------------------------- one engine per process
def run_in_child(job: ServeJob, target: Callable[[ServeJob], dict[str, Any]] = serve,
                 timeout_s: float = 3600.0) -> dict[str, Any]:
    """``target(job)`` in a fresh (spawned) process, so the engine's GPU memory is freed when it ends.
    A checkpoint vLLM cannot load or serve is an UnsupportedError naming vLLM's own first line."""
    proc, parent = start_child(one_child, target, job)
    try:
        if not parent.poll(timeout_s):
            proc.kill()
            raise UnsupportedError(f"vLLM did not finish serving {job.checkpoint} in {timeout_s:.0f} s")
        reply = parent.recv()
    except EOFError:
        proc.join()
        raise UnsupportedError(f"vLLM's process serving {job.checkpoint} died (exit code {proc.exitcode}) "
                               "before answering; its log above says why") from None
    finally:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
    return child_answer(reply, job.checkpoint, VLLM_INSTALL)


# ----------------------------------------------------------------------------------- formats as served
def served_formats(served: Mapping[str, Mapping[str, Any]], plan: Plan, members: Mapping[str, Sequence[str]]
                   ) -> tuple[dict[str, str], dict[str, str]]:
    """(group -> format vLLM serves it in, group -> why it differs from the plan).

    ``members`` maps each group to its checkpoint module names; a served layer belongs to the group
    holding any module it packs. A group whose layers vLLM built with different methods, or one no
    served layer covers, is a difference too."""
    owner = {m: g for g, ms in members.items() for m in ms}
    seen: dict[str, set[str]] = {}
    for layer in served.values():
        groups = {owner[m] for m in layer["members"] if m in owner}
        for g in groups:
            seen.setdefault(g, set()).add(SERVED_FORMATS.get(layer["method"], layer["method"]))
    formats, differ = {}, {}
    for g, planned in plan.formats.items():
        got = seen.get(g)
        if not got:
            differ[g] = f"planned {planned.value}, not found among vLLM's layers"
            continue
        formats[g] = "+".join(sorted(got))
        if got != {planned.value}:
            differ[g] = f"planned {planned.value}, served {formats[g]}"
    return formats, differ


# ----------------------------------------------------------------------------------- the measured tier
class VllmEnergyModel(MeasuredTier):
    """The measured tier through vLLM (a :class:`~advisor.search.measured._contract.MeasuredTier` that times requests
    and runs a plan's operating searches in the engine that serves it).

    ``checkpoint_for(plan)`` gives the plan's exported checkpoint folder. The first estimate of a plan
    serves it once, in a child process, for every workload of ``workloads``; the rest are read back."""

    searches_in_serving = True

    def __init__(self, checkpoint_for: Callable[[Plan], Path], workloads: Sequence[Workload], vocab_size: int,
                 meter: MeterConfig | None = None, runner: Callable[[ServeJob], dict[str, Any]] | None = None,
                 gpu_label: str = "", vllm_version: str | None = None, gpus: int = 1,
                 rounds_runner: Callable[[ServeJob, Any], dict[str, Any]] | None = None) -> None:
        self.checkpoint_for, self.workloads, self.vocab_size = checkpoint_for, list(workloads), vocab_size
        self.meter, self.runner = meter or STEADY_LOAD_METER, runner or run_in_child
        self.gpus = gpus
        self.rounds_runner = rounds_runner or _run_rounds
        self._served: dict[str, dict[str, Any]] = {}
        self._opening: dict[str, ServeJob] = {}
        self._holds: dict[str, Callable[[], None]] = {}
        version = vllm_version or getattr(import_vllm(), "__version__", "unknown")
        where = f", {gpu_label}" if gpu_label else ""
        tp = f", tp={gpus}" if gpus > 1 else ""
        self.label = f"measured (vLLM {version}{where}{tp}, {time.strftime('%Y-%m-%d')})"

    @property
    def batch_grid(self) -> tuple[int, ...]:
        """The batches the measured batch search meters (:mod:`advisor.search.measured._batch_search`): the engine
        runs a decode batch padded to its next CUDA-graph size, so only those sizes differ (every serving raises the
        capture bound over the largest batch it is sized for: :func:`~advisor.deploy.checkpoint.capture_bound`)."""
        return decode_graph_sizes(MAX_GRID_BATCH)

    def _job(self, plan: Plan, workloads: Sequence[Workload], **fields: Any) -> ServeJob:
        """The job serving ``plan`` (exported first where it is not) at ``workloads``, with the memory share an
        engine can have beside this process (:func:`~advisor.deploy.serving_gpus.engine_memory_share`)."""
        checkpoint = str(self.checkpoint_for(plan))
        return ServeJob(checkpoint=checkpoint, vocab_size=self.vocab_size,
                        workloads=tuple(w.model_dump() for w in workloads), formats=False, meter=asdict(self.meter),
                        tensor_parallel_size=self.gpus, gpu_memory_utilization=engine_memory_share(self.gpus),
                        **{"prefill": self.prefill_apart, **fields})

    def serve_plan(self, plan: Plan) -> dict[str, Any]:
        if plan.id not in self._served:
            self._served[plan.id] = self.runner(self._job(plan, self.workloads))
        return self._served[plan.id]

    def measure_points(self, plan: Plan, workloads: Sequence[Workload]) -> list[MeasuredPoint]:
        """``plan`` served at each of ``workloads`` (operating batches), all in one engine process (none when the
        plan's first serving already covered them): J/token, tokens/s, and TPOT/TTFT at each workload's
        percentile where the serving rows time them."""
        from advisor.search.operating import from_timed

        rows = self._served.get(plan.id, {}).get("energy", {})
        if not all(w.name in rows for w in workloads):
            rows = self.runner(self._job(plan, workloads, prefill=False))["energy"]
        return [from_timed(plan, w, rows[w.name], self.label + _steadiness(rows[w.name], w)) for w in workloads]

    def open_with(self, plan: Plan, job: ServeJob, hold: Callable[[], None] | None = None) -> None:
        """``job`` (``advisor verify``'s whole serving of ``plan``: formats, log-probabilities, every workload, the
        first round's among them) opens the engine that :meth:`measure_rounds` then keeps for its further rounds,
        so a plan costs one engine start, not two; :meth:`served` gives the job's answer afterwards. A job that
        holds (``job.hold``) meters its first round once ``hold()`` returns (it raises to stop the engine)."""
        self._opening[plan.id] = job
        if hold is not None:
            self._holds[plan.id] = hold

    def open_for(self, plan: Plan, operating: Sequence[Workload]) -> None:
        """The measured tier's serving of ``plan`` (its stated workloads, prefill included) opened with the first
        round of its operating searches (``operating``: their predicted batches, no prefill) beside them: the
        batch search then runs in the engine that served the stated workloads (:meth:`measure_rounds`), and
        :meth:`estimate` reads the stated rows from it."""
        self.open_with(plan, self._job(plan, [*self.workloads, *operating],
                                       no_prefill=tuple(w.name for w in operating)))

    def started_ahead(self, architectures: Sequence[str], jobs: int | None = None) -> AbstractContextManager[None]:
        """Each engine process is started one job ahead (:func:`~advisor.deploy.vllm._rounds.processes_ahead`)."""
        return processes_ahead(architectures, jobs=jobs)

    def forget(self, plan: Plan) -> None:
        """The next estimate of ``plan`` serves it again (a unit's drift check measures all-BF16 afresh)."""
        self._served.pop(plan.id, None)

    def served(self, plan: Plan) -> dict[str, Any]:
        """What ``plan``'s serving (its opening job's, where it had one) answered."""
        return self._served[plan.id]

    def measure_rounds(self, plan: Plan, first: Sequence[Workload], next_round: NextRound, max_batch: int
                       ) -> list[MeasuredPoint]:
        """``first`` metered, then each round ``next_round`` asks for, all in one engine sized for ``max_batch``
        (the measured batch search, :mod:`advisor.search.measured._batch_search`); ``first`` is read back where the
        plan's first serving covered it, and no engine starts unless a further round is asked for; a plan opened
        with :meth:`open_with` meters every round in its opening job's engine."""
        from advisor.search.operating import from_timed

        def points(rows: Mapping[str, Any], ws: Sequence[Workload]) -> list[MeasuredPoint]:
            return [from_timed(plan, w, rows[w.name], self.label + _steadiness(rows[w.name], w)) for w in ws]

        rounds, served = [list(first)], self._served.get(plan.id, {}).get("energy", {})
        opening, hold = self._opening.pop(plan.id, None), self._holds.pop(plan.id, None)

        def more(rows: dict[str, Any]) -> list[dict[str, Any]]:
            if not rows and opening is not None and opening.hold:  # a held engine's go: its own workloads
                if hold is not None:
                    hold()
                return [dict(w) for w in opening.workloads]
            rounds.append(next_round(points(rows, rounds[-1])))
            return [w.model_dump() for w in rounds[-1]]

        if opening is not None:  # its workloads hold ``first``: its rows answer the first round
            self._served[plan.id] = self.rounds_runner(opening, more)
            rows = self._served[plan.id]["energy"]
            return [p for r in rounds for p in points(rows, r)]
        if all(w.name in served for w in first):
            rounds.append(next_round(points(served, first)))
            if not rounds[-1]:
                return points(served, first)

        job = self._job(plan, rounds[-1], prefill=False, max_batch=max_batch)
        rows = {**served, **self.rounds_runner(job, more)["energy"]}
        return [p for r in rounds for p in points(rows, r)]

    def estimate(self, plan: Plan, workload: Workload) -> EnergyEstimate:
        if workload.name not in {w.name for w in self.workloads}:
            self.workloads.append(workload)
            self._served.pop(plan.id, None)
        try:
            row = self.serve_plan(plan)["energy"][workload.name]
        except AdvisorError:
            raise
        lin, lout = workload.input_tokens, workload.output_tokens
        pre = row.get("prefill_j_per_input_token", float("nan"))
        decode = row["j_per_token"] - pre * lin / lout if not math.isnan(pre) else row["j_per_token"]
        return EnergyEstimate(workload=workload.name, j_per_token=row["j_per_token"],
                              decode_j_per_token=max(decode, 0.0), prefill_j_per_input_token=pre,
                              decode_tokens_per_s=row["tokens_per_s"], source=self.label + _steadiness(row, workload),
                              measured=True)


def _run_rounds(job: ServeJob, more: Any) -> dict[str, Any]:
    from advisor.deploy.vllm._rounds import run_rounds_in_child

    return run_rounds_in_child(job, more, VLLM_INSTALL)


def _steadiness(row: Mapping[str, Any], workload: Workload) -> str:
    """What the label adds for a window that was unstable or a batch that was not kept full."""
    unstable = " (unstable)" if row["measurement"].get("unstable") else ""
    starved = row["measurement"].get("starved_windows") or 0
    unstable += f"; {starved} starved window(s) left out (less power at less throughput: the host stalled)" \
        if starved else ""
    return unstable + ("" if row["batch_full"] else f"; batch not full: {row['fewest_inflight']} of "
                       f"{workload.batch_size}")


def checkpoint_tier(checkpoint: Path, workloads: Sequence[Workload], vocab: int, gpu_label: str, gpus: int
                    ) -> VllmEnergyModel:
    """`advisor measure --engine vllm --checkpoint DIR`: that one checkpoint served for every plan, at ``workloads``
    (the stated one and its operating batch: one engine), over ``gpus`` GPUs."""
    return VllmEnergyModel(lambda _plan: checkpoint, workloads, vocab, gpu_label=gpu_label, gpus=gpus)


def vllm_tier(recipe: Any, loaded: Any, tokens: Any) -> VllmEnergyModel:
    """The measured tier of a search run through vLLM: each measured plan is exported once
    (``RUN_DIR/engine_checkpoints/<plan id>``), then served at every workload of the recipe, over the recipe's
    ``gpus`` (:mod:`advisor.deploy.serving_gpus`)."""
    from advisor.deploy.checkpoint import checkpoint_exporter
    from advisor.deploy.serving_gpus import gpus_label, serving_gpus_for

    import_vllm()
    gpus = serving_gpus_for(recipe.gpus, loaded.shape, recipe.workloads, flag="gpus")
    vocab = int(loaded.model.config.get_text_config().vocab_size)
    return VllmEnergyModel(checkpoint_exporter(recipe, loaded, tokens), recipe.workloads, vocab,
                           gpu_label=gpus_label(gpus), gpus=gpus)
