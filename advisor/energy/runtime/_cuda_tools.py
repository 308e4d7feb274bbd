"""CUDA helpers of the measurement runtime: a captured graph step, copy bandwidth, kernel listing."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class CapturedStep:
    graph: object
    logits: torch.Tensor
    batch: int
    length: int
    start: int

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.length

    def launch(self):
        """Replay once and return an event that completes with it (the meter's Step)."""
        self.graph.replay()
        ev = torch.cuda.Event()
        ev.record()
        return ev

    def time_ms(self, iters: int = 20, warmup: int = 3) -> float:
        for _ in range(warmup):
            self.graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            self.graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / iters


def capture(fn) -> torch.cuda.CUDAGraph:
    """``fn`` captured in a CUDA graph (run once on a side stream first, as capture requires)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


@dataclass
class GraphReplay:
    """A captured graph as the meter's Step: each launch replays it once."""

    graph: torch.cuda.CUDAGraph

    def launch(self):
        self.graph.replay()
        ev = torch.cuda.Event()
        ev.record()
        return ev


def graph_ms(fn, iters: int = 20) -> float:
    """ms per call of ``fn`` replayed from a CUDA graph (warm-up replays first)."""
    g = capture(fn)
    for _ in range(3):
        g.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / iters


def copy_bandwidth_gb_s(nbytes: int = 2 << 30, iters: int = 10) -> float:
    """Device-to-device copy bandwidth, bytes read plus written, in GB/s."""
    src = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        dst.copy_(src)
    end.record()
    end.synchronize()
    s = start.elapsed_time(end) / 1000 / iters
    del src, dst
    return 2 * nbytes / s / 1e9


def kernel_names(fn, steps: int = 1) -> list[dict]:
    """CUDA kernels one call of ``fn`` launches (eager), with counts and device time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        dt = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if dt and e.count:
            rows.append({"name": e.key[:160], "count": e.count // steps, "us": dt / steps})
    rows.sort(key=lambda r: -r["us"])
    return rows


def release_cuda_memory() -> None:
    """Give back cuBLAS workspaces and cached blocks between measurements of different models or shapes."""
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
