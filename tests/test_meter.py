"""The meter's logic on a simulated GPU and a replayed counter (no GPU, no NVML)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from advisor.energy.meter import (
    EnergyMeter,
    MeterConfig,
    Window,
    coefficient_of_variation,
    fed_windows,
    steadiest_run,
)
from advisor.errors import InputError, SetupError
from advisor.testing import ReplayCounter, SimulatedGPU, VirtualClock

FAST = MeterConfig(warmup_s=0.5, min_window_s=5.0, min_ticks=50, repeats=3, idle_s=1.0)


def _meter(gpu: SimulatedGPU, clock: VirtualClock, config: MeterConfig = FAST) -> EnergyMeter:
    return EnergyMeter(gpu, config, clock=clock, sleep=clock.sleep)


def test_steady_state_energy_per_step_matches_the_simulated_power():
    clock = VirtualClock()
    gpu = SimulatedGPU(clock, step_s=0.007, busy_w=500.0, idle_w=80.0)
    m = _meter(gpu, clock).measure(gpu.launch, "sim", tokens_per_step=16)
    # 500 W * 7 ms = 3.5 J a step; 16 tokens a step
    assert m.j_per_step == pytest.approx(3.5, rel=0.005)
    assert m.j_per_token == pytest.approx(3.5 / 16, rel=0.005)
    assert m.s_per_step == pytest.approx(0.007, rel=0.005)
    assert m.power_w == pytest.approx(500.0, rel=0.005)
    assert m.idle_power_w == pytest.approx(80.0, rel=0.01)
    assert len(m.windows) == 3 and not m.unstable and m.cv < 0.01
    for w in m.windows:
        assert w.time_s >= 5.0 - 1e-6 or w.ticks >= 50
        assert w.ticks >= 2
    assert m.tokens_per_s == pytest.approx(16 / 0.007, rel=0.005)
    assert m.to_dict()["gpu_before"]["name"] == "Fake GPU"


def test_idle_s_zero_reads_no_idle_power_and_spends_no_time_on_it():
    # the steady-load meter opens beside a live serving load: its "idle" would be the load's own draw
    times = {}
    for idle_s in (1.0, 0.0):
        clock = VirtualClock()
        gpu = SimulatedGPU(clock, step_s=0.007, busy_w=500.0, idle_w=80.0)
        m = _meter(gpu, clock, replace(FAST, idle_s=idle_s)).measure(gpu.launch, "sim", tokens_per_step=16)
        assert m.j_per_step == pytest.approx(3.5, rel=0.005)  # the reading itself is the same
        times[idle_s] = clock.t
        assert (m.idle_power_w is None) == (idle_s == 0.0) and json.dumps(m.to_dict())
    assert times[1.0] - times[0.0] >= 1.0  # the second of idle reading, gone
    meter = _meter(SimulatedGPU(clock := VirtualClock(), step_s=0.007, idle_w=80.0), clock, replace(FAST, idle_s=0.0))
    assert meter.idle_power_w() == pytest.approx(80.0, rel=0.05)  # asked for explicitly: one tick's span at least
    with pytest.raises(InputError, match="idle_s >= 0"):
        MeterConfig(idle_s=-1.0)


def test_windows_are_back_to_back_and_tick_aligned():
    clock = VirtualClock()
    gpu = SimulatedGPU(clock, step_s=0.013)
    m = _meter(gpu, clock).measure(gpu.launch)
    for w in m.windows:
        # each window spans a whole number of 100 ms ticks
        assert w.time_s / 0.1 == pytest.approx(round(w.time_s / 0.1), abs=0.02)


def test_noisy_power_is_flagged_unstable():
    clock = VirtualClock()
    # the power swings by +-20% from one 5 s window to the next
    gpu = SimulatedGPU(clock, step_s=0.01, noise=lambda tick: 1.0 + 0.2 * ((tick // 50) % 2))
    m = _meter(gpu, clock, replace(FAST, attempts=1)).measure(gpu.launch)
    assert m.cv > 0.01 and m.unstable


def test_a_passing_disturbance_is_measured_again_and_the_steady_measurement_kept():
    clock = VirtualClock()
    cfg = MeterConfig(warmup_s=0.2, min_window_s=0.5, min_ticks=5, repeats=3, idle_s=0.3)
    # +30% power over ticks 10-14: inside the first attempt's windows only
    gpu = SimulatedGPU(clock, step_s=0.01, noise=lambda tick: 1.3 if 10 <= tick < 15 else 1.0)
    m = _meter(gpu, clock, cfg).measure(gpu.launch)
    assert not m.unstable and m.j_per_step == pytest.approx(5.0, rel=0.005)
    assert clock.t > 3 * 0.5 * 2  # it measured twice
    clock = VirtualClock()
    gpu = SimulatedGPU(clock, step_s=0.01, noise=lambda tick: 1.3 if 10 <= tick < 15 else 1.0)
    once = _meter(gpu, clock, replace(cfg, attempts=1)).measure(gpu.launch)
    assert once.unstable and once.cv > 0.05


def test_short_config_windows_stop_at_min_ticks():
    clock = VirtualClock()
    gpu = SimulatedGPU(clock, step_s=0.002)
    cfg = MeterConfig(warmup_s=0.1, min_window_s=100.0, min_ticks=10, repeats=4, idle_s=0.3)
    m = _meter(gpu, clock, cfg).measure(gpu.launch)
    assert len(m.windows) == 4
    assert all(w.ticks == 10 for w in m.windows)


def test_replayed_counter_gives_the_recorded_power():
    clock = VirtualClock()
    # a recorded trace: 300 W, counter updated every 100 ms
    samples = [(i * 0.1, int(i * 0.1 * 300_000)) for i in range(400)]
    counter = ReplayCounter(samples, clock)

    class Instant:
        def query(self) -> bool:
            return True

    def step() -> Instant:
        clock.sleep(0.001)  # each step takes 1 ms of virtual time
        return Instant()

    cfg = MeterConfig(warmup_s=0.2, min_window_s=5.0, repeats=3, idle_s=0.5)
    m = EnergyMeter(counter, cfg, clock=clock, sleep=clock.sleep).measure(step)
    assert m.power_w == pytest.approx(300.0, rel=0.01)
    # each step lasts 1 ms plus the clock reads of the polling loop
    assert m.j_per_step == pytest.approx(300.0 * m.s_per_step, rel=0.01)


def test_a_stuck_counter_is_a_setup_error():
    clock = VirtualClock()
    counter = ReplayCounter([(0.0, 1000)], clock)
    with pytest.raises(SetupError, match="did not move"):
        EnergyMeter(counter, FAST, clock=clock, sleep=clock.sleep).idle_power_w()


def test_bad_config_is_an_input_error():
    with pytest.raises(InputError):
        MeterConfig(repeats=0)
    with pytest.raises(InputError, match="soak_s"):
        MeterConfig(soak_s=-1.0)


def test_cv():
    assert coefficient_of_variation([1.0]) == 0.0
    assert coefficient_of_variation([1.0, 1.0, 1.0]) == 0.0
    assert coefficient_of_variation([0.9, 1.1]) == pytest.approx(0.1414, rel=1e-3)


def test_missing_nvml_is_a_setup_error(monkeypatch):
    from advisor.energy.meter import _nvml as nvml

    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(SetupError, match="nvidia-ml-py"):
        nvml.NvmlDevice(0)


def test_no_driver_is_a_setup_error(monkeypatch):
    import types

    from advisor.energy.meter import _nvml as nvml

    class NVMLError(Exception):
        pass

    def init():
        raise NVMLError("Driver Not Loaded")

    fake = types.SimpleNamespace(NVMLError=NVMLError, nvmlInit=init, nvmlDeviceGetTotalEnergyConsumption=lambda h: 0)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with pytest.raises(SetupError, match="no NVIDIA driver"):
        nvml.NvmlDevice(0)


def test_busy_is_nvmls_utilization_and_none_where_the_driver_does_not_say(monkeypatch):
    import types

    from advisor.energy.meter import _nvml as nvml

    class NVMLError(Exception):
        pass

    said = iter([types.SimpleNamespace(gpu=87, memory=40), NVMLError("Not Supported")])

    def utilization(handle):
        value = next(said)
        if isinstance(value, Exception):
            raise value
        return value

    fake = types.SimpleNamespace(
        NVMLError=NVMLError, nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: "h0", nvmlDeviceGetName=lambda h: b"Fake GPU",
        nvmlSystemGetDriverVersion=lambda: b"0", nvmlDeviceGetTotalEnergyConsumption=lambda h: 0,
        nvmlDeviceGetUtilizationRates=utilization)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    device = nvml.NvmlDevice(0)
    assert device.busy_pct() == 87.0 and device.busy_pct() is None


def test_the_gpus_busy_are_the_counters_own_nvml_devices_averaged(monkeypatch):
    import types

    from advisor.energy.meter import SummedCounter, gpus_busy
    from advisor.energy.meter import _nvml as nvml

    class NVMLError(Exception):
        pass

    busy = {"h0": 90, "h1": 60}
    fake = types.SimpleNamespace(
        NVMLError=NVMLError, nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}", nvmlDeviceGetName=lambda h: b"Fake GPU",
        nvmlSystemGetDriverVersion=lambda: b"0", nvmlDeviceGetTotalEnergyConsumption=lambda h: 0,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=busy[h]))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    one, two = nvml.NvmlDevice(0), nvml.NvmlDevice(1)
    assert gpus_busy(one)() == 90.0 and gpus_busy(SummedCounter([one, two]))() == 75.0
    assert gpus_busy(SimulatedGPU(VirtualClock(), step_s=0.01)) is None  # not NVML's: nothing to read


def test_the_other_gpus_busy_is_the_busiest_gpu_of_the_host_beside_the_counters(monkeypatch):
    import types

    from advisor.energy.meter import SummedCounter, other_gpus_busy
    from advisor.energy.meter import _nvml as nvml

    class NVMLError(Exception):
        pass

    busy = {"h0": 100, "h1": 35, "h2": 80, "h3": 5}

    def energy(handle):
        if handle == "h3":  # a GPU whose counters NVML does not expose: left out, not an error
            raise NVMLError("Not Supported")
        return 0

    fake = types.SimpleNamespace(
        NVMLError=NVMLError, nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 4,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}", nvmlDeviceGetName=lambda h: b"Fake GPU",
        nvmlSystemGetDriverVersion=lambda: b"0", nvmlDeviceGetTotalEnergyConsumption=energy,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=busy[h]))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    zero, two = nvml.NvmlDevice(0), nvml.NvmlDevice(2)
    assert other_gpus_busy(zero)() == 80.0  # GPUs 1 and 2 beside it: the busier
    assert other_gpus_busy(SummedCounter([zero, two]))() == 35.0  # a two-GPU engine: GPU 1 beside it
    busy["h1"] = 0
    assert other_gpus_busy(SummedCounter([zero, two]))() == 0.0  # read each time
    monkeypatch.setattr(fake, "nvmlDeviceGetCount", lambda: 1)
    assert other_gpus_busy(zero) is None  # a host of one GPU: nothing beside it
    assert other_gpus_busy(SimulatedGPU(VirtualClock(), step_s=0.01)) is None  # not NVML's


class _SlowReads:
    """A simulated GPU whose energy reads take ``read_s`` of host time, as NVML's do (2-18 ms on an H200)."""

    def __init__(self, gpu: SimulatedGPU, clock: VirtualClock, read_s: float) -> None:
        self.gpu, self.clock, self.read_s = gpu, clock, read_s

    def energy_mj(self) -> int:
        self.clock.sleep(self.read_s)
        return self.gpu.energy_mj()

    def state(self):
        return self.gpu.state()


