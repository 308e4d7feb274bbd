"""Measure a shipped GPU profile: GEMM cost tables over common models' shapes, plus anchor models.

A GPU profile (schema ``precision-advisor/gpu-energy-profile``, version 1) holds:

* ``gemm_ms[fmt]["NxK"][i]``: one GEMM of an ``N x K`` weight (the runtime's BF16 ``F.linear``
  or FP8 ``torch._scaled_mm``) at ``m_buckets[i]`` rows, from CUDA-graph replays over enough
  distinct weight copies that the L2 cache does not hold them; the shapes are every fused group
  and lm_head of :data:`~advisor.energy.profiling.REFERENCE_SHAPES` (0.1B-70B);
* ``anchors``: per-model profiles (:mod:`advisor.energy.profiling._model`) of a few models that
  the transfer benchmark does not test; the cost model (:mod:`advisor.energy.prediction`)
  fits from them the per-layer kernel floors of the non-GEMM part and the power split;
* ``gemm_energy``: every GEMM's metered joules at a few row counts and a rest fitted to the anchors
  (:mod:`advisor.energy.profiling._gemm_energy`), which price models of large layers.

Measuring needs torch and a GPU (tens of minutes, half of it the GEMM energies).
"""

from __future__ import annotations

import math
import time
from typing import Any

from advisor.energy.profiling._gemm_timer import gemm_graph_ms, over_weights, weight_copies
from advisor.energy.profiling._gpu_profile import SCHEMA, VERSION, nk_key
from advisor.formats import Format

M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
#: models measured whole (or their first layers) to fit the non-GEMM and power terms
ANCHORS = (("SmolLM2-360M", None), ("Llama-3.2-1B", None), ("Llama-3.2-3B", 14), ("Qwen2.5-14B", 8))
#: row counts whose GEMM energy is metered: the decode batches and prompt lengths of the transfer benchmark
ENERGY_ROWS = (1, 16, 64, 512, 2048)
#: the GEMM energies' meter: short windows (each GEMM's graph is replayed alone), after a 20 s soak
ENERGY_METER = {"warmup_s": 0.2, "min_window_s": 0.2, "min_ticks": 2, "repeats": 2, "max_cv": 0.02, "attempts": 2,
                "soak_s": 20.0}
SOAK_NK = (28672, 4096)  # Llama-3.1-8B's gate_up: warms the GPU before the GEMM energies


def _lm_heads() -> set[tuple[int, int]]:
    """The reference shapes' lm_head (N, K): BF16 only, in every table (the runtime keeps the lm_head BF16)."""
    from advisor.energy.profiling._reference_shapes import REFERENCE_SHAPES

    return {s.gemm_nk()["lm_head"] for s in REFERENCE_SHAPES.values()}


def gemm_row_ms(n: int, k: int, fmt: Format, ms: tuple[int, ...], max_copies: int | None = 16,
                iters: int = 10) -> list[float]:
    """Time of one ``n x k`` GEMM in ``fmt`` at each row count in ``ms``: a graph over distinct copies of the
    weight (:func:`~advisor.energy.profiling.weight_copies`). With no cap on the copies every GEMM reads its
    weight from HBM, closer to a step of a large model, but the shipped profiles refitted on such tables predicted
    worse (reports/benchmarks/gemm_table_check.md), so the shipped tables keep the cap."""
    lins = weight_copies(n, k, fmt, max_copies)
    # the first pass only warms up (clocks, cuBLASLt heuristics)
    out = [gemm_graph_ms(lins, m, fmt, iters=iters) for m in (ms[0], *ms)]
    lins.clear()
    return out[1:]


