"""vLLM-served measurements as rows the vLLM step model is fitted on and checked against: one row per plan, batch
and engine, with how that engine was sized (requests in flight, token budget, CUDA graphs) and which FP8 GEMM
kernel served its FP8 layers.

Readers for the forms this project writes: ``eightb`` (``benchmarks/vllm_verify.py eightb``: each plan's engine
at batch 1, 16, 64), ``verify`` (``advisor verify``'s verify.json: fixed batches and the objectives' batch
searches), ``kept`` (a plan's serving kept by ``advisor verify``, RUN/verify_served/<plan id>.json: every batch it
metered, fixed and searched), ``sweep`` (``benchmarks/device/engine_true_sweep.py``: shapes outside the fit at a
sweep of batches; its file names no GPU or driver: give them) and ``rows`` (this module's own form, a JSON list,
for measurements from elsewhere). A manifest (a JSON list of ``{"path", "format", "key"?, overrides...}``) names
the inputs of one fit.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from advisor.deploy.verification import BUSY_BELOW

#: vLLM 0.26's offline LLM class: max_num_batched_tokens on a GPU of >= 70 GiB (advisor/energy/prediction/_vllm_step.py)
LLM_CLASS_BUDGET = 16384
#: the day advisor's vLLM serving switched its FP8 layers to cuBLASLt on Hopper (reports/benchmarks/vllm_verify.md)
CUBLASLT_SINCE = "2026-11-28"
MIXED_FIRST_BF16_LAYERS = 8  # benchmarks/vllm_verify.py's "mixed" plan: layers 0-7 BF16, the rest FP8


@dataclass
class ServedRow:
    source: str
    gpu: str
    gpu_kind: str
    driver: str
    date: str
    vllm_version: str
    shape: str  # a REFERENCE_SHAPES name
    plan: str  # all-bf16, all-fp8, mixed, or a verify plan's label
    formats: dict[str, str] | None  # group -> format where the plan is not one of the named ones
    fp8_kernel: str | None  # cutlass, cublaslt; None: no FP8 layer
    batch: int
    input_tokens: int
    output_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_capture_size: int | None  # None: vLLM's default bound, min(2 x max_num_seqs, 512)
    j_per_token: float
    tokens_per_s: float
    tpot_ms: float | None
    ttft_ms: float | None
    capture_sizes: list[int] | None = None  # the CUDA-graph sizes where the engine was told which (else the bound)
    # why the row says more of its host than of its GPU (GPU busy under BUSY_BELOW, starved windows); None: it does not
    disturbed: str | None = None
    gpu_busy_pct: float | None = None  # NVML's share of the load's time a kernel ran (kept servings, sweeps)

    @property
    def as_served_now(self) -> bool:
        """Served as the advisor serves FP8 today (cuBLASLt on Hopper), or with no FP8 layer."""
        return self.fp8_kernel != "cutlass"

    @property
    def fittable(self) -> bool:
        """Served as the advisor serves today, with the GPU fed: a disturbed row is a check, never fitted."""
        return self.as_served_now and self.disturbed is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _kind(gpu: str) -> str:
    return next(k for k in ("h100", "h200", "b200") if k in gpu.lower())


def _budget(max_num_seqs: int, max_model_len: int) -> int:
    return min(LLM_CLASS_BUDGET, max_num_seqs * max_model_len)


def _kernel(plan: str, formats: dict[str, str] | None, backend: str | None, date: str) -> str | None:
    """The FP8 GEMM kernel a row's FP8 layers ran: cuBLASLt where the options asked for vLLM's ``torch`` linear
    backend, else vLLM's CUTLASS kernel; a verify.json written before it recorded its options ran CUTLASS before
    the advisor's serving switched to cuBLASLt (:data:`CUBLASLT_SINCE`). None: no FP8 layer."""
    has_fp8 = plan in ("all-fp8", "mixed") or (formats is not None and "fp8" in formats.values())
    if not has_fp8:
        return None
    if backend is not None:
        return "cublaslt" if backend == "torch" else "cutlass"
    return "cutlass" if date < CUBLASLT_SINCE else "cublaslt"


def _dig(data: Any, key: str | None) -> Any:
    for part in (key or "").split("."):
        if part:
            data = data[part]
    return data


def from_eightb(data: dict[str, Any], source: str, shape: str = "Llama-3.1-8B", **over: Any) -> list[ServedRow]:
    """Rows of a ``vllm_verify.py eightb`` result: each plan's engine (one per plan, sized for its largest batch)."""
    inout = {(r["plan"], r["batch"]): (r["input_tokens"], r["output_tokens"]) for r in data.get("rows", [])}
    out: list[ServedRow] = []
    for plan, served in data["vllm"].items():
        options = served.get("llm_options") or {}
        capture = (options.get("compilation_config") or {}).get("max_cudagraph_capture_size")
        batches = {k: int(k.removeprefix("b")) for k in served["energy"]}
        seqs = max(batches.values())
        for key, e in served["energy"].items():
            m, b = e["measurement"], batches[key]
            lin, lout = inout.get((plan, b), (512, 256))
            date = over.get("date", m["date"])
            out.append(ServedRow(
                source, m["gpu_before"]["name"], _kind(m["gpu_before"]["name"]),
                over.get("driver", m["gpu_before"]["driver"]), date, served["vllm_version"], shape, plan, None,
                _kernel(plan, None, options.get("linear_backend", "vllm's own"), date), b, lin, lout, seqs,
                _budget(seqs, lin + lout), over.get("max_capture_size", capture), e["j_per_token"],
                e["tokens_per_s"], e.get("tpot_ms_p50"), e.get("ttft_ms_p50")))
    return out