@pytest.mark.parametrize("queued_s", [0.0, 0.05])
def test_slow_counter_reads_do_not_let_short_steps_run_dry(queued_s):
    clock = VirtualClock()
    gpu = SimulatedGPU(clock, step_s=0.001, busy_w=300.0, idle_w=100.0)
    cfg = MeterConfig(warmup_s=0.2, min_window_s=1.0, min_ticks=10, repeats=3, idle_s=0.3, queued_s=queued_s)
    m = EnergyMeter(_SlowReads(gpu, clock, read_s=0.004), cfg, clock=clock, sleep=clock.sleep).measure(gpu.launch)
    if queued_s == 0.0:
        # 4 steps (4 ms) in flight, one loop = 1 ms sleep + a 4 ms read: the GPU idles between
        assert m.depth == 4
        assert m.s_per_step > 0.0012
        assert m.j_per_step > 0.3 * 1.1
    else:
        assert m.depth >= 50  # 50 ms of 1 ms steps
        assert m.s_per_step == pytest.approx(0.001, rel=0.01)
        assert m.j_per_step == pytest.approx(0.3, rel=0.01)  # 300 W x 1 ms


def test_queue_depth_holds_the_queued_time():
    from advisor.energy.meter import queue_depth

    cfg = MeterConfig(depth=4, queued_s=0.05, max_depth=100)
    assert queue_depth(cfg, 0.001) == 50
    assert queue_depth(cfg, 0.02) == 4  # long steps: the configured depth
    assert queue_depth(cfg, 1e-6) == 100  # capped
    assert queue_depth(MeterConfig(depth=3, queued_s=0.0), 0.001) == 3  # an engine's exact depth


