"""A steady load in a vLLM engine and its metering: ``batch`` requests kept in flight with fresh random prompts
(:class:`SteadyLoad`), metered by the advisor's NVML meter with one output token as its step (:func:`measure_load`),
and a workload's energy row from it (:func:`meter_workload`)."""

from __future__ import annotations

import gc
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from advisor.energy.meter import EnergyCounter, EnergyMeter, Measurement, MeterConfig

# How a steady load is metered: it has already run a whole request's length when the meter starts (``settle``), so
# the warm-up is short; windows of at least 2 s and WINDOW_ENGINE_STEPS engine steps follow one another until the
# last three agree within 1%, for at most 30 s of windows. A window's tokens arrive a decode step (``batch`` tokens)
# at a time: 2 s windows at batch 201 held 86-89 steps and read J/token 1.7% apart, at the 30 s ceiling (an 8B on an
# H200, reports/benchmarks/verify_time.md); 200 steps know the count to 0.5%.
STEADY_LOAD_METER = MeterConfig(warmup_s=0.5, min_window_s=2.0, min_ticks=20, repeats=3, max_cv=0.01,
                                until_stable_s=30.0)
WINDOW_ENGINE_STEPS = 200

# Engine steps of tickets the meter keeps issued (a step gives one token a request): far more than one meter poll
# can see finish, and few enough that the meter's drain after its windows is short (4096 tickets at batch 1, a
# prefill load, were 4096 steps of waiting for tokens nothing reads).
TICKET_STEPS = 64

#: the load's own count of the output tokens reaching it, in bins of this many seconds (``SteadyLoad.trace``), kept
#: beside the meter's windows (their ``began_s`` on the same clock): where a window's tokens came from. A first window
#: read 1.7-3x the tokens of the rest at the same power in 5 meterings (reports/benchmarks/verify_time.md, round 8)
TRACE_BIN_S = 0.1


class _Ticket:
    """One output token the meter waits for: finished once the engine has produced that many tokens."""

    __slots__ = ("index", "load")

    def __init__(self, load: SteadyLoad, index: int) -> None:
        self.load, self.index = load, index

    def query(self) -> bool:
        if self.load.error is not None:
            raise self.load.error
        return self.load.tokens > self.index


