"""A fake ``vllm`` module for CPU tests, shaped like vLLM 0.26's offline API where the advisor uses it:
``LLM(model=..., **kwargs)``, ``llm.llm_engine.add_request/step/abort_request/get_num_unfinished_requests``,
``llm.generate(prompts, SamplingParams(prompt_logprobs=k))`` (k=-1: every token, as ``FlatLogprobs`` where
``flat_logprobs``; vLLM's cap ``max_logprobs`` enforced), ``llm.apply_model(fn)``,
``SamplingParams`` and ``sampling_params.RequestOutputKind``. Prompt log-probabilities reach the output as vLLM
hands them over: a ``LogprobsTensors`` per prefill chunk (``module.prompt_chunk`` tokens) to
``vllm.v1.engine.logprobs.LogprobsProcessor._update_prompt_logprobs``, which makes the Python lists.

The fake "model" is a bigram table: the next-token distribution after token ``t`` is
``softmax(table[t])`` (:func:`bigram_table`, the same on both sides of a test). A checkpoint is read
the way vLLM reads it: ``hf_quant_config.json``'s ``quant_algo`` and ``exclude_modules`` decide each
linear layer's method, and a layer served in FP8 adds noise to the logits, so served KL grows with
the quantized share. ``module.misserve`` forces a layer's method (a group served otherwise than
planned); ``module.instances`` keeps every LLM made (with the environment it was made in, ``environ``), and
``module.params_made`` every ``SamplingParams``. Steps take ``module.step_s`` seconds of real time
(and ``module.step_s_per_seq`` more per request in the step). ``linear_backend="torch"`` is refused for a
checkpoint with NVFP4 layers, as vLLM refuses it.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import time
import types
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

VOCAB = 64


def bigram_table(vocab: int = VOCAB, seed: int = 0) -> Any:
    import torch

    return torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed)) * 2.0


class RequestOutputKind(Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None


class SamplingParams:
    def __init__(self, max_tokens: int = 16, ignore_eos: bool = False, temperature: float = 1.0,
                 output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE, prompt_logprobs: int | None = None,
                 detokenize: bool = True, flat_logprobs: bool = False) -> None:
        self.max_tokens, self.ignore_eos, self.temperature = max_tokens, ignore_eos, temperature
        self.output_kind, self.prompt_logprobs, self.detokenize = output_kind, prompt_logprobs, detokenize
        self.flat_logprobs = flat_logprobs


@dataclass
class FlatLogprobs:
    """vLLM's flat prompt log-probabilities: position i is entries [start_indices[i], end_indices[i])."""

    start_indices: list[int]
    end_indices: list[int]
    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int]

    def append(self, entries: list[tuple[int, float, int]]) -> None:
        self.start_indices.append(len(self.token_ids))
        for t, lp, r in entries:
            self.token_ids.append(t)
            self.logprobs.append(lp)
            self.ranks.append(r)
        self.end_indices.append(len(self.token_ids))


class LogprobsTensors(NamedTuple):
    """vLLM's: per position, the token ids and log-probabilities (the prompt's token first, then the top k)."""

    logprob_token_ids: Any
    logprobs: Any
    selected_token_ranks: Any
    cu_num_generated_tokens: list[int] | None = None


class LogprobsProcessor:
    """vLLM's per-request output side: it turns each chunk's tensors into Python lists, a position at a time."""

    def __init__(self, flat: bool) -> None:
        self.prompt_logprobs: Any = FlatLogprobs([], [], [], [], []) if flat else []
        self.prompt_logprobs.append([] if flat else None)  # the first position has none

    def _update_prompt_logprobs(self, tensors: LogprobsTensors) -> None:
        ids, lps, ranks = tensors[0].tolist(), tensors[1].tolist(), tensors[2].tolist()
        for pos_ids, pos_lps, rank in zip(ids, lps, ranks, strict=True):
            entries = [(t, lp, rank if j == 0 else j) for j, (t, lp) in enumerate(zip(pos_ids, pos_lps, strict=True))]
            if isinstance(self.prompt_logprobs, FlatLogprobs):
                self.prompt_logprobs.append(entries)
            else:
                self.prompt_logprobs.append({t: Logprob(lp, r) for t, lp, r in entries})


