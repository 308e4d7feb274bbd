"""How many GPUs of this node one vLLM engine spreads a model over (``--gpus N``, the recipe's ``gpus``): vLLM's
tensor parallelism over torch's ``cuda:0`` .. ``cuda:{N-1}``, all of them metered.

``--gpus`` means one thing in every command: the GPUs of one node a model is spread over. With `advisor search
--dry-run` it names the node the memory plan is made for; where vLLM serves (the measured tier of `advisor search
--engine vllm`, `advisor measure`, `verify` and `recheck --engine vllm`) it is the engine's tensor-parallel size.
Unset, serving takes the fewest GPUs that hold the served weights and the largest workload's KV cache within the
engine's memory share, among the counts vLLM accepts (those that divide the attention heads).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from advisor.errors import InputError, SetupError
from advisor.models.shape import ModelShape
from advisor.recipe.schema import Workload

GIB = 2**30
#: the share of each GPU's memory the engine takes (vLLM's gpu_memory_utilization, ServeJob's default)
SERVE_MEMORY_SHARE = 0.85
#: CUDA context, CUDA graphs and activations kept outside weights and KV cache on every GPU (an estimate)
SERVE_RESERVE_BYTES = 4 * GIB


def bf16_weight_bytes(shape: ModelShape) -> int:
    """The all-BF16 checkpoint's weights (the largest plan a run serves): searched groups, lm_head, routers and,
    untied, the embeddings."""
    embeddings = 0 if shape.tied_embeddings else shape.vocab_size * shape.hidden_size
    return 2 * (shape.quantizable_weights + shape.lm_head_weights + shape.router_weights + embeddings)


def checkpoint_bytes(folder: Path) -> int:
    """The weights of an exported checkpoint: its safetensors files."""
    return sum(f.stat().st_size for f in Path(folder).glob("*.safetensors"))


def kv_budget_bytes(shape: ModelShape, workloads: Sequence[Workload]) -> int:
    """The KV cache of the largest workload: every sequence of its batch at its full length, BF16."""
    return int(max((w.batch_size * shape.kv_bytes(w.input_tokens + w.output_tokens) for w in workloads), default=0))


def fewest_gpus(weight_bytes: int, kv_bytes: int, gpu_bytes: int, heads: int, most: int) -> int | None:
    """The fewest of up to ``most`` GPUs of ``gpu_bytes`` each, dividing ``heads``, whose shares hold the weights and
    the KV cache; None when no such count does."""
    room = SERVE_MEMORY_SHARE * gpu_bytes - SERVE_RESERVE_BYTES
    for n in range(1, most + 1):
        if heads % n == 0 and room > 0 and (weight_bytes + kv_bytes) / n <= room:
            return n
    return None


def visible_gpus() -> tuple[int, int]:
    """(GPUs torch sees, the memory of ``cuda:0`` in bytes); (0, 0) without one."""
    import torch

    if not torch.cuda.is_available():
        return 0, 0
    return torch.cuda.device_count(), int(torch.cuda.get_device_properties(0).total_memory)


def serving_gpus(requested: int | None, heads: int, weight_bytes: int, kv_bytes: int, flag: str = "--gpus") -> int:
    """The engine's GPU count: ``requested`` where given (a divisor of ``heads``, no more than are visible), else
    the fewest that hold the model (module doc). InputError (exit 2) for a count vLLM refuses, SetupError (exit 3)
    where this node has too few GPUs."""
    count, memory = visible_gpus()
    if requested is not None:
        if requested < 1 or heads % requested:
            divisors = ", ".join(str(n) for n in range(1, heads + 1) if heads % n == 0 and n <= 64)
            raise InputError(f"{flag} {requested}: vLLM splits the model's {heads} attention heads evenly over the "
                             f"GPUs; give one of {divisors}")
        if requested > count:
            raise SetupError(f"{flag} {requested}: torch sees {count} GPU(s) here (CUDA_VISIBLE_DEVICES limits them); "
                             f"give {flag} {max(count, 1)} or fewer, or run on a node with {requested} GPUs")
        return requested
    if count <= 1:
        return 1
    n = fewest_gpus(weight_bytes, kv_bytes, memory, heads, count)
    if n is None:
        need = math.ceil((weight_bytes + kv_bytes) / GIB)
        raise SetupError(f"the served model ({need} GiB of weights and KV cache) fits no count of the {count} GPUs "
                         f"of {memory / GIB:.0f} GiB here that divides its {heads} attention heads; serve on a larger "
                         f"node, or give {flag} N to try anyway")
    return n


def serving_gpus_for(requested: int | None, shape: ModelShape, workloads: Sequence[Workload],
                     weight_bytes: int | None = None, flag: str = "--gpus") -> int:
    """:func:`serving_gpus` for ``shape`` serving ``workloads`` (weights: ``weight_bytes``, else all-BF16's)."""
    weights = bf16_weight_bytes(shape) if weight_bytes is None else weight_bytes
    return serving_gpus(requested, shape.num_attention_heads, weights, kv_budget_bytes(shape, workloads), flag)


#: left free beside an engine started next to this process's own GPU memory (its CUDA context grows with it)
ENGINE_HEADROOM_BYTES = 2 * GIB
#: below this share of a GPU an engine holds too little beside the weights to be worth starting
MIN_ENGINE_SHARE = 0.1


def total_gpu_bytes() -> int:
    """``cuda:0``'s memory in bytes (0 without a GPU)."""
    import torch

    return torch.cuda.mem_get_info(0)[1] if torch.cuda.is_available() else 0


def free_gpu_bytes() -> int:
    """What is free on ``cuda:0`` once this process has handed back what it no longer uses (0 without a GPU)."""
    import torch

    if not torch.cuda.is_available():
        return 0
    release_gpu_memory()
    return torch.cuda.mem_get_info(0)[0]


def release_gpu_memory() -> None:
    """What this process no longer uses on its GPUs handed back to the driver, for an engine in another process
    that sizes its cache from what is free: garbage first (quantized copies hold reference cycles), then torch's
    cached blocks."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def engine_memory_share(gpus: int, share: float = SERVE_MEMORY_SHARE, first: int = 0) -> float:
    """vLLM's ``gpu_memory_utilization`` for an engine started now on ``cuda:{first}`` .. ``cuda:{first+gpus-1}``:
    ``share``, or less where this process holds part of a GPU (a search's model and bank, an export), since vLLM
    refuses to start when a GPU's free memory is below its share. SetupError (exit 3) when too little is left."""
    import torch

    if not torch.cuda.is_available():
        return share
    release_gpu_memory()  # what this process holds, cached blocks too, counts as used for the engine's process
    for i in range(first, min(first + gpus, torch.cuda.device_count())):
        free, total = torch.cuda.mem_get_info(i)
        room = (free - ENGINE_HEADROOM_BYTES) / total
        if room < MIN_ENGINE_SHARE:
            raise SetupError(f"vLLM cannot start beside this process on cuda:{i}: {free / GIB:.1f} of "
                             f"{total / GIB:.0f} GiB are free (the rest holds the search's model and bank); serve "
                             "the run afterwards with `advisor verify RUN_DIR --engine vllm`, or use more GPUs")
        share = min(share, room)
    return share


def gpus_label(gpus: int) -> str:
    """The GPUs of a measurement, for its label: the name of every one (``4x NVIDIA H100 80GB HBM3``) and the
    driver; their states read through NVML."""
    from advisor.energy import meter

    state = meter.NvmlDevice(0).state() if gpus == 1 else meter.open_gpus_counter(gpus).state()
    return f"{state.name}, driver {state.driver}"


#: an engine's CUDA context, CUDA graphs and the activations of its profile run (a chunk of 16k tokens) beside its
#: weights and KV pool, where nothing measures them first: an 8B's were 1.8 GiB of activations and 0.6 GiB of graphs
#: on an H200 (vLLM 0.26.0's log, reports/benchmarks/verify_time_data/round5)
EARLY_ENGINE_RESERVE_BYTES = 8 * GIB
#: vLLM's KV blocks hold this many tokens each: a sequence takes whole blocks
KV_BLOCK_TOKENS = 16


def engine_beside(shape: ModelShape, batch: int, longest: int, beside_bytes: int, free_bytes: int | None = None
                  ) -> tuple[float, int] | None:
    """(gpu_memory_utilization, kv_cache_memory_bytes) of an engine (all-BF16's weights at most) for ``batch``
    sequences of ``longest`` tokens started on ``cuda:0`` while this process still needs ``beside_bytes`` more than
    it holds (an export's working set), where both fit in ``free_bytes`` (what is free now where not given: the
    other engines started meanwhile have taken theirs out of it) with :data:`ENGINE_HEADROOM_BYTES` to spare; None
    where they do not, or without a GPU. The KV pool is sized, not profiled: vLLM's memory profile assumes no other
    process changes its GPU memory while it runs."""
    import torch

    if not torch.cuda.is_available():
        return None
    kv = int(1.1 * batch * -(-longest // KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS * shape.kv_bytes_per_token()) + GIB
    need = bf16_weight_bytes(shape) + kv + EARLY_ENGINE_RESERVE_BYTES
    free = free_gpu_bytes() if free_bytes is None else free_bytes
    total = total_gpu_bytes()
    if need + beside_bytes + ENGINE_HEADROOM_BYTES > free:
        return None
    return min(SERVE_MEMORY_SHARE, need / total), kv
