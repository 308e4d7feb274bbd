"""One vLLM engine serving one exported checkpoint: what runs inside the child process of
:mod:`advisor.deploy.vllm._engine` (vLLM keeps its GPU memory after ``del llm``, so every engine
gets a process of its own).

:func:`serve` loads the checkpoint with vLLM's offline ``LLM`` API (prefix caching off, sized for
the job's largest workload) and does what the job asks, returning plain data:

* ``served``: per linear layer of the loaded model, the quantization method vLLM built for it
  (``layer.quant_method``, read through ``LLM.apply_model``) and the checkpoint's modules it packs
  (``packed_modules_mapping``: ``qkv_proj`` holds ``q_proj``/``k_proj``/``v_proj``);
* ``served_kl``: KL(the reference || vLLM) over the whole vocabulary on the held-out sequences, against the
  reference's log-probabilities the job names (:mod:`advisor.deploy.vllm._served_kl`);
* ``items``: for each (context, target) item, whether every target token was vLLM's top-1
  next token (greedy, as LAMBADA's accuracy is defined), from vLLM's prompt log-probabilities;
* ``energy``: per workload, J per output token (prefill included, summed over every GPU the engine uses:
  ``tensor_parallel_size`` > 1 spreads the model over torch's ``cuda:0..N-1``) in steady state
  (:class:`~advisor.deploy.vllm._load.SteadyLoad` under the advisor's own NVML meter), the time per output
  token and to the first token of the requests that ran wholly inside that steady load (p50 and p90), and J
  per input token of prefill.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.deploy.checkpoint import capture_bound, graph_sizes_for, weight_formats_from_quant_config
from advisor.deploy.serving_gpus import SERVE_MEMORY_SHARE
from advisor.deploy.vllm._load import meter_workload, static_heap
from advisor.deploy.vllm._progress import metering_line, say, start_words, watch_output
from advisor.deploy.vllm._served_kl import served_kl
from advisor.energy.meter import EnergyCounter, MeterConfig
from advisor.errors import SetupError
from advisor.formats import GPU
from advisor.models.config_fields import has_routed_experts, raw_config
from advisor.serving import vllm_kernels

#: Each engine process's environment, unless the user set these. Every request the advisor sends is greedy
#: (temperature 0), and vLLM's sampler never uses FlashInfer's top-k/top-p for a greedy request
#: (vllm/v1/worker/gpu/sample/sampler.py); its start-up warm-up still runs every sampling feature, which builds
#: FlashInfer's sampling kernels with nvcc on a machine without their cache (reports/benchmarks/verify_time.md).
#: Triton's cache: vLLM's AOT compile points Inductor's cache at a folder of each plan's own (vllm/compilation/
#: decorators.py), and Inductor then points Triton's there too where it is unset (torch/_inductor/runtime/
#: triton_heuristics.py), so every plan's engine built vLLM's own Triton kernels (its sampler's, its input
#: preparation's) again in its warm-up. Triton's own default folder, shared by every engine and run.
ENGINE_ENV = {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1",  # apply_model sends a function
              "VLLM_USE_FLASHINFER_SAMPLER": "0",
              "TRITON_CACHE_DIR": str(Path.home() / ".triton" / "cache")}


@dataclass(frozen=True)
class ServeJob:
    """What one child process does with one checkpoint. Plain data: it crosses a process boundary."""

    checkpoint: str
    vocab_size: int
    workloads: tuple[dict[str, Any], ...] = ()  # Workload.model_dump() each, for energy
    sequences: tuple[tuple[int, ...], ...] = ()  # held-out token sequences, for the served KL
    reference_logprobs: str = ""  # the reference's log-probabilities on them (served_kl.write_reference)
    items: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()  # (context, target) token ids
    formats: bool = True
    prefill: bool = True  # also measure prefill J per input token (requests of one output token)
    no_prefill: tuple[str, ...] = ()  # workloads whose prefill is not measured (operating batches beside stated ones)
    meter: dict[str, Any] = field(default_factory=dict)  # MeterConfig fields
    gpu_memory_utilization: float = SERVE_MEMORY_SHARE
    seed: int = 0
    llm_options: dict[str, Any] = field(default_factory=dict)  # extra LLM(...) keyword arguments
    # serve as the export's vllm_config.yaml asks (exported_options); a key in llm_options wins. False: vLLM's
    # own defaults
    as_exported: bool = True
    # GPUs the engine spreads the model over (vLLM's tensor parallelism): torch's cuda:0..N-1, all metered
    tensor_parallel_size: int = 1
    max_batch: int = 0  # size the engine for at least this many in flight (later rounds of `serve(more=...)`)
    # capture CUDA graphs only for the token counts the job's steady loads run (graph_sizes_for): the same graphs
    # those steps would run under the export's bound, fewer captured. False: every size up to the bound
    needed_graphs_only: bool = True
    # the GPUs the engine's process sees (CUDA_VISIBLE_DEVICES entries, GPU-<uuid>); empty: this process's
    devices: tuple[str, ...] = ()
    # started while the parent still works on the GPU (verify's exports): the engine starts and scores, then meters
    # only once ``more({})`` answers (with the first round's workloads)
    hold: bool = False
    # vLLM's kv_cache_memory_bytes (0: vLLM sizes the KV cache from a memory profile, which assumes no other process
    # changes its GPU memory meanwhile; an engine started beside the exports gets a pool of this size instead)
    kv_cache_bytes: int = 0


# ----------------------------------------------------------------------------------- what vLLM built
def _layer_methods(model: Any) -> dict[str, dict[str, Any]]:
    """Runs inside vLLM's worker (``apply_model``): per linear layer, its quant method's class and the
    checkpoint modules it packs."""
    packed = getattr(model, "packed_modules_mapping", {}) or {}
    out = {}
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None or not hasattr(module, "weight") and not hasattr(module, "weight_packed"):
            continue
        prefix, _, leaf = name.rpartition(".")
        parts = packed.get(leaf)
        members = [f"{prefix}.{p}" if prefix else p for p in parts] if parts else [name]
        out[name] = {"method": type(method).__name__, "members": members}
    return out


def served_methods(llm: Any) -> dict[str, dict[str, Any]]:
    return llm.apply_model(_layer_methods)[0]


# ----------------------------------------------------------------------------------- log-probabilities
def _topk(position: dict[int, Any] | None) -> list[tuple[int, float, int]]:
    if not position:
        return []
    return [(int(tok), float(lp.logprob), int(lp.rank or 0)) for tok, lp in position.items()]


def prompt_logprobs(vllm: Any, llm: Any, sequences: Any, top_k: int) -> list[list[list[tuple[int, float, int]]]]:
    """Per sequence, per position after the first: [(token id, log-prob, rank)] of vLLM's top-k and of the
    token that followed (vLLM adds it when it is not in the top-k)."""
    params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=top_k, temperature=0.0, detokenize=False)
    prompts = [{"prompt_token_ids": list(s)} for s in sequences]
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [[_topk(p) for p in list(o.prompt_logprobs or [None])[1:]] for o in outs]


def greedy_hits(vllm: Any, llm: Any, items: Any) -> list[bool]:
    """Per (context, target) item: every target token was vLLM's top-1 next token."""
    seqs = [tuple(c) + tuple(t) for c, t in items]
    per_seq = prompt_logprobs(vllm, llm, seqs, 1)
    hits = []
    for (context, target), positions in zip(items, per_seq, strict=True):
        start = len(context) - 1  # positions[i] predicts token i + 1
        ok = True
        for j, tok in enumerate(target):
            entry = {t: r for t, _, r in positions[start + j]}
            ok = ok and entry.get(int(tok)) == 1
        hits.append(ok)
    return hits


