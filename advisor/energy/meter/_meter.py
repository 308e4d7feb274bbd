"""Energy meter over the NVML total-energy counter: steady-state windows, repeats, spread.

How a measurement runs (``EnergyMeter.measure``):

1. Warm-up: the step is launched back to back for ``warmup_s`` (clocks, caches and
   power settle).
2. The GPU is kept busy: at most ``depth`` steps are in flight; a finished one is
   replaced at once, so the queue never runs dry and the host never runs far ahead.
   ``depth`` grows to hold ``queued_s`` of GPU work (the step's time taken from the
   warm-up, which reads no counter): one NVML energy read takes milliseconds, so a
   few sub-millisecond steps would run dry between reads and the GPU would idle
   (reports/benchmarks/energy_transfer_h200.md).
3. Windows are aligned to counter ticks (the counter moves about every 100 ms):
   a window opens at one tick edge and closes at the first edge after it has lasted
   ``min_window_s`` or ``min_ticks`` ticks. Its energy is the counter difference
   between the two edges; its steps are those that *finished* between them. The
   next window opens where the last closed, so the GPU never idles in between.
4. ``repeats`` windows give the median and the spread; a coefficient of variation
   above ``max_cv`` marks the measurement ``unstable``, and it is taken again, up to
   ``attempts`` times in all, keeping the steadiest (a rare window is disturbed); one
   still unstable after the attempts stays marked so.
   With ``until_stable_s`` set (a ceiling in seconds), windows follow one another until the
   last ``repeats`` of them agree within ``max_cv`` (the energy per step is stable: the
   measurement ends there) or the ceiling is reached (the steadiest ``repeats`` consecutive
   windows are kept, marked unstable where they still disagree): a steady load is metered as
   long as it needs and no longer, and a disturbed window costs one window, not a new series.
   A window that drew ``STARVED_DROP`` less power with ``STARVED_DROP`` less throughput than the series' steadiest
   level is a starved one (the GPU waited on something outside the load: the host stalled) and is left out of the
   kept windows while ``repeats`` others remain (``starved_windows`` counts them).

The GPU's state (name, driver, power limit, clocks, temperature) is read before
and after, and the idle power once per meter. Nothing here changes the GPU.

``advisor.testing`` has the fakes that stand in for NVML and the GPU in tests.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

from advisor.energy.meter._nvml import GPUState
from advisor.energy.meter._series import Window, coefficient_of_variation, fed_windows, steadiest_run, window_cv
from advisor.errors import InputError, SetupError


class EnergyCounter(Protocol):
    """A monotone energy counter in millijoules plus the GPU's state."""

    def energy_mj(self) -> int: ...

    def state(self) -> GPUState: ...


class StepHandle(Protocol):
    """Completion of one launched step (``torch.cuda.Event`` meets this)."""

    def query(self) -> bool: ...


Step = Callable[[], StepHandle]
#: how many warm-ups the meter waits for a first finished step before it calls the workload stuck
WARMUP_PATIENCE = 4


@dataclass(frozen=True)
class MeterConfig:
    """Window rules. The defaults are the project's measuring rules (DESIGN.md)."""

    warmup_s: float = 2.0
    min_window_s: float = 5.0
    min_ticks: int = 50
    repeats: int = 3
    max_cv: float = 0.01
    attempts: int = 3
    depth: int = 4
    # GPU work kept queued (s): depth grows to ceil(queued_s / step time). 0 keeps ``depth`` exact
    # (a serving engine's meter, whose depth is the requests in flight).
    queued_s: float = 0.05
    max_depth: int = 1024
    # Host sleep between counter polls: polling NVML in a tight loop slows a CUDA-graph
    # decode step, and 1 ms is a negligible part of a window.
    poll_s: float = 0.001
    # How long the idle power is read before the first measurement (0: not read; a meter that opens beside a live
    # load, whose "idle" would be that load's own draw)
    idle_s: float = 1.0
    # Give up waiting for a counter tick after this long (a stuck counter).
    tick_timeout_s: float = 2.0
    # At most this long warming the GPU before a series of points (EnergyMeter.soak; 0: none).
    soak_s: float = 30.0
    # > 0: windows follow one another until the last ``repeats`` agree within ``max_cv``, for at most this
    # long (the windows' seconds); 0: ``repeats`` windows, the whole series taken again when unstable
    until_stable_s: float = 0.0
    # A window also holds at least this many finished steps (for up to 10 x min_window_s): a serving engine's
    # steps finish in bursts (a decode step's tokens all at once), so a window's step count is known to one burst
    min_window_steps: int = 0

    def __post_init__(self) -> None:
        if (self.repeats < 1 or self.attempts < 1 or self.min_window_s <= 0 or self.depth < 1 or self.queued_s < 0
                or self.soak_s < 0 or self.until_stable_s < 0 or self.idle_s < 0):
            raise InputError(f"meter config needs repeats >= 1, attempts >= 1, min_window_s > 0, depth >= 1, "
                             f"queued_s >= 0, soak_s >= 0, until_stable_s >= 0, idle_s >= 0 (got {self})")


