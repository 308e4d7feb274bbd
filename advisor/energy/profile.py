"""Hardware profiles: per-format layer costs measured once on a GPU, saved as versioned JSON.

A profile (schema ``precision-advisor/energy-profile``, version 1) holds, for one
GPU and one model shape (Llama-3.1-8B by default):

* ``decode.gemm_ms[fmt][kind]``: time of ONE layer's GEMM of each kind (qkv, o,
  gate_up, down) at each decode batch, from CUDA-graph replays of all layers' GEMMs
  of that kind (distinct weights, so the L2 cache does not help);
* ``decode.step_ms[fmt][context][i]``: the whole decode step of the all-``fmt``
  plan at each batch and context; the step minus its GEMMs is the non-GEMM part
  (attention, norms, rope, quantization, lm_head, gaps);
* ``decode.power_w[fmt][i]``: the step's mean power from the NVML meter at the
  batches in ``decode.energy_batches``;
* ``prefill``: the same per prompt length (batch 1).

Reading and the cost model need no torch; measuring (``measure_profile``) does.
"""

from __future__ import annotations

import json
import time
from importlib import resources
from pathlib import Path
from typing import Any

from advisor.errors import InputError
from advisor.files import check_regular_file
from advisor.formats import GPU, Format
from advisor.plan import DENSE_GROUP_KINDS

SCHEMA = "precision-advisor/energy-profile"
VERSION = 1
KINDS = DENSE_GROUP_KINDS


def measurement_header(state: Any, idle_w: float, copy_bw_gb_s: float, command: str, torch_version: str) -> dict:
    """What every measured file records about where and how it was measured."""
    return {
        "gpu": state.name,
        "gpu_uuid": state.uuid,
        "driver": state.driver,
        "power_limit_w": state.power_limit_w,
        "idle_power_w": idle_w,
        "copy_bandwidth_gb_s": copy_bw_gb_s,
        "date": time.strftime("%Y-%m-%d"),
        "command": command,
        "torch": torch_version,
    }


def validate_profile(data: dict[str, Any], origin: str = "profile") -> dict[str, Any]:
    if data.get("schema") != SCHEMA or data.get("version") != VERSION:
        raise InputError(
            f"{origin} is not an energy profile of schema {SCHEMA} version {VERSION} "
            f"(got {data.get('schema')!r} version {data.get('version')!r})"
        )
    for key in ("gpu", "gpu_kind", "driver", "date", "command", "model", "decode", "prefill", "formats"):
        if key not in data:
            raise InputError(f"{origin} lacks the field {key!r}")
    return data


def load_profile(path: Path | str) -> dict[str, Any]:
    check_regular_file(path, "profile", "give a profile JSON written by `advisor profile`")
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError(f"cannot read profile {path}: {exc.strerror}; give a profile JSON written by "
                         "`advisor profile` (or leave energy_profile unset)") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InputError(f"profile {path} is not JSON ({exc}); give a profile JSON written by "
                         "`advisor profile`") from None
    return validate_profile(data, f"profile {path}")


def shipped_profile(gpu: GPU) -> dict[str, Any] | None:
    """The profile shipped in advisor/profiles/ for ``gpu`` (newest), or None."""
    folder = resources.files("advisor.energy") / "profiles"
    try:
        names = sorted(
            p.name for p in folder.iterdir()
            if p.name.startswith(f"{gpu.value}_") and p.name.endswith(".json") and "_gemm_" not in p.name
        )  # <gpu>_gemm_<date>.json are GPU profiles (energy.gemm_table), not layer profiles
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not names:
        return None
    return validate_profile(json.loads((folder / names[-1]).read_text()), f"shipped profile {names[-1]}")


# -- measuring (GPU) ---------------------------------------------------------------


def _gemm_ms(bench, kind: str, fmt: Format, m: int, iters: int = 20) -> float:
    """Time of one layer's ``kind`` GEMM at ``m`` rows, from a graph over all layers."""
    import torch

    from advisor.energy.cuda_tools import graph_ms

    lins = [bench.linear_cache[(f"{i}.{kind}", fmt)] for i in range(bench.dims.num_layers)]
    k = lins[0].in_features
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    if fmt == Format.FP8:
        x = (x * 4).clamp(-448, 448).to(torch.float8_e4m3fn)

    def run() -> None:
        for lin in lins:
            lin(x)

    return graph_ms(run, iters) / len(lins)