# ----------------------------------------------------------------------------------- the job
def exported_options(checkpoint: str, batch: int, prompt: int, batches: Sequence[int] = ()) -> dict[str, Any]:
    """What the export's ``vllm_config.yaml`` asks of vLLM (:mod:`advisor.deploy.checkpoint._vllm_config`), as
    ``vllm.LLM`` keywords for an engine of ``batch`` requests and ``prompt``-token prompts: CUDA graphs for the
    steps where a prefill joins the decode batch, and the FP8 GEMM and MoE backends for the checkpoint's formats
    and experts on this GPU. With ``batches`` (the steady loads the engine will run), only the graphs their steps
    use are captured."""
    qpath = Path(checkpoint) / "hf_quant_config.json"
    formats = weight_formats_from_quant_config(json.loads(qpath.read_text()) if qpath.is_file() else None)
    bound = capture_bound(batch, prompt)
    graphs: dict[str, Any] = {"max_cudagraph_capture_size": bound}
    if batches:
        graphs = {"cudagraph_capture_sizes": list(graph_sizes_for(batches, prompt, bound))}
    moe = has_routed_experts(raw_config(checkpoint))
    return {"compilation_config": graphs, **vllm_kernels(formats, gpu_kind(), moe)}


def job_batches(job: ServeJob) -> tuple[int, ...]:
    """The batches ``job``'s steady loads may run: its workloads', and, where later rounds may ask for more
    (``max_batch``: a batch search below it), every batch up to it; ``()`` (every graph) where the job asks for
    them all or runs no steady load."""
    if not job.needed_graphs_only or not (job.workloads or job.max_batch):
        return ()
    batches = {w["batch_size"] for w in job.workloads} | set(range(1, job.max_batch + 1))
    return tuple(sorted(batches | {1}))  # batch 1: a prefill metering's load