@dataclass(frozen=True)
class Measurement:
    """Median and spread of ``repeats`` windows of one step. Units in the names."""

    label: str
    tokens_per_step: float
    windows: tuple[Window, ...]
    j_per_step: float
    s_per_step: float
    power_w: float
    cv: float
    unstable: bool
    idle_power_w: float | None  # None: the meter did not read it (MeterConfig.idle_s 0)
    gpu_before: GPUState
    gpu_after: GPUState
    date: str = field(default_factory=lambda: time.strftime("%Y-%m-%d"))
    depth: int = 0  # steps kept in flight
    windows_taken: int = 0  # windows metered in all (more than ``windows`` where the meter waited for stability)
    # (J/step, steps/s) of every window metered, in order, where more were metered than kept: what a series that
    # would not settle looked like (a drift, or the throughput itself jittering)
    series: tuple[tuple[float, float], ...] = ()
    starved_windows: int = 0  # windows left out for drawing less power at less throughput (module docstring)
    # (opened, closed) on the meter's clock of each starved window: a load's requests then are left out of its latencies
    starved_spans: tuple[tuple[float, float], ...] = ()

    @property
    def j_per_token(self) -> float:
        return self.j_per_step / self.tokens_per_step

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.s_per_step

    @property
    def tokens_per_s_per_w(self) -> float:
        return self.tokens_per_s / self.power_w

    @property
    def j_per_step_range(self) -> tuple[float, float]:
        vals = [w.j_per_step for w in self.windows]
        return min(vals), max(vals)

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(
            j_per_token=self.j_per_token,
            tokens_per_s=self.tokens_per_s,
            tokens_per_s_per_w=self.tokens_per_s_per_w,
            j_per_step_range=list(self.j_per_step_range),
        )
        return data


def queue_depth(cfg: MeterConfig, step_s: float) -> int:
    """Steps kept in flight: ``cfg.depth``, or enough steps of ``step_s`` to hold ``cfg.queued_s``."""
    if cfg.queued_s <= 0 or step_s <= 0:
        return cfg.depth
    return max(cfg.depth, min(cfg.max_depth, math.ceil(cfg.queued_s / step_s)))