class _Linear:
    def __init__(self, method: str) -> None:
        self.quant_method = type(method, (), {})()
        self.weight = None


class _Model:
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(self, layers: dict[str, str]) -> None:
        self._layers = {name: _Linear(m) for name, m in layers.items()}

    def named_modules(self) -> Any:
        yield "", self
        yield from self._layers.items()


def _layer_methods(checkpoint: Path, misserve: dict[str, str]) -> dict[str, str]:
    config = json.loads((checkpoint / "config.json").read_text())
    qpath = checkpoint / "hf_quant_config.json"
    quant = json.loads(qpath.read_text())["quantization"] if qpath.is_file() else {}
    algo, exclude = quant.get("quant_algo"), quant.get("exclude_modules") or []
    methods = {}
    for i in range(config["num_hidden_layers"]):
        for leaf, members in (("self_attn.qkv_proj", ("q_proj", "k_proj", "v_proj")), ("self_attn.o_proj", ("o_proj",)),
                              ("mlp.gate_up_proj", ("gate_proj", "up_proj")), ("mlp.down_proj", ("down_proj",))):
            name = f"model.layers.{i}.{leaf}"
            full = [name.rsplit(".", 1)[0] + "." + m for m in members]
            excluded = any(fnmatch.fnmatch(m, pat) for m in full for pat in exclude)
            fp8 = algo == "FP8" and not excluded
            methods[name] = misserve.get(name, "ModelOptFp8LinearMethod" if fp8 else "UnquantizedLinearMethod")
    methods["lm_head"] = "UnquantizedLinearMethod"
    return methods


def _check_linear_backend(checkpoint: Path, backend: str) -> None:
    """vLLM refuses a linear backend with no kernel for one of the model's layers: ``torch`` has none for NVFP4."""
    qpath = checkpoint / "hf_quant_config.json"
    if backend == "torch" and qpath.is_file() and "NVFP4" in qpath.read_text():
        raise ValueError("--linear-backend=torch was requested but no 'torch' kernel exists for this layer type.")


class _Output:
    def __init__(self, request_id: str, token_ids: list[int], finished: bool) -> None:
        self.request_id, self.finished = request_id, finished
        self.outputs = [types.SimpleNamespace(token_ids=token_ids)]
        self.prompt_logprobs = None


class _Engine:
    def __init__(self, module: Any, max_num_seqs: int) -> None:
        self.module, self.max_num_seqs = module, max_num_seqs
        self.running: dict[str, list[int]] = {}  # id -> [generated, max_tokens]
        self.prompts: list[tuple[int, ...]] = []
        self.most_running = 0

    def add_request(self, request_id: str, prompt: dict[str, Any], params: SamplingParams) -> str:
        assert params.output_kind == RequestOutputKind.DELTA and params.ignore_eos
        self.prompts.append(tuple(prompt["prompt_token_ids"]))
        self.running[request_id] = [0, params.max_tokens]
        return request_id

    def step(self) -> list[_Output]:
        active = list(self.running)[: self.max_num_seqs]
        time.sleep(self.module.step_s + self.module.step_s_per_seq * len(active))
        self.most_running = max(self.most_running, len(active))
        outs = []
        for rid in active:
            state = self.running[rid]
            state[0] += 1
            done = state[0] >= state[1]
            if done:
                del self.running[rid]
            outs.append(_Output(rid, [1], done))
        return outs

    def abort_request(self, ids: list[str]) -> None:
        for rid in ids:
            self.running.pop(rid, None)

    def get_num_unfinished_requests(self) -> int:
        return len(self.running)