class _WarmingGPU(SimulatedGPU):
    """Its temperature climbs from 40 C towards 60 C with a 15 s time constant while it runs."""

    def state(self):
        return replace(super().state(), temperature_c=int(40 + 20 * (1 - math.exp(-self.clock.t / 15.0))))


def test_a_soak_runs_the_step_until_the_temperature_settles():
    clock = VirtualClock()
    gpu = _WarmingGPU(clock, step_s=0.01)
    soak = _meter(gpu, clock).soak(gpu.launch, max_s=120.0, settle_c=1.0, every_s=5.0)
    # integer readings every 5 s: 45, 49, 52, 54, 56, 57, 58, 58: the first rise under 1 C is at 40 s
    assert soak["from_c"] == 40 and soak["to_c"] == 58
    assert soak["seconds"] == pytest.approx(40.0, abs=0.1)
    assert gpu.launched > 0.9 * 40.0 / 0.01  # kept busy throughout
    assert gpu.busy_until <= clock.t  # nothing left in flight


def test_a_soak_stops_at_its_time_limit():
    clock = VirtualClock()
    gpu = _WarmingGPU(clock, step_s=0.01)
    soak = _meter(gpu, clock).soak(gpu.launch, max_s=18.0, settle_c=1.0, every_s=5.0)
    assert soak["seconds"] == pytest.approx(18.0, abs=0.1) and soak["to_c"] == 53
    short = _meter(gpu, clock).soak(gpu.launch, max_s=2.0, settle_c=1.0, every_s=5.0)
    assert short["seconds"] == pytest.approx(2.0, abs=0.1)  # never longer than asked