def from_verify(data: dict[str, Any], source: str, recipe: str, shape: str = "Llama-3.1-8B",
                **over: Any) -> list[ServedRow]:
    """Rows of ``advisor verify``'s verify.json: every plan's fixed batches and each batch its objectives' searches
    metered, in one engine per plan sized for the largest of them (the workloads from the run's ``recipe``)."""
    workloads = {w["name"]: w for w in yaml.safe_load(Path(recipe).read_text())["workloads"]}
    out: list[ServedRow] = []
    for p in data["plans"]:
        formats = dict(p["served_formats"])
        points = [(w["workload"], w["batch_size"] if "batch_size" in w else workloads[w["workload"]]["batch_size"],
                   w["vllm_j_per_token"], w["vllm_tokens_per_s"], None, None) for w in p["energy"]]
        for o in p.get("operating", []):
            for t in (o.get("vllm_search") or {}).get("trail", []):
                points.append((o["workload"], t["batch"], t["j_per_token"], t["tokens_per_s"], t["tpot_ms"],
                               t["ttft_ms"]))
        seqs = max(b for _, b, *_ in points)
        backend = (p.get("vllm_options") or {}).get("linear-backend", (p.get("vllm_options") or {}).get(
            "linear_backend"))
        for name, b, j, tps, tpot, ttft in points:
            w = workloads[name]
            lin, lout = w["input_tokens"], w["output_tokens"]
            date = over.get("date", data["date"])
            out.append(ServedRow(
                source, data["gpu"], _kind(data["gpu"]), over.get("driver", "unknown"), date, data["vllm_version"],
                shape, p["label"], formats, over.get("fp8_kernel", _kernel(p["label"], formats, backend, date)),
                b, lin, lout, seqs, _budget(seqs, lin + lout), over.get("max_capture_size"), j, tps, tpot, ttft))
    return out


def from_sweep(data: dict[str, Any], source: str, gpu: str | None = None, driver: str = "unknown",
               **over: Any) -> list[ServedRow]:
    """Rows of ``engine_true_sweep.py``: each shape and plan served once, sized for its largest batch (512 in, 256
    out), with the CUDA-graph sizes it was told to capture, on ``gpu`` (the file names it since the objectives'
    searches joined the sweep; ``--gpu-name`` for older files)."""
    gpu = gpu or data.get("gpu")
    if not gpu:
        raise ValueError(f"{source} names no GPU: give it (--gpu-name)")
    out: list[ServedRow] = []
    for r in data["rows"]:
        if r.get("error") or not r.get("batches"):
            continue
        options = r.get("llm_options") or {}
        graphs = options.get("compilation_config") or {}
        capture, sizes = graphs.get("max_cudagraph_capture_size"), graphs.get("cudagraph_capture_sizes")
        batches = {k: int(k.removeprefix("b")) for k in r["batches"]}
        seqs = r.get("max_num_seqs") or max(batches.values())
        date = over.get("date", data["date"])
        for key, e in r["batches"].items():
            if e.get("unstable") or not e.get("batch_full", True):
                continue
            out.append(ServedRow(
                source, gpu, _kind(gpu), driver, date, r["vllm_version"], r["shape"], r["plan"], None,
                _kernel(r["plan"], None, options.get("linear_backend", "vllm's own"), date), batches[key], 512, 256,
                seqs, _budget(seqs, 768), over.get("max_capture_size", capture), e["j_per_token"], e["tokens_per_s"],
                e.get("tpot_ms_p50"), e.get("ttft_ms_p50"), sorted(sizes) if sizes else None, disturbance(e),
                e.get("gpu_busy_pct")))
    return out