def fake_vllm(step_s: float = 0.002, noise: float = 0.5, step_s_per_seq: float = 0.0) -> types.ModuleType:
    """A module shaped like ``vllm`` (module docstring); ``noise`` is the logit noise of an all-FP8 model; a step
    takes ``step_s`` plus ``step_s_per_seq`` per request in it."""
    import torch

    module = types.ModuleType("vllm")
    module.__version__ = "0.0-fake"
    module.instances, module.misserve, module.step_s, module.step_s_per_seq = [], {}, step_s, step_s_per_seq
    made: list[SamplingParams] = []

    class RecordedParams(SamplingParams):  # every SamplingParams made through this module, in module.params_made
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    sp = types.ModuleType("vllm.sampling_params")
    sp.RequestOutputKind, sp.SamplingParams = RequestOutputKind, RecordedParams
    module.sampling_params, module.SamplingParams, module.params_made = sp, RecordedParams, made
    logprobs_module = types.ModuleType("vllm.v1.engine.logprobs")
    logprobs_module.LogprobsProcessor = type("LogprobsProcessor", (LogprobsProcessor,), {})  # patchable per module
    class LLM:
        def __init__(self, model: str, **kwargs: Any) -> None:
            self.model, self.kwargs, self.environ = Path(model), kwargs, dict(os.environ)
            _check_linear_backend(self.model, kwargs.get("linear_backend", "auto"))
            table = bigram_table(json.loads((self.model / "config.json").read_text())["vocab_size"])
            self.methods = _layer_methods(self.model, dict(module.misserve))
            self.llm_engine = _Engine(module, kwargs.get("max_num_seqs", 256))
            fp8 = sum(m == "ModelOptFp8LinearMethod" for m in self.methods.values()) / max(len(self.methods) - 1, 1)
            self.logits = table + noise * fp8 * torch.randn(table.shape, generator=torch.Generator().manual_seed(1))
            module.instances.append(self)

        def apply_model(self, fn: Any) -> list[Any]:
            return [fn(_Model({k: v for k, v in self.methods.items()}))]

        def generate(self, prompts: list[dict[str, Any]], params: SamplingParams, use_tqdm: bool = True) -> list[Any]:
            vocab, k = self.logits.shape[-1], params.prompt_logprobs
            cap = self.kwargs.get("max_logprobs", 20)
            if k is not None and (vocab if k == -1 else k) > (vocab if cap == -1 else cap):
                raise ValueError(f"Requested prompt logprobs of {vocab if k == -1 else k}, which is greater than max "
                                 f"allowed: {cap}")
            outs = []
            for i, p in enumerate(prompts):
                ids = p["prompt_token_ids"]
                if len(ids) + params.max_tokens > self.kwargs.get("max_model_len", math.inf):
                    raise ValueError(f"The decoder prompt (length {len(ids)}) plus the number of requested output "
                                     "tokens is longer than the maximum model length of "
                                     f"{self.kwargs['max_model_len']}")
                out = _Output(str(i), [0], True)
                if k is not None:
                    out.prompt_logprobs = self._prompt_logprobs(ids, vocab if k == -1 else k, params.flat_logprobs)
                outs.append(out)
            return outs

        def _prompt_logprobs(self, ids: list[int], k: int, flat: bool) -> Any:
            lp = torch.log_softmax(self.logits[torch.tensor(ids[:-1], dtype=torch.long)], -1)
            top = torch.topk(lp, k, dim=-1)
            nxt = torch.tensor(ids[1:], dtype=torch.long)[:, None]
            token_ids = torch.cat([nxt, top.indices], 1)  # vLLM's order: the prompt's token first
            values = torch.cat([lp.gather(1, nxt), top.values], 1)
            ranks = (lp > lp.gather(1, nxt)).sum(1) + 1
            processor = logprobs_module.LogprobsProcessor(flat)
            for start in range(0, len(ids) - 1, module.prompt_chunk):
                end = start + module.prompt_chunk
                processor._update_prompt_logprobs(LogprobsTensors(token_ids[start:end], values[start:end],
                                                                  ranks[start:end]))
            return processor.prompt_logprobs

    module.LLM = LLM
    module.prompt_chunk = 1 << 30
    module.v1 = types.SimpleNamespace(engine=types.SimpleNamespace(logprobs=logprobs_module))
    return module


class ConstantPowerCounter:
    """An energy counter on real time at ``power_w``, ticking every ``tick_s`` (NVML's counter moves in steps)."""

    def __init__(self, power_w: float = 300.0, tick_s: float = 0.01) -> None:
        self.power_w, self.tick_s, self.t0 = power_w, tick_s, time.perf_counter()

    def energy_mj(self) -> int:
        t = math.floor((time.perf_counter() - self.t0) / self.tick_s) * self.tick_s
        return int(t * self.power_w * 1000)

    def state(self) -> Any:
        from advisor.testing import _FAKE_STATE

        return _FAKE_STATE