def test_a_first_step_slower_than_the_warm_up_is_waited_for_a_while_then_called_stuck():
    clock = VirtualClock()
    gpu = SimulatedGPU(clock, step_s=1.2, busy_w=400.0)  # longer than the 0.5 s warm-up, within 4 of them
    m = _meter(gpu, clock).measure(gpu.launch, "slow")
    assert m.s_per_step == pytest.approx(1.2, rel=0.05)
    clock = VirtualClock()
    stuck = SimulatedGPU(clock, step_s=3.0)  # no step within 4 warm-ups (2 s)
    with pytest.raises(SetupError, match="no step of stuck finished during the warm-up"):
        _meter(stuck, clock).measure(stuck.launch, "stuck")


UNTIL_STABLE = MeterConfig(warmup_s=0.2, min_window_s=1.0, min_ticks=10, repeats=3, idle_s=0.3, until_stable_s=20.0)


def test_until_stable_closes_once_the_last_windows_agree_on_a_steady_load():
    clock = VirtualClock()
    gpu = SimulatedGPU(clock, step_s=0.01, busy_w=500.0)
    m = _meter(gpu, clock, UNTIL_STABLE).measure(gpu.launch)
    assert not m.unstable and m.j_per_step == pytest.approx(5.0, rel=0.005)
    assert m.windows_taken == 3 and len(m.windows) == 3 and m.series == ()  # nothing beyond the kept windows
    assert clock.t < 0.3 + 0.2 + 4 * 1.0 + 1.0  # idle, warm-up, three 1 s windows and the edges: no second series


def test_until_stable_waits_out_a_disturbance_and_keeps_the_steady_windows():
    clock = VirtualClock()
    # +30% power over ticks 10-14 (the first windows), steady after
    gpu = SimulatedGPU(clock, step_s=0.01, noise=lambda tick: 1.3 if 10 <= tick < 15 else 1.0)
    m = _meter(gpu, clock, UNTIL_STABLE).measure(gpu.launch)
    assert not m.unstable and m.j_per_step == pytest.approx(5.0, rel=0.005)
    assert m.windows_taken > 3 and len(m.windows) == 3
    assert m.cv <= UNTIL_STABLE.max_cv