class EnergyMeter:
    """Measures joules per step of a launched workload over an :class:`EnergyCounter`."""

    def __init__(
        self,
        counter: EnergyCounter,
        config: MeterConfig | None = None,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.counter = counter
        self.config = config or MeterConfig()
        self._clock = clock
        self._sleep = sleep
        self._idle_w: float | None = None

    # -- counter edges -------------------------------------------------------
    def _wait_edge(self, between: Callable[[], None]) -> tuple[float, int]:
        """Call ``between`` until the counter moves; return (time, counter) at the edge."""
        start_e = self.counter.energy_mj()
        start_t = self._clock()
        while True:
            between()
            self._sleep(self.config.poll_s)
            e = self.counter.energy_mj()
            t = self._clock()
            if e != start_e:
                return t, e
            if t - start_t > self.config.tick_timeout_s:
                raise SetupError(
                    f"the energy counter did not move in {self.config.tick_timeout_s:.1f} s; "
                    "this GPU or driver does not update it"
                )

    def idle_power_w(self) -> float:
        """Mean power with nothing launched, over tick-aligned edges (cached per meter)."""
        if self._idle_w is None:
            t0, e0 = self._wait_edge(lambda: None)
            t1, e1 = t0, e0
            while t1 - t0 < self.config.idle_s or t1 == t0:  # one tick's span at least
                t1, e1 = self._wait_edge(lambda: None)
            self._idle_w = (e1 - e0) / 1000.0 / (t1 - t0)
        return self._idle_w

    @staticmethod
    def _refill(inflight: deque[StepHandle], step: Step, depth: int) -> int:
        """Retire the finished steps at the head of ``inflight`` and launch up to ``depth``; how many finished."""
        finished = 0
        while inflight and inflight[0].query():
            inflight.popleft()
            finished += 1
        while len(inflight) < depth:
            inflight.append(step())
        return finished

    def _drain(self, inflight: deque[StepHandle]) -> None:
        """Wait for every launched step to finish."""
        while inflight:
            if inflight[0].query():
                inflight.popleft()
            else:
                self._sleep(0.0005)

    # -- thermal state -------------------------------------------------------
    def soak(self, step: Step, max_s: float, settle_c: float = 1.0, every_s: float = 5.0) -> dict[str, float]:
        """Run ``step`` back to back until the GPU's temperature settles (it rose less than ``settle_c`` over the
        last ``every_s``) or ``max_s`` has passed. A small model's J/step follows the temperature (leakage), so
        profiles and plans are measured warm (reports/benchmarks/energy_transfer_data/h100_thermal.json,
        h100_raw8.json)."""
        inflight: deque[StepHandle] = deque()
        t0 = self._clock()
        first = last = self.counter.state().temperature_c
        check = t0 + min(every_s, max_s)
        while True:
            self._refill(inflight, step, self.config.depth)
            self._sleep(self.config.poll_s)
            now = self._clock()
            if now < check:
                continue
            temp = self.counter.state().temperature_c
            if temp - last < settle_c or now - t0 >= max_s:
                break
            last, check = temp, min(now + every_s, t0 + max_s)
        self._drain(inflight)
        return {"seconds": self._clock() - t0, "from_c": float(first), "to_c": float(temp)}

    # -- measurement ---------------------------------------------------------
    def measure(self, step: Step, label: str = "", tokens_per_step: float = 1.0) -> Measurement:
        """Median J/step of ``step`` over ``repeats`` steady-state windows; an unstable measurement is taken
        again (``attempts`` in all) and the one of the lowest spread kept."""
        best = self._measure_once(step, label, tokens_per_step)
        for _ in range(0 if self.config.until_stable_s else self.config.attempts - 1):
            if not best.unstable:
                break
            again = self._measure_once(step, label, tokens_per_step)
            best = min(best, again, key=lambda m: m.cv)
        return best

    def _enough(self, windows: Sequence[Window]) -> bool:
        """The series is over: ``repeats`` windows (the classic rule), or, with ``until_stable_s``, the last
        ``repeats`` agree within ``max_cv`` or the windows have lasted the ceiling."""
        cfg = self.config
        if len(windows) < cfg.repeats:
            return False
        if not cfg.until_stable_s:
            return True
        return (window_cv(windows[-cfg.repeats:]) <= cfg.max_cv
                or sum(w.time_s for w in windows) >= cfg.until_stable_s)

    def _measure_once(self, step: Step, label: str, tokens_per_step: float) -> Measurement:
        cfg = self.config
        idle_w = self.idle_power_w() if cfg.idle_s > 0 else None
        before = self.counter.state()
        inflight: deque[StepHandle] = deque()
        done = 0
        depth = cfg.depth

        def pump() -> None:
            nonlocal done
            done += self._refill(inflight, step, depth)

        t_start = self._clock()
        t_end = t_start + cfg.warmup_s
        # A pause of this process (a garbage collection, the CPU taken away) can outlast the warm-up before a
        # finished step was ever looked at: keep looking a while longer before calling the workload stuck.
        t_give_up = t_start + WARMUP_PATIENCE * cfg.warmup_s
        while self._clock() < t_end or (done == 0 and self._clock() < t_give_up):
            pump()
            self._sleep(cfg.poll_s)
        if done == 0:
            raise SetupError(f"no step of {label or 'the workload'} finished during the warm-up")
        depth = queue_depth(cfg, (self._clock() - t_start) / done)

        t0, e0 = self._wait_edge(pump)
        c0 = done
        windows: list[Window] = []
        while not self._enough(windows):
            ticks = 0
            while True:
                t, e = self._wait_edge(pump)
                ticks += 1
                long_enough = (t - t0 >= cfg.min_window_s or ticks >= cfg.min_ticks) and ticks >= 2
                if long_enough and (done - c0 >= cfg.min_window_steps or t - t0 >= 10 * cfg.min_window_s):
                    break
            windows.append(Window((e - e0) / 1000.0, t - t0, done - c0, ticks, began_s=t0))
            t0, e0, c0 = t, e, done
        self._drain(inflight)
        taken = len(windows)
        series = tuple((w.j_per_step, w.steps / w.time_s) for w in windows if w.steps and w.time_s) \
            if taken > cfg.repeats else ()
        fed = fed_windows(windows, cfg.repeats)
        kept_ids = {id(w) for w in fed}
        starved = tuple((w.began_s, w.began_s + w.time_s) for w in windows if id(w) not in kept_ids)
        windows = steadiest_run(fed, cfg.repeats)
        after = self.counter.state()
        if any(w.steps == 0 for w in windows):
            raise SetupError(
                f"a window of {label or 'the workload'} saw no finished step: one step is longer "
                f"than the window ({cfg.min_window_s} s); measure a shorter step"
            )
        per_step = [w.j_per_step for w in windows]
        cv = coefficient_of_variation(per_step)
        return Measurement(
            label=label,
            tokens_per_step=tokens_per_step,
            windows=tuple(windows),
            j_per_step=statistics.median(per_step),
            s_per_step=statistics.median(w.s_per_step for w in windows),
            power_w=statistics.median(w.power_w for w in windows),
            cv=cv,
            unstable=cv > cfg.max_cv,
            idle_power_w=idle_w,
            gpu_before=before,
            gpu_after=after,
            depth=depth,
            windows_taken=taken,
            series=series,
            starved_windows=taken - len(fed),
            starved_spans=starved,
        )


def open_meter(index: int = 0, config: MeterConfig | None = None) -> EnergyMeter:
    """A meter on the GPU torch calls ``cuda:index``, found in NVML by its UUID: with
    ``CUDA_VISIBLE_DEVICES=3`` torch's device 0 is NVML's device 3 (SetupError without a GPU)."""
    from advisor.energy.meter._nvml import NvmlDevice

    return EnergyMeter(NvmlDevice(index, uuid=torch_device_uuid(index)), config)


def torch_device_uuid(index: int) -> str | None:
    """The UUID of torch's CUDA device ``index`` (None when torch or CUDA is absent)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_properties(index).uuid)