def gemm_row_energy(n: int, k: int, fmt: Format, ms: tuple[int, ...], meter, max_copies: int | None = 16
                    ) -> list[dict[str, float]]:
    """Metered energy of one ``n x k`` GEMM in ``fmt`` at each row count in ``ms``: :func:`gemm_row_ms`'s graph
    replayed back to back under ``meter`` (an :class:`~advisor.energy.meter._meter.EnergyMeter`). Per GEMM: J and ms
    (the meter's), and the window's W, CV and GPU temperature."""
    from advisor.energy.runtime import GraphReplay, capture

    lins = weight_copies(n, k, fmt, max_copies)
    out = []
    for m in ms:
        step = GraphReplay(capture(over_weights(lins, m, fmt)))
        r = meter.measure(step.launch, f"{nk_key(n, k)} {fmt.value} m{m}")
        out.append({"j": r.j_per_step / len(lins), "ms": r.s_per_step * 1e3 / len(lins), "power_w": r.power_w,
                    "cv": r.cv, "temperature_c": r.gpu_after.temperature_c})
        del step
    lins.clear()
    return out


def measure_gemm_energy(meter, shapes: list[tuple[int, int]], rows: tuple[int, ...] = ENERGY_ROWS,
                        deadline_s: float = math.inf, done: dict[str, dict[str, Any]] | None = None, log=print,
                        after_shape=None) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """The metered energy of each ``(N, K)`` in ``shapes``, both formats (the reference shapes' lm_heads BF16
    only), with :func:`gemm_row_energy` after a soak, in order until ``deadline_s`` (seconds from the call):
    ``({fmt: {"NxK": [per row: J, ms, W, CV, C]}}, the soak's record)``. Shapes in ``done`` are kept, not metered
    again; ``after_shape(gemm)`` is called after each shape (a caller that writes its file as it goes)."""
    from advisor.energy.runtime import GraphReplay, capture, release_cuda_memory

    t0 = time.perf_counter()
    heads = _lm_heads()
    gemm = {Format.BF16.value: dict((done or {}).get("bf16", {})), Format.FP8.value: dict((done or {}).get("fp8", {}))}
    lins = weight_copies(*SOAK_NK, Format.BF16, 16)
    soak = meter.soak(GraphReplay(capture(over_weights(lins, max(rows), Format.BF16))).launch,
                      meter.config.soak_s)
    del lins
    for n, k in shapes:
        if time.perf_counter() - t0 > deadline_s:
            log(f"deadline: GEMM energy of {nk_key(n, k)} and later not measured")
            break
        for fmt in (Format.BF16, Format.FP8):
            if (fmt == Format.FP8 and (n, k) in heads) or nk_key(n, k) in gemm[fmt.value]:
                continue  # the lm_head stays BF16; kept shapes are not metered again
            points = gemm_row_energy(n, k, fmt, rows, meter)
            gemm[fmt.value][nk_key(n, k)] = points
            log(f"[{time.perf_counter() - t0:6.1f}s] {nk_key(n, k):12s} {fmt.value:4s} " + " ".join(
                f"m{m}:{p['j'] * 1e3:.4f}mJ/{p['ms'] * 1e3:.1f}us/{p['power_w']:.0f}W"
                for m, p in zip(rows, points, strict=True)))
        release_cuda_memory()
        if after_shape is not None:
            after_shape(gemm)
    return gemm, soak


