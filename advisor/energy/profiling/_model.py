"""Per-model energy profiles: this model's own layer kinds measured on this GPU with the runtime.

A profile (schema ``precision-advisor/model-energy-profile``, version 1) holds, for one GPU
and one model (its :class:`~advisor.energy.runtime.DecoderDims`, random weights):

* ``decode.gemm_ms[fmt][kind][i]``: one layer's fused-group GEMM (qkv, o, gate_up, down; a MoE
  layer's ``experts``: its routed experts' grouped GEMMs for that many tokens, with
  ``decode.experts_touched[i]`` the distinct experts they read) at ``decode.batches[i]`` rows,
  from CUDA-graph replays over all layers' distinct weights;
* ``decode.lm_head_ms[i]``: the BF16 lm_head at that many rows;
* ``decode.step_ms[fmt][context][i]``: the whole decode step of the all-``fmt`` plan (CUDA
  events over graph replays); the step minus its GEMMs is the non-GEMM part (attention,
  norms, activation, quantization, MoE routing, lm_head, gaps between kernels);
* ``decode.j_per_step[fmt][context][i]``: that step's energy from the NVML meter at each of
  ``decode.energy_contexts``;
* ``prefill``: the same per prompt length (one request);
* ``decode.mlp_fp8`` / ``prefill.mlp_fp8`` (absent in profiles stored before it): ``step_ms`` and
  ``j_per_step`` (and the meter's records) of the kind corner, the plan with every layer's MLP groups
  (gate_up, down; a MoE layer's experts and shared expert) in FP8 and attention (qkv, o) in BF16: what
  a kind saves in FP8 is not its share of the weights (reports/benchmarks/layer_additivity.md).
* ``prefill.alt_fp8`` (absent in profiles stored before 2026-11-23): the same records of the mixing point's
  prefill, every other layer (the odd ones) in FP8, both kinds: plans that mix formats across layers draw more
  than the straight line between all-BF16 and all-FP8 in prefill (reports/benchmarks/energy_transfer*.md), and
  the cost model bends a prefill's line by what this point measured. Profiles stored on 2026-11-23 also hold
  ``decode.alt_fp8``, which is not read: which layers a plan holds in FP8 moves a decode step's energy more than
  mixing does, and the alternating point bent contiguous plans the wrong way
  (reports/benchmarks/profile_point_trials.md); its decode steps are no longer metered.
* ``decode.last_quarter_fp8`` (absent in profiles stored before 2026-11-26): the position point's decode records,
  the last quarter of the layers (at least one) in FP8, both kinds: the last layers save more than their share
  (reports/benchmarks/energy_transfer.md, profile_point_trials.md), and the cost model shares a decode saving
  between the last quarter and the rest by it.

It is keyed (:func:`profile_key`) by the GPU (name, UUID, driver, power limit), the model
(a digest of its layer-by-layer description) and the runtime version: a profile is reused only
where all match (:class:`~advisor.energy.profiling.ProfileStore`). The cost model is
:class:`advisor.energy.prediction.ModelProfileCostModel`.
Measuring needs torch and a GPU; keying and storing do not.
"""

from __future__ import annotations

import hashlib
import json
import time
from functools import partial
from typing import Any

from advisor.energy.profiling._schemas import MODEL_SCHEMA as SCHEMA
from advisor.energy.profiling._schemas import MODEL_VERSION as VERSION
from advisor.errors import InputError
from advisor.formats import Format

#: Bump when the runtime's kernels, or the meter, change what a step costs (profiles of older runtimes are not
#: reused). .2: the meter keeps 50 ms of steps queued (MeterConfig.queued_s); .1 profiles of sub-ms steps
#: held the GPU's idle gaps between NVML reads. Profiles stored before the kind corner stay valid: the cost model
#: shares their FP8 saving by weight alone, and says so in its label.
RUNTIME_VERSION = "2026-11-22.2"
FORMATS = (Format.BF16, Format.FP8)
#: the profiled kind corner: MLP groups in FP8, attention in BF16 (see the module doc)
MLP_FP8 = "mlp_fp8"
ATTENTION_KINDS = ("qkv", "o")
#: the profiled mixing point: every other layer in FP8, both kinds (see the module doc)
ALT_FP8 = "alt_fp8"
#: the profiled position point: the last quarter of the layers in FP8, both kinds (see the module doc)
LAST_QUARTER_FP8 = "last_quarter_fp8"
#: what a profile records of each metered plan, per point
RECORDS = ("step_ms", "j_per_step", "power_w", "meter_ms_per_step", "cv", "temperature_c")


def is_attention(group: str) -> bool:
    """``layers.3.qkv`` (or ``3.o``): an attention group."""
    return group.rsplit(".", 1)[-1] in ATTENTION_KINDS


