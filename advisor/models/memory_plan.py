"""Where a search's bytes go, from the model's config alone, before any weight is read.

The plan counts, per decoder layer, the BF16 weights (searched linears, norms, routers, biases)
and each calibrated format's bank entry at its own width (:mod:`advisor.quantize.packed`: FP8
one byte a weight plus a 256-value table per weight view; NVFP4 half a byte plus one FP8 block
scale per 16 weights and a float32 global scale per view), and the activations of each stage:
calibration batches, the proxy's logits (BF16, their float32 copy and log-softmax: often the
largest item), the sensitivity pass's recorded layer outputs and lm-eval's batches. Layers go to
the devices in order (embeddings first, the final norm, lm_head and the logits on the last),
each device filled before the next, as accelerate's sequential device map does. When they do not
all fit, a streaming plan (:func:`plan_memory` with ``stream=True``) keeps the embeddings, lm_head
and logits and as many layers as fit on the GPUs, with room on the first for one streamed layer at a
time, and the other layers stream from CPU memory (accelerate's offload hooks,
:mod:`advisor.quantize.streamed`). The CPU side holds the proxy's reference log-probs
and, while loading a GGUF file, the whole BF16 model (safetensors are read shard by shard onto the
devices).

Everything here is arithmetic on :mod:`advisor.models.adapters` geometry (torch-free); the sizes
that are estimates (the per-device reserve, the longest lm-eval item) are named constants.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from advisor.models.adapters import adapter_for, expected_group_shapes, text_geometry
from advisor.recipe.schema import MAX_NODE_GPUS, RESERVED_GIB_PER_GPU

GIB = 2**30
BF16_BYTES = 2
FP8_TABLE_BYTES = 256 * BF16_BYTES  # the BF16 value of each of the 256 FP8 codes, per weight view
NVFP4_BLOCK = 16
NVFP4_GLOBAL_SCALE_BYTES = 4  # float32, per weight view
#: CUDA context, cuBLAS workspaces and allocator slack kept free on every device (the recipe refuses a cap below it)
RESERVED_PER_DEVICE = RESERVED_GIB_PER_GPU * GIB
CALIBRATION_BATCH = 8  # calibration.tokens.forward_loop
PROXY_BATCH = 4  # accuracy.proxy.ProxyEvaluator
LM_EVAL_BATCH = 16  # accuracy.harness.score_plan
#: longest lm-eval item assumed (lm-eval pads a batch to its longest item; few-shot prompts stay below this)
LM_EVAL_TOKENS = 1024
#: bytes per weight of the largest view while a bank entry is built: the float32 copy the fold quantizes,
#: the fake quantizer's float32 intermediates and output, and the BF16 result
BUILD_BYTES_PER_WEIGHT = 24
#: weights packed or decoded at a time (whole views: one expert of a fused-experts weight at least)
PACK_CHUNK_WEIGHTS = 1 << 24
#: bytes per weight of the largest member while its entry is built: its own BF16 copy, the BF16 copy NVFP4's
#: block scales are read from, its decoded BF16 check and the comparison's mask
MEMBER_BUILD_BYTES = 3 * BF16_BYTES + 1
MAX_GPUS = MAX_NODE_GPUS


@dataclass(frozen=True)
class RunSizes:
    """The token counts and formats of a run (the recipe's numbers)."""

    formats: tuple[str, ...]
    calibration_samples: int
    calibration_seq: int
    heldout_samples: int
    heldout_seq: int
    sensitivity_samples: int
    lm_eval: bool
    whole_cpu_copy: bool = False  # a GGUF file is read whole into CPU memory; safetensors go shard by shard

    @classmethod
    def from_recipe(cls, recipe: Any) -> RunSizes:
        cal = recipe.calibration
        return cls(tuple(f.value for f in recipe.formats), cal.num_samples, cal.seq_len, cal.heldout_samples,
                   cal.heldout_seq_len, min(recipe.search.sensitivity_samples, cal.heldout_samples),
                   bool(recipe.benchmark.tasks), recipe.model.source.endswith(".gguf") or bool(recipe.model.gguf_file)
                   or recipe.model.source.startswith("demo:"))


@dataclass(frozen=True)
class Device:
    name: str  # cuda:0, or "cpu" when a plan is made for the CPU
    memory_bytes: int


@dataclass(frozen=True)
class Item:
    """One thing placed on a device: its name, weights (BF16), bank entries and recorded activations."""

    name: str
    weights_bytes: int
    bank_bytes: dict[str, int]
    records_bytes: int = 0  # the sensitivity pass's recorded outputs of this layer

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + sum(self.bank_bytes.values()) + self.records_bytes


@dataclass
class Placement:
    device: Device
    items: list[str] = field(default_factory=list)
    weights_bytes: int = 0
    bank_bytes: int = 0
    records_bytes: int = 0
    workspace_bytes: int = 0  # the largest layer's working memory or a bank build's
    logits_bytes: int = 0  # the stage with the largest logits, on the device of lm_head
    stream_buffer_bytes: int = 0  # a streamed layer while it runs (the execution device of a streaming plan)

    @property
    def used_bytes(self) -> int:
        return (self.weights_bytes + self.bank_bytes + self.records_bytes + self.workspace_bytes
                + self.logits_bytes + self.stream_buffer_bytes + RESERVED_PER_DEVICE)

    def put(self, item: Item, logits: int = 0) -> None:
        self.items.append(item.name)
        self.weights_bytes += item.weights_bytes
        self.bank_bytes += sum(item.bank_bytes.values())
        self.records_bytes += item.records_bytes
        self.logits_bytes += logits


@dataclass
class MemoryPlan:
    model: str
    sizes: RunSizes
    totals: dict[str, int]  # what each part costs, whole model
    placements: list[Placement]
    overflow: list[str]  # items no device holds: they would stream from CPU memory
    overflow_bytes: int
    cpu_bytes: dict[str, int]
    smallest_gpus: int | None  # of the same memory, the fewest that hold everything (None: none up to MAX_GPUS)
    streaming: bool = False  # the overflow layers stream from CPU memory (the rest is placed)

    @property
    def fits(self) -> bool:
        """Everything on the GPUs."""
        return not self.overflow

    @property
    def runs(self) -> bool:
        """On the GPUs, or with the overflow layers streamed from CPU memory."""
        return self.fits or self.streaming

    def device_of(self) -> dict[str, int]:
        """Index of the device holding each item (``embeddings``, ``layer N``, ``final norm + lm_head``)."""
        return {name: k for k, p in enumerate(self.placements) for name in p.items}

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "sizes": asdict(self.sizes), "totals_bytes": self.totals, "fits": self.fits,
            "devices": [{"device": p.device.name, "memory_bytes": p.device.memory_bytes, "items": compact(p.items),
                         "weights_bytes": p.weights_bytes, "bank_bytes": p.bank_bytes,
                         "records_bytes": p.records_bytes, "workspace_bytes": p.workspace_bytes,
                         "logits_bytes": p.logits_bytes, "stream_buffer_bytes": p.stream_buffer_bytes,
                         "reserved_bytes": RESERVED_PER_DEVICE, "used_bytes": p.used_bytes} for p in self.placements],
            "streaming": self.streaming, "runs": self.runs,
            "streams_from_cpu": compact(self.overflow), "streams_from_cpu_bytes": self.overflow_bytes,
            "cpu_bytes": self.cpu_bytes, "smallest_gpus": self.smallest_gpus,
        }