def measure_gpu_profile(command: str, deadline_s: float = math.inf, anchors=ANCHORS, log=print,
                        max_copies: int | None = 16, iters: int = 10, gemm_energy_s: float = math.inf
                        ) -> dict[str, Any]:
    """This GPU's profile: GEMM tables, the ``anchors``' per-model profiles (those started within ``deadline_s``
    of the call) and the GEMM energies (for up to ``gemm_energy_s``; none at 0 or without anchors). The defaults
    measure everything, as `advisor profile` does; benchmarks that must fit
    a device call pass deadlines, and a shape or anchor left out is logged."""
    from advisor.energy.measure import Bench, torch_with_gpu
    from advisor.energy.meter import MeterConfig, open_meter
    from advisor.energy.profiling._layer import measurement_header
    from advisor.energy.profiling._model import measure_model_profile
    from advisor.energy.profiling._reference_shapes import REFERENCE_SHAPES, table_nk
    from advisor.energy.runtime import copy_bandwidth_gb_s, release_cuda_memory
    from advisor.formats import gpu_from_device_name

    torch = torch_with_gpu()
    t0 = time.perf_counter()
    meter = open_meter(torch.cuda.current_device(), MeterConfig(warmup_s=0.8, min_window_s=0.6, min_ticks=6))
    state = meter.counter.state()
    header = measurement_header(state, meter.idle_power_w(), copy_bandwidth_gb_s(), command, torch.__version__)
    heads = _lm_heads()
    shapes = table_nk()
    log(f"GPU profile of {state.name}: GEMM times of {len(shapes)} shapes, {len(anchors)} anchor models, then "
        f"GEMM energies{'' if anchors and gemm_energy_s > 0 else ' (skipped)'} (18 minutes on an H100)")
    table: dict[str, dict[str, list[float]]] = {Format.BF16.value: {}, Format.FP8.value: {}}
    for n, k in shapes:
        for fmt in (Format.BF16, Format.FP8):
            if fmt == Format.FP8 and (n, k) in heads:
                continue  # the lm_head stays BF16
            table[fmt.value][nk_key(n, k)] = gemm_row_ms(n, k, fmt, M_BUCKETS, max_copies, iters)
        release_cuda_memory()
    log(f"gemm tables: {sum(len(v) for v in table.values())} shape-format pairs x {len(M_BUCKETS)} rows, "
        f"{time.perf_counter() - t0:.0f} s")
    measured_anchors: dict[str, Any] = {}
    for i, (name, layers) in enumerate(anchors, 1):
        if time.perf_counter() - t0 > deadline_s:
            log(f"deadline: anchor {name} not measured")
            break
        log(f"anchor {i}/{len(anchors)}: {name}{'' if layers is None else f' ({layers} layers)'}")
        dims = REFERENCE_SHAPES[name].dims(layers)
        bench = Bench.create(dims, max_pos=4096)
        measured_anchors[name] = measure_model_profile(dims, batches=(1, 16, 64), prefill_lengths=(512, 2048),
                                                       meter=meter, bench=bench, command=command, log=log)
        del bench
        release_cuda_memory()
    kind = gpu_from_device_name(state.name)
    profile = {
        "schema": SCHEMA,
        "version": VERSION,
        **header,
        "gpu_kind": kind.value if kind else None,
        "source": "measured",
        "verified": True,
        "formats": [Format.BF16.value, Format.FP8.value],
        "m_buckets": list(M_BUCKETS),
        "gemm_ms": table,
        "anchors": measured_anchors,
    }
    if gemm_energy_s > 0 and measured_anchors:
        from advisor.energy.profiling._gemm_energy import gemm_energy_section

        energy_meter = open_meter(torch.cuda.current_device(), MeterConfig(**ENERGY_METER))
        log(f"GEMM energies: {len(shapes)} shapes x {len(ENERGY_ROWS)} row counts, each format, after a "
            f"{ENERGY_METER['soak_s']:.0f} s soak")
        gemm, _ = measure_gemm_energy(energy_meter, shapes, deadline_s=gemm_energy_s, log=log)
        collect = {"gpu_uuid": header["gpu_uuid"], "date": header["date"], "command": command,
                   "m_buckets": list(ENERGY_ROWS), "gemm": gemm}
        anchors_run = {"gpu_uuid": header["gpu_uuid"], "command": command, "anchors": measured_anchors}
        profile["gemm_energy"] = gemm_energy_section(profile, [(collect, anchors_run)])
        log(f"GEMM energies: {sum(len(v) for v in gemm.values())} shape-format pairs x {len(ENERGY_ROWS)} rows, "
            f"{time.perf_counter() - t0:.0f} s in all")
    profile["seconds"] = time.perf_counter() - t0
    return profile