def corner_format(group: str) -> Format:
    """``group``'s format in the kind corner."""
    return Format.BF16 if is_attention(group) else Format.FP8


def mixing_format(group: str) -> Format:
    """``group``'s (``layers.{i}.{kind}``) format at the mixing point: FP8 in the odd layers."""
    return Format.FP8 if int(group.split(".")[1]) % 2 else Format.BF16


def last_quarter(num_layers: int) -> range:
    """The layers of the position point: the last quarter (at least one)."""
    return range(num_layers - max(1, num_layers // 4), num_layers)


def last_quarter_format(group: str, num_layers: int) -> Format:
    """``group``'s (``layers.{i}.{kind}``) format at the position point of a ``num_layers``-layer model."""
    return Format.FP8 if int(group.split(".")[1]) in last_quarter(num_layers) else Format.BF16


#: the profiled plans beyond all-BF16 and all-FP8 whose layout depends on the group alone
CORNERS = {MLP_FP8: corner_format, ALT_FP8: mixing_format}
#: every profiled point beyond all-BF16 and all-FP8 (the position point's layout depends on the layer count)
POINTS = (*CORNERS, LAST_QUARTER_FP8)


def profile_meter_config():
    """Shorter windows than a plan's measurement, since a profile meters many points; they reproduced the
    default windows' J/step within the run-to-run spread (reports/benchmarks/energy_transfer.md)."""
    from advisor.energy.meter import MeterConfig

    return MeterConfig(warmup_s=0.8, min_window_s=0.6, min_ticks=6, repeats=3)


def _six_digits(value: Any) -> Any:
    """``value`` with every float to 6 significant digits: a GGUF file stores a config's floats in float32
    (SmolLM2-135M's rms_norm_eps 1e-05 reads back as 9.999999747e-06), and the same model must key the same."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _six_digits(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_six_digits(v) for v in value]
    return value


def model_digest(dims_dict: dict[str, Any]) -> str:
    """A stable digest of a model's layer-by-layer description (``DecoderDims.to_dict()``), its floats to 6
    significant digits."""
    text = json.dumps(_six_digits(dims_dict), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


#: what a model's description holds that changes no kernel: its name and numeric details of its norms and
#: RoPE tables (same kernels, other constants), and whether it came through an adapter or as a stand-in
NOT_GEOMETRY = ("family", "model_type", "rms_eps", "stand_in", "config")


def geometry_digest(dims_dict: dict[str, Any]) -> str:
    """A digest of what a step's cost depends on: :func:`model_digest` without :data:`NOT_GEOMETRY`. Two
    models with the same geometry (a fine-tune and its base; a real model and the random-weight shape a
    profile measured) run the same kernels on the same shapes."""
    return model_digest({k: v for k, v in dims_dict.items() if k not in NOT_GEOMETRY})


def profile_key(state: Any, dims_dict: dict[str, Any], runtime: str = RUNTIME_VERSION) -> dict[str, Any]:
    """What must match for a stored profile to be reused: GPU unit and settings, model, runtime."""
    return {
        "gpu": state.name,
        "gpu_uuid": state.uuid,
        "driver": state.driver,
        "power_limit_w": float(state.power_limit_w),
        "model": model_digest(dims_dict),
        "runtime": runtime,
    }


def key_digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def validate_model_profile(data: dict[str, Any], origin: str = "model profile") -> dict[str, Any]:
    if data.get("schema") != SCHEMA or data.get("version") != VERSION:
        raise InputError(f"{origin} is not a per-model energy profile of schema {SCHEMA} version {VERSION}")
    for k in ("key", "gpu", "gpu_kind", "driver", "date", "idle_power_w", "model", "decode", "prefill", "formats"):
        if k not in data:
            raise InputError(f"{origin} lacks the field {k!r}")
    return data


def is_model_profile(data: dict[str, Any]) -> bool:
    return data.get("schema") == SCHEMA


# -- measuring (GPU) ---------------------------------------------------------------


def profile_kinds(dims) -> tuple[str, ...]:
    """The group kinds of ``dims``'s layers, in order: dense (qkv, o, gate_up, down), MoE (qkv, o, experts)."""
    from advisor.energy.runtime import layer_kinds

    out: list[str] = []
    for kinds in layer_kinds(dims):
        out += [k for k in kinds if k not in out]
    return tuple(out)


def _layers_with(bench, kind: str) -> list[int]:
    from advisor.energy.runtime import layer_kinds

    return [i for i, kinds in enumerate(layer_kinds(bench.dims)) if kind in kinds]


def layer_gemm_ms(bench, kind: str, fmt: Format, m: int) -> float:
    """One layer's ``kind`` GEMM at ``m`` rows: a graph over all layers' (distinct) weights."""
    from advisor.energy.profiling._gemm_timer import gemm_graph_ms

    if kind == "experts":
        return experts_gemm_ms(bench, fmt, m)
    return gemm_graph_ms([bench.linear_cache[(f"{i}.{kind}", fmt)] for i in _layers_with(bench, kind)], m, fmt)


def _dispatched(bench, fmt: Format, m: int, seed: int = 0) -> list[tuple[Any, Any]]:
    """Each MoE layer's ``fmt`` experts with ``m`` random hidden states routed and sorted (same per seed)."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    with torch.no_grad():
        for i in _layers_with(bench, "experts"):
            experts = bench.linear_cache[(f"{i}.experts", fmt)]
            x = torch.randn(m, bench.dims.hidden, device="cuda", generator=gen).to(torch.bfloat16)
            out.append((experts, experts.dispatch(x)))
    return out


def experts_gemm_ms(bench, fmt: Format, m: int) -> float:
    """One MoE layer's routed-expert grouped GEMMs (gate/up, act*up, down) for ``m`` tokens, mean over the
    MoE layers: each layer routes random hidden states once outside the graph (router, sort and gathers
    are the step's non-GEMM part), then one graph replays every layer's grouped GEMMs."""
    import torch

    from advisor.energy.runtime import graph_ms

    dispatched = _dispatched(bench, fmt, m)

    def run() -> None:
        for experts, d in dispatched:
            experts.expert_gemms(d)

    with torch.no_grad():
        return graph_ms(run) / len(dispatched)


def experts_touched(bench, m: int) -> float:
    """Distinct experts per MoE layer that :func:`experts_gemm_ms`'s ``m`` tokens read (mean over layers)."""
    import torch

    dispatched = _dispatched(bench, Format.BF16, m)
    return sum(int((torch.diff(d.offs, prepend=d.offs.new_zeros(1)) > 0).sum()) for _, d in dispatched) / len(
        dispatched)


def lm_head_ms(bench, m: int) -> float:
    from advisor.energy.profiling._gemm_timer import gemm_graph_ms
    from advisor.energy.runtime import GroupLinear

    return gemm_graph_ms([GroupLinear(bench.weights.t["lm_head"], Format.BF16, None)], m, Format.BF16)


def measure_model_profile(
    dims,
    batches: tuple[int, ...] = (1, 16, 64),
    contexts: tuple[int, ...] = (512, 2048),
    prefill_lengths: tuple[int, ...] = (512,),
    meter=None,
    bench=None,
    command: str = "",
    log=print,
) -> dict[str, Any]:
    """Measure ``dims``'s profile on the GPU here (the runtime, random weights, the NVML meter), after up to
    the meter's ``soak_s`` of its heaviest decode step back to back (:meth:`EnergyMeter.soak`: points
    metered on a cold GPU come out low)."""
    from advisor.energy.measure import Bench, decode_step, torch_with_gpu, uniform_formats
    from advisor.energy.meter import open_meter
    from advisor.energy.profiling._layer import measurement_header
    from advisor.energy.runtime import copy_bandwidth_gb_s
    from advisor.formats import gpu_from_device_name

    torch = torch_with_gpu()
    t0 = time.perf_counter()
    meter = meter or open_meter(torch.cuda.current_device())
    state = meter.counter.state()
    header = measurement_header(state, meter.idle_power_w(), copy_bandwidth_gb_s(), command, torch.__version__)
    bench = bench or Bench.create(dims, max_pos=max(8192, max(contexts) + 2, max(prefill_lengths) + 1))
    bench.weights.ensure_positions(max(max(contexts) + 2, max(prefill_lengths) + 1))
    rts = {f: bench.runtime(uniform_formats(dims, f)) for f in FORMATS}

    kinds = profile_kinds(dims)

    def gemms(ms: tuple[int, ...]) -> dict:
        return {f.value: {k: [layer_gemm_ms(bench, k, f, m) for m in ms] for k in kinds} for f in FORMATS}

    energy = partial(metered_step, meter)

    dec: dict[str, Any] = {"batches": list(batches), "contexts": list(contexts), "energy_contexts": list(contexts),
                           "gemm_ms": gemms(batches), "lm_head_ms": [lm_head_ms(bench, b) for b in batches],
                           **{key: {} for key in RECORDS}}
    pre: dict[str, Any] = {"batch": 1, "lengths": list(prefill_lengths), "gemm_ms": gemms(prefill_lengths),
                           "lm_head_ms": lm_head_ms(bench, 1), **{key: {} for key in RECORDS}}
    if "experts" in kinds:  # the distinct experts behind each experts GEMM time
        dec["experts_touched"] = [experts_touched(bench, b) for b in batches]
        pre["experts_touched"] = [experts_touched(bench, n) for n in prefill_lengths]
    soak = None
    if meter.config.soak_s > 0:
        step = decode_step(rts[Format.BF16], max(batches), max(contexts))
        soak = meter.soak(step.launch, meter.config.soak_s)
        del step
        rts[Format.BF16].free()
        log(f"profile {dims.family}: GPU at {soak['to_c']:.0f} C after {soak['seconds']:.0f} s of decode steps "
            f"(from {soak['from_c']:.0f} C)")
    for f in FORMATS:
        plan_dec, plan_pre = measure_plan(rts[f], f.value, batches, contexts, prefill_lengths, energy, log,
                                           dims.family)
        for key in plan_dec:  # per-format tables
            dec[key][f.value], pre[key][f.value] = plan_dec[key], plan_pre[key]
    rt = bench.runtime({g: corner_format(g) for g in uniform_formats(dims, Format.BF16)})
    dec[MLP_FP8], pre[MLP_FP8] = measure_plan(rt, MLP_FP8, batches, contexts, prefill_lengths, energy, log,
                                               dims.family)
    rt.free()
    # the mixing point bends prefills only (model_costmodel): no decode steps of it are metered
    rt = bench.runtime({g: mixing_format(g) for g in uniform_formats(dims, Format.BF16)})
    _, pre[ALT_FP8] = measure_plan(rt, ALT_FP8, (), contexts, prefill_lengths, energy, log, dims.family)
    rt.free()
    # the position point prices which layers a decode step holds in FP8 (model_costmodel): no prefill of it
    n = len(dims.layers)
    rt = bench.runtime({g: last_quarter_format(g, n) for g in uniform_formats(dims, Format.BF16)})
    dec[LAST_QUARTER_FP8], _ = measure_plan(rt, LAST_QUARTER_FP8, batches, contexts, (), energy, log, dims.family)
    rt.free()
    kind = gpu_from_device_name(state.name)
    dims_dict = dims.to_dict()
    return {
        "schema": SCHEMA,
        "version": VERSION,
        **header,
        "key": profile_key(state, dims_dict),
        "gpu_kind": kind.value if kind else None,
        "runtime": RUNTIME_VERSION,
        "formats": [f.value for f in FORMATS],
        "model": dims_dict,
        "decode": dec,
        "prefill": pre,
        "soak": soak,
        "profile_seconds": time.perf_counter() - t0,
        "measured_at": time.time(),
    }


def metered_step(meter, step, label: str) -> dict[str, float]:
    """``step`` through ``meter``: J/step, W, s/step, window CV and the GPU's mean temperature (the records a
    profile keeps of each point, :data:`RECORDS`)."""
    m = meter.measure(step.launch, label, step.tokens_per_step)
    return {"j": m.j_per_step, "w": m.power_w, "s": m.s_per_step, "cv": m.cv,
            "t": (m.gpu_before.temperature_c + m.gpu_after.temperature_c) / 2}


def measure_plan(rt, name: str, batches, contexts, prefill_lengths, energy, log,
                  family: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Time and meter ``rt``'s decode steps (each batch and context) and prefills: (decode, prefill) records,
    ``{record: {context: [per batch]}}`` and ``{record: [per prompt length]}``."""
    from advisor.energy.measure import decode_step, prefill_step
    from advisor.energy.runtime import release_cuda_memory

    dec: dict[str, Any] = {key: {str(c): [] for c in contexts} for key in RECORDS}
    pre: dict[str, Any] = {key: [] for key in RECORDS}
    for b in batches:
        for c in contexts:
            step = decode_step(rt, b, c)
            _append({key: v[str(c)] for key, v in dec.items()}, step.time_ms(),
                    energy(step, f"profile decode {name} b{b} c{c}"))
            del step
            rt.free()
        release_cuda_memory()
        log(f"profile {family} decode {name} b{b}: "
            + ", ".join(f"c{c} {dec['step_ms'][str(c)][-1]:.3f} ms {dec['power_w'][str(c)][-1]:.0f} W"
                        for c in contexts))
    for length in prefill_lengths:
        step = prefill_step(rt, length)
        _append(pre, step.time_ms(), energy(step, f"profile prefill {name} L{length}"))
        del step
        rt.free()
        release_cuda_memory()
    return dec, pre


def _append(records: dict[str, list], step_ms: float, e: dict[str, float]) -> None:
    # the GPU's temperature (mean of before and after) moves a small model's J/step
    # (reports/benchmarks/energy_transfer_data/h100_thermal.json)
    for key, v in (("step_ms", step_ms), ("j_per_step", e["j"]), ("power_w", e["w"]),
                   ("meter_ms_per_step", e["s"] * 1e3), ("cv", e["cv"]), ("temperature_c", e["t"])):
        records[key].append(v)