def bank_entry_bytes(fmt: str, weights: int, views: int) -> int:
    """Bytes of one format's bank entry for ``weights`` weights in ``views`` quantized views (a linear's
    weight, or one expert's slice of a fused-experts weight); BF16 has no entry (the model's own weights)."""
    if fmt == "bf16":
        return 0
    if fmt == "fp8":
        return weights + views * FP8_TABLE_BYTES
    if fmt == "nvfp4":
        return weights // 2 + weights // NVFP4_BLOCK + views * NVFP4_GLOBAL_SCALE_BYTES
    raise ValueError(f"no bank layout for format {fmt!r}")


def _layer_items(config: Any, sizes: RunSizes) -> tuple[list[Item], int, int]:
    """One item per decoder layer; also the largest member's weights and the largest view's."""
    geo = text_geometry(config)
    shapes = expected_group_shapes(config)
    adapter = adapter_for(config)
    items, largest_member, largest_view = [], 0, 0
    record = sizes.sensitivity_samples * sizes.heldout_seq * geo.hidden * BF16_BYTES
    for g in geo.layers:
        weights, bank = 0, dict.fromkeys(sizes.formats, 0)
        for name, members in shapes.items():
            if not name.startswith(f"layers.{g.index}."):
                continue
            experts = g.num_experts if name.endswith(".experts") else 1
            for i, o in members:
                weights += i * o
                largest_member = max(largest_member, i * o)
                largest_view = max(largest_view, i * o // experts)
                for fmt in sizes.formats:
                    bank[fmt] += bank_entry_bytes(fmt, i * o, experts)
        norms = g.norms * g.hidden + (2 * g.head_dim if adapter.qk_norm else 0)
        router = g.num_experts * g.hidden + (g.hidden if g.shared_expert_intermediate else 0)
        bias = (g.heads + 2 * g.kv_heads) * g.head_dim if g.qkv_bias else 0
        items.append(Item(f"layer {g.index}", (weights + norms + router + bias) * BF16_BYTES,
                          {f: b for f, b in bank.items() if f != "bf16"}, record))
    return items, largest_member, largest_view


def _workspace_bytes(config: Any, tokens: int) -> int:
    """Working memory of one decoder layer over ``tokens`` tokens (attention through SDPA: no score matrix)."""
    geo = text_geometry(config)
    widest = max(max(g.intermediate, g.top_k * g.moe_intermediate + g.shared_expert_intermediate)
                 for g in geo.layers)
    return tokens * (4 * geo.hidden + 3 * widest) * BF16_BYTES


def stage_bytes(config: Any, sizes: RunSizes) -> dict[str, int]:
    """GPU bytes of each stage's largest batch: calibration, proxy and lm-eval logits, sampling's KV cache."""
    geo = text_geometry(config)
    vocab = geo.vocab
    cal_tokens = min(CALIBRATION_BATCH, sizes.calibration_samples) * sizes.calibration_seq
    proxy_tokens = min(PROXY_BATCH, sizes.heldout_samples) * sizes.heldout_seq
    stages = {
        "calibration logits (BF16)": cal_tokens * vocab * BF16_BYTES,
        # BF16 logits, their float32 copy and the float32 log-softmax
        "proxy logits (BF16 + 2x float32)": proxy_tokens * vocab * (BF16_BYTES + 4 + 4),
        "sampling KV cache": int(geo.kv_bytes(max(sizes.calibration_seq, sizes.heldout_seq)))  # both sets, one batch
        * (sizes.calibration_samples + sizes.heldout_samples),
    }
    if sizes.lm_eval:  # lm-eval's logits and their log-softmax, both BF16
        stages["lm-eval logits (BF16 x2)"] = LM_EVAL_BATCH * LM_EVAL_TOKENS * vocab * BF16_BYTES * 2
    return stages


def plan_memory(config: Any, sizes: RunSizes, devices: list[Device], model: str = "",
                stream: bool = False) -> MemoryPlan:
    """The plan of ``config``'s search with ``sizes`` on ``devices`` (in order), and the fewest such GPUs; with
    ``stream``, when it does not fit, the plan that streams the layers the GPUs cannot hold (if the rest fits)."""
    plan = _place(config, sizes, devices, model)
    if devices and devices[0].name != "cpu":
        memory = min(d.memory_bytes for d in devices)
        plan.smallest_gpus = next((n for n in range(1, MAX_GPUS + 1)
                                   if _place(config, sizes, gpus(n, memory), model).fits), None)
        if stream and not plan.fits and (streaming := _place_streaming(config, sizes, devices, model)):
            streaming.smallest_gpus = plan.smallest_gpus
            return streaming
    return plan


def gpus(count: int, memory_bytes: int) -> list[Device]:
    return [Device(f"cuda:{i}", memory_bytes) for i in range(count)]


def _parts(config: Any, sizes: RunSizes) -> tuple[list[Item], int, int, dict[str, int], dict[str, int]]:
    """The items in order, the per-device workspace, the largest logits, the totals and the CPU side."""
    geo = text_geometry(config)
    layers, largest_member, largest_view = _layer_items(config, sizes)
    embed = geo.vocab * geo.hidden * BF16_BYTES
    head = 0 if geo.tied_embeddings else embed
    stages = stage_bytes(config, sizes)
    logits = max(stages.values())
    tokens = max(min(CALIBRATION_BATCH, sizes.calibration_samples) * sizes.calibration_seq,
                 min(PROXY_BATCH, sizes.heldout_samples) * sizes.heldout_seq,
                 LM_EVAL_BATCH * LM_EVAL_TOKENS if sizes.lm_eval else 0)
    chunk = max(largest_view, min(largest_member, PACK_CHUNK_WEIGHTS))
    build = largest_member * MEMBER_BUILD_BYTES + chunk * BUILD_BYTES_PER_WEIGHT
    workspace = max(_workspace_bytes(config, tokens), build)
    items = [Item("embeddings", embed, {}), *layers,
             Item("final norm + lm_head", head + geo.hidden * BF16_BYTES, {})]
    totals = {"weights (BF16)": sum(i.weights_bytes for i in items)}
    for fmt in sizes.formats:
        if fmt != "bf16":
            totals[f"bank entry {fmt}"] = sum(i.bank_bytes.get(fmt, 0) for i in items)
    totals["sensitivity records"] = sum(i.records_bytes for i in items)
    totals.update(stages)
    totals["bank build (largest weight)"] = build
    cpu = {"proxy reference log-probs (float32)": (sizes.heldout_samples + sizes.sensitivity_samples)
           * sizes.heldout_seq * geo.vocab * 4}
    if sizes.whole_cpu_copy:
        cpu["loading (whole BF16 model, read then moved)"] = totals["weights (BF16)"]
    return items, workspace, logits, totals, cpu


def _place(config: Any, sizes: RunSizes, devices: list[Device], model: str) -> MemoryPlan:
    items, workspace, logits, totals, cpu = _parts(config, sizes)
    # Balanced first (an even share of the items per device, as accelerate's "balanced" map), else each
    # device filled to its memory in turn.
    share = -(-sum(i.total_bytes for i in items) // max(len(devices), 1))
    for limit in (share, None):
        placements, queue = _fill(items, devices, workspace, logits, limit)
        if not queue:
            break
    return MemoryPlan(model, sizes, totals, placements, [i.name for i in queue], sum(i.total_bytes for i in queue),
                      cpu, None)


def _place_streaming(config: Any, sizes: RunSizes, devices: list[Device], model: str) -> MemoryPlan | None:
    """Embeddings on the first device with room for the largest layer as it streams through, lm_head and the
    logits on the last, the layers in order on the devices while they fit, the rest streamed; None when the
    GPUs cannot hold even that (a streamed layer, its bank entries and its sensitivity records included)."""
    items, workspace, logits, totals, cpu = _parts(config, sizes)
    embed, *layers, head = items
    placements = [Placement(d, workspace_bytes=workspace) for d in devices]
    placements[0].put(embed)
    placements[0].stream_buffer_bytes = max(i.weights_bytes + sum(i.bank_bytes.values()) for i in layers)
    placements[-1].put(head, logits)
    # every layer's recorded outputs stay where they were computed: on the first device for streamed layers
    placements[0].records_bytes = sum(i.records_bytes for i in layers)
    if any(p.used_bytes > p.device.memory_bytes for p in placements):
        return None
    streamed: list[Item] = []
    k = 0
    for item in (Item(i.name, i.weights_bytes, i.bank_bytes) for i in layers):
        while k < len(placements) and placements[k].used_bytes + item.total_bytes > placements[k].device.memory_bytes:
            k += 1
        if k == len(placements):
            streamed.append(item)
        else:
            placements[k].put(item)
    for p in placements:  # the items of each device in model order (lm_head was put first on the last one)
        p.items.sort(key=[i.name for i in items].index)
    cpu["streamed layers (BF16 weights and bank entries)"] = sum(i.total_bytes for i in streamed)
    return MemoryPlan(model, sizes, totals, placements, [i.name for i in streamed],
                      sum(i.total_bytes for i in streamed), cpu, None, streaming=True)


def _fill(items: list[Item], devices: list[Device], workspace: int, logits: int,
          share: int | None) -> tuple[list[Placement], list[Item]]:
    """Items in order onto devices, each up to its memory (or ``share`` bytes of items); what is left over."""
    placements = [Placement(d, workspace_bytes=workspace) for d in devices]
    queue, placed = list(items), 0
    for k, p in enumerate(placements):
        last = k == len(placements) - 1
        while queue:
            item = queue[0]
            logits_here = logits if item is items[-1] else 0  # the logits live with lm_head
            if p.used_bytes + item.total_bytes + logits_here > p.device.memory_bytes:
                break
            if share is not None and not last and placed + item.total_bytes > (k + 1) * share:
                break  # this device has its share; the last one takes what is left
            queue.pop(0)
            placed += item.total_bytes
            p.put(item, logits_here)
    return placements, queue


def compact(names: list[str]) -> list[str]:
    """``["embeddings", "layer 0", "layer 1", "layer 2"]`` -> ``["embeddings", "layers 0-2"]``."""
    out: list[str] = []
    run: list[int] = []

    def flush() -> None:
        if run:
            out.append(f"layer {run[0]}" if len(run) == 1 else f"layers {run[0]}-{run[-1]}")
            run.clear()

    for name in names:
        if name.startswith("layer ") and name[6:].isdigit():
            index = int(name[6:])
            if run and index != run[-1] + 1:
                flush()
            run.append(index)
        else:
            flush()
            out.append(name)
    flush()
    return out