def measure_profile(
    command: str,
    batches: tuple[int, ...] = (1, 8, 16, 32, 64, 128),
    energy_batches: tuple[int, ...] = (1, 16, 64, 128),
    contexts: tuple[int, ...] = (512, 2048),
    prefill_lengths: tuple[int, ...] = (512, 2048),
    meter_config=None,
    bench=None,
    log=print,
) -> dict[str, Any]:
    """Measure a profile of the Llama-3.1-8B shape on the GPU here (several minutes)."""
    from advisor.energy.measure import torch_with_gpu

    torch = torch_with_gpu()
    from advisor.energy.cuda_tools import copy_bandwidth_gb_s
    from advisor.energy.dims import DecoderDims
    from advisor.energy.measure import Bench, decode_step, prefill_step, uniform_formats
    from advisor.energy.meter import open_meter

    meter = open_meter(torch.cuda.current_device(), meter_config)
    state = meter.counter.state()
    idle_w = meter.idle_power_w()
    bw = copy_bandwidth_gb_s()
    dims = bench.dims if bench is not None else DecoderDims.llama31_8b()
    bench = bench or Bench.create(dims)
    fmts = (Format.BF16, Format.FP8)
    rts = {f: bench.runtime(uniform_formats(dims, f), key=f"all-{f.value}") for f in fmts}

    def gemms(ms: tuple[int, ...]) -> dict:
        return {f.value: {k: [_gemm_ms(bench, k, f, m) for m in ms] for k in KINDS} for f in fmts}

    decode: dict[str, Any] = {
        "batches": list(batches),
        "contexts": list(contexts),
        "energy_batches": list(energy_batches),
        "gemm_ms": gemms(batches),
        "step_ms": {},
        "power_w": {},
        "j_per_step": {},
    }
    for f in fmts:
        rt = rts[f]
        decode["step_ms"][f.value] = {}
        for c in contexts:
            times = []
            for b in batches:
                times.append(decode_step(rt, b, c).time_ms())
            decode["step_ms"][f.value][str(c)] = times
            log(f"profile decode {f.value} ctx {c}: " + ", ".join(f"{t:.2f}" for t in times) + " ms")
        powers, joules = [], []
        for b in energy_batches:
            step = decode_step(rt, b, contexts[0])
            m = meter.measure(step.launch, f"profile decode {f.value} b{b}", b)
            powers.append(m.power_w)
            joules.append(m.j_per_step)
            log(f"profile decode {f.value} b{b}: {m.power_w:.0f} W, {m.s_per_step * 1e3:.2f} ms, cv {m.cv:.4f}")
            del step
        decode["power_w"][f.value] = powers
        decode["j_per_step"][f.value] = joules
        rt.k_cache = rt.v_cache = None
        torch.cuda.empty_cache()

    prefill: dict[str, Any] = {
        "batch": 1,
        "lengths": list(prefill_lengths),
        "gemm_ms": gemms(prefill_lengths),
        "step_ms": {},
        "power_w": {},
        "j_per_step": {},
    }
    for f in fmts:
        rt = rts[f]
        times, powers, joules = [], [], []
        for length in prefill_lengths:
            step = prefill_step(rt, length)
            times.append(step.time_ms())
            m = meter.measure(step.launch, f"profile prefill {f.value} L{length}", length)
            powers.append(m.power_w)
            joules.append(m.j_per_step)
            log(f"profile prefill {f.value} L{length}: {times[-1]:.2f} ms, {m.power_w:.0f} W, cv {m.cv:.4f}")
            del step
        prefill["step_ms"][f.value] = times
        prefill["power_w"][f.value] = powers
        prefill["j_per_step"][f.value] = joules
        rt.k_cache = rt.v_cache = None
        torch.cuda.empty_cache()

    from advisor.formats import gpu_from_device_name

    kind = gpu_from_device_name(state.name)
    return {
        "schema": SCHEMA,
        "version": VERSION,
        **measurement_header(state, idle_w, bw, command, torch.__version__),
        "gpu_kind": kind.value if kind else None,
        "source": "measured",
        "verified": True,
        "formats": [f.value for f in fmts],
        "model": {"name": "Llama-3.1-8B shape, random weights", **dims.summary()},
        "decode": decode,
        "prefill": prefill,
    }


def save_profile(profile: dict[str, Any], path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile, indent=1))
    return path