def test_until_stable_stops_at_its_ceiling_on_a_ragged_load_and_says_unstable():
    clock = VirtualClock()
    gpu = SimulatedGPU(clock, step_s=0.01, noise=lambda tick: 1.0 + 0.2 * ((tick // 10) % 2))
    m = _meter(gpu, clock, UNTIL_STABLE).measure(gpu.launch)
    assert m.unstable and m.cv > 0.01
    assert sum(w.time_s for w in m.windows) < UNTIL_STABLE.until_stable_s
    assert m.windows_taken >= UNTIL_STABLE.until_stable_s / 1.2  # it kept metering up to the ceiling
    assert clock.t < UNTIL_STABLE.until_stable_s + 3.0  # and no further: one series, no attempts after it
    # every window it metered is kept as a series: the ragged power shows, the throughput does not move
    assert len(m.series) == m.windows_taken
    energies = [j for j, _ in m.series]
    assert max(energies) / min(energies) > 1.05
    assert all(rate == pytest.approx(100.0, rel=0.05) for _, rate in m.series)


def test_a_window_holds_at_least_its_steps_where_steps_are_long():
    clock = VirtualClock()
    gpu = SimulatedGPU(clock, step_s=0.05)  # 20 steps a second: a 1 s window would hold 20
    m = _meter(gpu, clock, replace(UNTIL_STABLE, min_window_steps=60)).measure(gpu.launch)
    assert all(w.steps >= 60 for w in m.windows) and all(w.time_s >= 2.9 for w in m.windows)


def test_until_stable_leaves_out_the_windows_a_host_stall_starved():
    """Round 5's stall (reports/benchmarks/verify_time.md): a load whose windows jitter (they never settle), then a
    host stall from which the GPU draws less at less throughput, steadily, so the last three windows agree."""
    clock = VirtualClock()
    stall_at = 8.0
    gpu = SimulatedGPU(clock, step_s=0.01, busy_w=500.0, idle_w=80.0,
                       noise=lambda tick: 1.0 + 0.08 * ((tick // 7) % 2) if tick * 0.1 < stall_at else 1.0)

    def launch():  # from stall_at on the host is late with every step: the GPU idles 5 ms before each
        if clock.t >= stall_at:
            gpu.busy_until = max(gpu.busy_until, clock.t) + 0.005
        return gpu.launch()

    m = _meter(gpu, clock, UNTIL_STABLE).measure(launch)
    assert clock.t < UNTIL_STABLE.until_stable_s  # it settled: on the stalled level
    stalled = [rate for _, rate in m.series if rate < 90]
    assert len(stalled) >= 3 and m.starved_windows == len(stalled)
    # the windows kept are the fed ones: 10 ms a step at 5.1-5.3 J, not the stall's 15 ms at 5.4 J
    assert m.s_per_step == pytest.approx(0.01, rel=0.01)
    assert m.j_per_step == pytest.approx(5.2, rel=0.015)
    # where the starved windows lay, on the meter's clock (a load leaves its requests then out of its latencies)
    assert len(m.starved_spans) == m.starved_windows
    assert all(stall_at < end <= clock.t and end - start >= 0.9 for start, end in m.starved_spans)


def test_a_load_whose_throughput_jitters_at_one_power_loses_no_window():
    """A power-capped load: the windows' throughput moves 10% while the power stays; none is starved."""
    windows = [Window(energy_j=690.0 * 2, time_s=2.0, steps=int(2 * rate), ticks=20)
               for rate in (11360, 11349, 12519, 10064, 11113, 11461, 10966, 10704, 10102, 10582)]
    assert fed_windows(windows, 3) == windows


def test_round_5s_stalled_metering_keeps_its_fed_windows():
    """The recommendation's batch-64 metering of round 5, as its series recorded it (J/token, tokens/s a window)."""
    served = json.loads((Path(__file__).resolve().parents[1] / "reports/benchmarks/verify_time_data/round5"
                         / "verify_served/fe6b6a3cd096.json").read_text())["served"]
    series = served["energy"]["tpot12"]["measurement"]["series"]
    windows = [Window(energy_j=j * rate * 2.0, time_s=2.0, steps=round(rate * 2.0), ticks=20) for j, rate in series]
    fed = fed_windows(windows, 3)
    assert len(windows) - len(fed) == 6  # the drop's window and the five after it
    kept = steadiest_run(fed, 3)
    assert all(w.steps / w.time_s > 9000 for w in kept)  # the 9.1-9.5k tokens/s level, not the stall's 6.1k