def from_kept(data: dict[str, Any], source: str, recipe: str, plan: str, formats: dict[str, str] | None = None,
              shape: str = "Llama-3.1-8B", **over: Any) -> list[ServedRow]:
    """Rows of one plan's serving kept by ``advisor verify`` (``verify_served/<plan id>.json``): each metered batch
    (the workloads' fixed batches and every step of the objectives' searches) in the one engine the plan was served
    by, sized for the largest of them with the CUDA graphs it was told to capture. ``plan`` is its label
    (``all-bf16``...) or, with ``formats`` (group -> format), any label."""
    workloads = {w["name"]: w for w in yaml.safe_load(Path(recipe).read_text())["workloads"]}
    served = data["served"]
    check_layers(source, served.get("served") or {}, shape)
    options = served.get("llm_options") or {}
    graphs = options.get("compilation_config") or {}
    sizes = graphs.get("cudagraph_capture_sizes")
    rows = [(name.split(" at batch ")[0], e) for name, e in served["energy"].items()
            if e.get("batch_full", True) and e.get("fewest_inflight") and not e.get("same_load_as")]  # a copy
    seqs = max(e["fewest_inflight"] for _, e in rows)
    out: list[ServedRow] = []
    for workload, e in rows:
        m, w = e["measurement"], workloads[workload]
        lin, lout = w["input_tokens"], w["output_tokens"]
        date = over.get("date", m["date"])
        out.append(ServedRow(
            source, m["gpu_before"]["name"], _kind(m["gpu_before"]["name"]), m["gpu_before"]["driver"], date,
            served["vllm_version"], shape, plan, formats,
            _kernel(plan, formats, options.get("linear_backend", "vllm's own"), date), e["fewest_inflight"], lin,
            lout, seqs, _budget(seqs, lin + lout), graphs.get("max_cudagraph_capture_size"), e["j_per_token"],
            e["tokens_per_s"], e.get("tpot_ms_p50"), e.get("ttft_ms_p50"), sorted(sizes) if sizes else None,
            disturbance(e), e.get("gpu_busy_pct")))
    return out


def check_layers(source: str, modules: dict[str, Any], shape: str) -> None:
    """Exit where the served model's decoder layers (the modules vLLM reported serving) are not ``shape``'s: a
    kept serving names no shape, and one read as another shape's is priced as that shape without a word."""
    indices = {int(m.group(1)) for name in modules if (m := re.search(r"\.layers\.(\d+)\.", name))}
    layers = shape_of(shape)[0].num_layers if indices else None
    if indices and max(indices) + 1 != layers:
        raise SystemExit(f"{source}: vLLM served {max(indices) + 1} decoder layers, the shape {shape} has {layers}: "
                         "name the rows' shape (a manifest entry's \"shape\")")


def disturbance(row: dict[str, Any]) -> str | None:
    """Why a served energy row (a kept serving's or a sweep's) says more of the host than of the GPU: the GPU under
    BUSY_BELOW busy over the load (recorded from verify_time round 5), or windows the meter left out as starved; None
    where neither."""
    busy = row.get("gpu_busy_pct")
    starved = row.get("starved_windows", (row.get("measurement") or {}).get("starved_windows"))  # a sweep's, a kept
    why = ([f"GPU {busy:.0f}% busy"] if busy is not None and busy < BUSY_BELOW else []) \
        + ([f"{starved} starved windows"] if starved else [])
    return ", ".join(why) or None


def from_rows(data: list[dict[str, Any]], source: str) -> list[ServedRow]:
    return [ServedRow(**{**r, "source": r.get("source", source)}) for r in data]


def read_input(path: str, fmt: str | None = None, key: str | None = None, **over: Any) -> list[ServedRow]:
    """One input's rows; ``fmt`` guessed from the data where not given (a list: rows; ``plans``: verify;
    ``vllm``: eightb)."""
    data = _dig(json.loads(Path(path).read_text()), key)
    source = path + (f" [{key}]" if key else "")
    if fmt is None:
        fmt = "rows" if isinstance(data, list) else ("verify" if "plans" in data else "kept" if "served" in data else (
            "sweep" if "vllm" not in data else "eightb"))
    if fmt == "kept" and "formats_from" in over:  # the plan's formats, from a summary.json's trial (FILE:KEY)
        path_, _, key_ = over.pop("formats_from").partition(":")
        over["formats"] = _dig(json.loads(Path(path_).read_text()), key_)
    if fmt == "kept":
        return from_kept(data, source, **over)
    if fmt == "rows":
        return from_rows(data, source)
    if fmt == "verify":
        return from_verify(data, source, **over)
    if fmt == "sweep":
        return from_sweep(data, source, **over)
    return from_eightb(data, source, **over)


def shape_of(name: str) -> tuple[Any, Any]:
    """(ModelShape, transformers config or None) of a row's shape: one of the reference shapes, or one of the
    engine_true_sweep.py shapes (their published configs, built on the meta device)."""
    from advisor.energy.profiling import REFERENCE_SHAPES

    if name in REFERENCE_SHAPES:
        return REFERENCE_SHAPES[name].shape(), None
    import sys

    import torch
    import transformers

    from advisor.models.adapters.geometry import model_shape

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "device"))
    from engine_true_sweep import shape_config

    config = shape_config(name)
    with torch.device("meta"):
        return model_shape(transformers.AutoModelForCausalLM.from_config(config)), config


def read_manifest(path: str) -> list[ServedRow]:
    """Every row a manifest names (its entries: ``path``, ``format``, ``key``, and overrides of the readers)."""
    rows: list[ServedRow] = []
    for entry in json.loads(Path(path).read_text()):
        entry = {k: v for k, v in entry.items() if k != "note"}
        rows += read_input(entry.pop("path"), entry.pop("format", None), entry.pop("key", None), **entry)
    return rows