def gpu_kind() -> GPU | None:
    """The kind of this machine's GPUs (NVML; None without one, or one the advisor does not know)."""
    from advisor.energy.prediction import gpu_here

    return gpu_here()[0]


def host_facts() -> dict[str, Any]:
    """The host CPU the engine's own steps run on, how busy it is, and the torch and CUDA builds under the engine's
    kernels: an engine whose GPU step is short (FP8) moved up to 34% between two H200 hosts where BF16 moved 3%
    (reports/benchmarks/verify_time.md, round 4), so rounds are compared with these in view."""
    import torch

    cpu = ""
    with contextlib.suppress(OSError):
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "")
    return {"cpu": cpu or platform.processor() or "unknown", "cpus": os.cpu_count(), "load_1m": load_1m(),
            "torch": torch.__version__, "cuda": torch.version.cuda}


def load_1m() -> float | None:
    """The host's one-minute load average (None where the system does not say)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def cpu_ticks() -> tuple[int, int] | None:
    """(ticks stolen from this machine by its hypervisor, all ticks) over all CPUs since boot (/proc/stat), or None
    where the file does not say: a virtual machine whose neighbours take its CPUs slows a host-bound engine."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return ticks[7], sum(ticks)


def steal_pct(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round(100.0 * (after[0] - before[0]) / (after[1] - before[1]), 2)


def engine_sizes(job: ServeJob) -> tuple[int, int]:
    """(max_num_seqs, max_model_len) of the engine serving ``job``: its largest batch (or ``max_batch``, the later
    rounds'), and its longest request (a sequence scored by its prompt log-probabilities is a prompt of one output
    token)."""
    longest = max([w["input_tokens"] + w["output_tokens"] for w in job.workloads]
                  + [len(s) + 1 for s in job.sequences] + [len(c) + len(t) + 1 for c, t in job.items] + [16])
    batch = max([w["batch_size"] for w in job.workloads] + ([job.max_batch] if job.max_batch else []) or [16])
    return batch, longest


def serve(job: ServeJob, make_counter: Callable[[], EnergyCounter] | None = None,
          more: Callable[[dict[str, Any]], Sequence[dict[str, Any]]] | None = None,
          make_busy: Callable[[], Callable[[], float | None]] | None = None,
          make_others: Callable[[], Callable[[], float | None] | None] | None = None) -> dict[str, Any]:
    """Load ``job.checkpoint`` in vLLM and return what the job asks for (module docstring). The energy is that of
    every GPU the engine uses (``make_counter``; default: the first ``tensor_parallel_size`` GPUs' NVML counters,
    summed), and so is the utilization each row states (``make_busy``; default: that counter's GPUs' through NVML,
    none for a counter that is not NVML's), and how busy the host's other GPUs were (``make_others``; default: the
    busiest of the GPUs NVML sees beside the counter's). ``more`` (the energy rows so far -> the next workloads, none
    to stop) meters further rounds of workloads in the same engine."""
    from advisor.energy.meter import gpus_busy, open_gpus_counter, other_gpus_busy, summed_config

    for name, value in ENGINE_ENV.items():  # a user's own setting stands
        os.environ.setdefault(name, value)
    tp = job.tensor_parallel_size
    if tp > 1:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off on the lent machines (their notes)
    import vllm

    batch, longest = engine_sizes(job)
    prompt = max([w["input_tokens"] for w in job.workloads] or [0])
    options = {**(exported_options(job.checkpoint, batch, prompt, job_batches(job)) if job.as_exported else {}),
               **({"kv_cache_memory_bytes": job.kv_cache_bytes} if job.kv_cache_bytes else {}), **job.llm_options}
    t0 = time.perf_counter()
    with watch_output() as start:
        llm = vllm.LLM(model=job.checkpoint, enable_prefix_caching=False, seed=job.seed, max_num_seqs=batch,
                       max_model_len=longest, max_logprobs=-1 if job.reference_logprobs else 1,
                       gpu_memory_utilization=job.gpu_memory_utilization, tensor_parallel_size=tp, **options)
    load_s = time.perf_counter() - t0
    stages = {k: v for k, v in start.items() if not k.endswith("_at")}  # clock times: only for the warm-up
    timings: dict[str, Any] = {"engine_start_s": load_s, "engine_start": stages, "meterings": []}
    say(f"vLLM engine started in {load_s:.0f} s ({start_words(start)})")
    out: dict[str, Any] = {"vllm_version": getattr(vllm, "__version__", "unknown"), "load_s": load_s,
                           "llm_options": options, "max_num_seqs": batch, "tensor_parallel_size": tp,
                           "timings_s": timings, "host": host_facts(),
                           "engine_env": {name: os.environ[name] for name in ENGINE_ENV}}
    if job.formats:
        out["served"] = served_methods(llm)
    if job.sequences and job.reference_logprobs:
        t = time.perf_counter()
        out["served_kl"] = served_kl(vllm, llm, job.sequences, job.reference_logprobs, job.vocab_size, say=say)
        timings["served_kl_s"] = time.perf_counter() - t
        say(f"served KL: {len(job.sequences)} held-out sequences scored in {timings['served_kl_s']:.0f} s "
            f"(read from vLLM's {out['served_kl']['read']})")
    if job.items:
        t = time.perf_counter()
        out["items"] = greedy_hits(vllm, llm, job.items)
        timings["items_s"] = time.perf_counter() - t
    if job.workloads:
        todo = list(job.workloads)
        if job.hold:
            if more is None:
                raise SetupError("a held serving meters only once more({}) answers; none was given")
            say("vLLM engine ready: it meters once the GPU is its alone (this verify's exports, the other engines' "
                "starts and meterings)")
            t = time.perf_counter()
            todo = list(more({}))
            timings["held_s"] = time.perf_counter() - t
        ticks = cpu_ticks()
        counter = make_counter() if make_counter is not None else open_gpus_counter(tp)
        busy = make_busy() if make_busy is not None else gpus_busy(counter)
        others = make_others() if make_others is not None else other_gpus_busy(counter)
        config = summed_config(MeterConfig(**job.meter), tp)
        energy: dict[str, Any] = {}
        loads: dict[tuple[int, int, int, bool], str] = {}  # a load already metered in this engine, by its sizes
        with static_heap() as frozen:
            out["host"]["gc_frozen_objects"] = frozen
            while todo:
                w = todo.pop(0)
                prefill = job.prefill and w["name"] not in job.no_prefill
                key = (w["batch_size"], w["input_tokens"], w["output_tokens"], prefill)
                if key in loads:  # two workloads of one load (objectives stated at the same batch): metered once
                    energy[w["name"]] = {**energy[loads[key]], "same_load_as": loads[key]}
                else:
                    say(metering_line(w, timings["meterings"], len(todo)))
                    energy[w["name"]] = meter_workload(vllm, llm, counter, config, w, job.vocab_size, job.seed,
                                                       prefill, timings["meterings"], busy, others)
                    loads[key] = w["name"]
                if not todo and more is not None:
                    todo = list(more(energy))
        out["energy"] = energy
        out["host"].update(load_1m_after=load_1m(), steal_pct=steal_pct(ticks, cpu_ticks()))
    return out