class SteadyLoad:
    """Keeps ``batch`` requests of ``input_tokens`` fresh random token ids and ``output_tokens``
    outputs in flight in vLLM's engine, from a thread, and counts the output tokens it returns.

    The first round's requests ask for ``output_tokens * (i + 1) / batch`` tokens, so their ends
    spread evenly over one request's length and every later replacement's prefill rides along with
    the others' decode: the batch stays full and the load is steady (``settle`` waits until that
    first round is gone). The meter's "step" is one output token (:meth:`ticket`).
    """

    def __init__(self, vllm: Any, engine: Any, batch: int, input_tokens: int, output_tokens: int,
                 vocab_size: int, seed: int = 0) -> None:
        self.vllm, self.engine = vllm, engine
        self.batch, self.input_tokens, self.output_tokens = batch, input_tokens, output_tokens
        self.vocab_size, self._rng = vocab_size, random.Random(seed)
        self.tokens = 0
        self.error: BaseException | None = None
        self.inflight: set[str] = set()
        self.first_round: set[str] = set()
        self.fewest_inflight = batch
        # (TTFT s, TPOT s, first token at, finished at) of requests added after the first round
        self.latencies: list[tuple[float, float, float, float]] = []
        self._added: dict[str, float] = {}
        self._first_token: dict[str, float] = {}
        self._produced: dict[str, int] = {}  # output tokens so far, by request (a TPOT is over its own count)
        self._issued = 0
        self._next_id = 0
        self.trace_start = 0.0  # time.perf_counter() at start()
        self.trace: list[int] = []  # output tokens that reached the load in each TRACE_BIN_S from trace_start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _params(self, max_tokens: int) -> Any:
        kind = self.vllm.sampling_params.RequestOutputKind.DELTA
        return self.vllm.SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, output_kind=kind,
                                        detokenize=False)

    def _add(self, max_tokens: int) -> str:
        rid = f"steady-{self._next_id}"
        self._next_id += 1
        prompt = [self._rng.randrange(self.vocab_size) for _ in range(self.input_tokens)]
        self.engine.add_request(rid, {"prompt_token_ids": prompt}, self._params(max_tokens))
        self.inflight.add(rid)
        self._added[rid] = time.perf_counter()
        return rid

    def _timed(self, out: Any, produced: int) -> None:
        """Note when a request's first token came and, when it finishes, its TTFT and TPOT."""
        now, rid = time.perf_counter(), out.request_id
        if produced and rid not in self._first_token:
            self._first_token[rid] = now
        self._produced[rid] = self._produced.get(rid, 0) + produced
        if not out.finished:
            return
        added, first, tokens = self._added.pop(rid, None), self._first_token.pop(rid, None), self._produced.pop(rid)
        if rid in self.first_round or added is None or first is None or tokens < 2:
            return
        self.latencies.append((first - added, (now - first) / (tokens - 1), first, now))

    def start(self) -> SteadyLoad:
        self.trace_start = time.perf_counter()
        for i in range(self.batch):
            self.first_round.add(self._add(max(1, round(self.output_tokens * (i + 1) / self.batch))))
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                stepped = 0
                for out in self.engine.step():
                    produced = len(out.outputs[0].token_ids) if out.outputs else 0
                    self.tokens += produced
                    stepped += produced
                    self._timed(out, produced)
                    if out.finished:
                        self.inflight.discard(out.request_id)
                        self.first_round.discard(out.request_id)
                        self._add(self.output_tokens)
                if not self.first_round:
                    self.fewest_inflight = min(self.fewest_inflight, len(self.inflight))
                self._bin(stepped)
        except BaseException as exc:  # noqa: BLE001 (re-raised in the meter's thread by _Ticket.query)
            self.error = exc

    def _bin(self, produced: int) -> None:
        i = int((time.perf_counter() - self.trace_start) / TRACE_BIN_S)
        if i >= len(self.trace):
            self.trace.extend([0] * (i + 1 - len(self.trace)))
        self.trace[i] += produced

    def token_trace(self) -> dict[str, Any]:
        return {"start_s": self.trace_start, "bin_s": TRACE_BIN_S, "tokens": list(self.trace)}

    def settle(self, timeout_s: float = 600.0) -> None:
        """Wait until the staggered first round has finished (the load is steady from then on)."""
        end = time.monotonic() + timeout_s
        while self.first_round and self.error is None:
            if time.monotonic() > end:
                raise TimeoutError(f"the first {self.batch} requests did not finish in {timeout_s:.0f} s")
            time.sleep(0.01)
        if self.error is not None:
            raise self.error

    def ticket(self) -> _Ticket:
        t = _Ticket(self, self._issued)
        self._issued += 1
        return t

    def latency_ms(self, left_out: Sequence[tuple[float, float]] = ()) -> dict[str, float | None]:
        """p50 and p90 of TTFT and TPOT (ms) over the finished requests that were not in the first round, less those
        that decoded during a span of ``left_out`` (the meter's starved windows: a host stall lengthens them as it
        starves the GPU), unless that leaves none."""
        kept = [v for v in self.latencies if not any(v[2] < end and v[3] > start for start, end in left_out)]
        kept = kept or list(self.latencies)
        out: dict[str, float | None] = {}
        for i, name in ((0, "ttft"), (1, "tpot")):
            values = sorted(v[i] * 1e3 for v in kept)
            for q in (50, 90):
                out[f"{name}_ms_p{q}"] = _percentile(values, q) if values else None
        out["latency_requests"] = len(kept)
        if len(kept) < len(self.latencies):
            out["latency_requests_left_out"] = len(self.latencies) - len(kept)
        return out

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        for rid in list(self.inflight):
            self.engine.abort_request([rid])
        while self.engine.get_num_unfinished_requests():
            self.engine.step()
        self.inflight.clear()


class BusySampler:
    """The GPU's utilization (``read``: a % or None) sampled every ``interval_s`` from a thread while the block runs:
    its mean and its lowest reading (None without a reader, or where it never said)."""

    def __init__(self, read: Callable[[], float | None] | None, interval_s: float = 0.1) -> None:
        self.read, self.interval_s = read, interval_s
        self.readings: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                value = self.read() if self.read is not None else None
            except Exception:  # noqa: BLE001 (a diagnostic: a failed read ends the sampling, never the metering)
                return
            if value is not None:
                self.readings.append(value)

    def __enter__(self) -> BusySampler:
        if self.read is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.readings) if self.readings else None

    @property
    def low(self) -> float | None:
        return min(self.readings) if self.readings else None


def _percentile(sorted_values: list[float], q: int) -> float:
    if len(sorted_values) == 1:
        return sorted_values[0]
    return statistics.quantiles(sorted_values, n=100, method="inclusive")[q - 1]


@contextmanager
def static_heap() -> Iterator[int]:
    """Every object alive now marked static for Python's garbage collector over the block (``gc.freeze``), as vLLM's
    own API server and benchmark client do once started (vllm/utils/gc_utils.py, freeze_gc_heap); yields how many
    it froze. A full collection otherwise walks the whole imported heap (vLLM, torch, transformers: 0.2 s for the
    advisor's own imports on one CI core). The load's thread, which hands vLLM its requests and reads its tokens,
    received none for 0.3-0.5 s every 9-13 s at batches 152-288 and then all of them at once (the token traces of the
    4B's round 9 on an H200, reports/benchmarks/verify_time.md): such collections, by their length and period. A
    window over a pause was left out as starved, the one after it read the pause's tokens, and the requests replaced
    together after it finished together a request's length later, again and again. Frozen, the pauses were gone (the
    4B's round 10, the same report)."""
    gc.collect()
    gc.freeze()
    try:
        yield gc.get_freeze_count()
    finally:
        gc.unfreeze()


def measure_load(vllm: Any, llm: Any, counter: EnergyCounter, config: MeterConfig, batch: int, input_tokens: int,
                 output_tokens: int, vocab_size: int, label: str,
                 seed: int = 0) -> tuple[Measurement, int, dict[str, Any]]:
    """J per output token of a steady load (the meter's step is one token), the fewest requests
    that were in flight after it settled (the batch was full when that equals ``batch``), and the
    load's request latencies (:meth:`SteadyLoad.latency_ms`) with its token trace (``token_trace``)."""
    load = SteadyLoad(vllm, llm.llm_engine, batch, input_tokens, output_tokens, vocab_size, seed).start()
    try:
        load.settle()
        # idle_s 0: the load runs while the meter opens, so an "idle" reading would be the load's own draw (it cost
        # a second of every metering until 2026-11-30)
        cfg = MeterConfig(**{**asdict(config), "depth": TICKET_STEPS * batch, "queued_s": 0.0, "idle_s": 0.0,
                             "min_window_steps": max(config.min_window_steps, WINDOW_ENGINE_STEPS * batch
                                                     if config.until_stable_s else 0)})
        m = EnergyMeter(counter, cfg).measure(load.ticket, label, 1.0)
    finally:
        load.stop()
    return m, load.fewest_inflight, {**load.latency_ms(m.starved_spans), "token_trace": load.token_trace()}


def meter_workload(vllm: Any, llm: Any, counter: EnergyCounter, config: MeterConfig, w: dict[str, Any],
                   vocab_size: int, seed: int, prefill: bool, meterings: list[dict[str, Any]],
                   busy: Callable[[], float | None] | None = None,
                   others: Callable[[], float | None] | None = None) -> dict[str, Any]:
    """One workload's energy row (:func:`measure_load`; with ``prefill``, also J per input token of a batch-1
    prefill load); what it took is added to ``meterings``. With ``busy`` (the GPUs' NVML utilization), the row says
    how busy they were over the load, its settling included: well under 100 at a steady load, the GPU waited on the
    engine's host side. With ``others`` (the busiest other GPU of the host), how busy the host's other GPUs were: a
    job there disturbs this engine's serving (reports/benchmarks/verify_time.md, round 8)."""
    b, lin, lout = w["batch_size"], w["input_tokens"], w["output_tokens"]
    t, began = time.perf_counter(), time.strftime("%H:%M:%S", time.gmtime())
    with BusySampler(busy) as sampler, BusySampler(others) as beside:
        full, fewest, latency = measure_load(vllm, llm, counter, config, b, lin, lout, vocab_size,
                                             f"vllm {w['name']}", seed)
    meterings.append({"workload": w["name"], "batch": b, "seconds": time.perf_counter() - t,
                      "windows": full.windows_taken, "began_utc": began})
    row = {"j_per_token": full.j_per_token, "tokens_per_s": full.tokens_per_s, "fewest_inflight": fewest,
           "batch_full": fewest >= b, "measurement": full.to_dict(), **latency,
           "gpu_busy_pct": sampler.mean, "gpu_busy_pct_low": sampler.low, "other_gpus_busy_pct": beside.mean}
    if prefill:
        pre, _, _ = measure_load(vllm, llm, counter, config, 1, lin, 1, vocab_size, f"vllm {w['name']} prefill",
                                 seed + 1)
        row["prefill_j_per_input_token"] = pre.j_per_token / lin
    return row
