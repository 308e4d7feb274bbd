"""A serving-grade decoder runtime for energy measurement: static KV cache, CUDA graphs, real FP8.

What a serving engine does, and what this runtime does too:

* each family's own decoder layer (:class:`~advisor.energy.runtime._dims.DecoderDims`, from
  the model's config through the architecture adapters): Llama 3.x, Mistral, Qwen2/2.5
  (q/k/v biases), Qwen3 (q/k RMSNorm), Gemma 2/3 (four norms per layer, (1 + w) norm
  weights, scaled embeddings, GELU-tanh, Gemma 2's soft-capping), Phi-3/Phi-4 (its
  pre-fused qkv_proj and gate_up_proj are the runtime's fused GEMMs as they are), and the
  routed-expert layers of Mixtral and Qwen3-MoE (:mod:`advisor.energy.runtime._moe`: BF16 router,
  grouped GEMMs over the experts the tokens chose); sliding-window layers read only their
  window of the KV cache;
* the weights of each layer group (fused qkv, o, fused gate_up, down) sit in the
  plan's format: BF16 ``F.linear`` or FP8 E4M3 with a per-tensor weight scale, run
  by ``torch._scaled_mm`` (cuBLASLt FP8 tensor-core GEMMs) with the static,
  calibrated per-tensor activation scale; the activation is quantized inside the
  kernel that produces it (RMSNorm, act*up), not by a separate pass; biases ride in
  the GEMM epilogue;
* a static KV cache; the decode step and the prefill are captured once per
  (batch, length) in CUDA graphs and replayed, so no CPU launch overhead;
* decode attention is one fused kernel (q/k norms, rotary embedding, KV-cache write,
  flash-decoding, soft-capping, FP8 output for an FP8 o_proj) that reads only the
  attended context (graphs are captured per context length), never the whole
  allocated cache;
* the KV cache in the plan's format: BF16, or FP8 E4M3 with one calibrated scale per
  layer for K and one for V (amax / 448 of the cached keys after RoPE and of the values,
  as ModelOpt exports ``k_scale``/``v_scale``); decode attention reads the FP8 bytes and
  widens them in registers, as TensorRT-LLM's and vLLM's FP8 KV caches do; prefill attends
  in BF16 and stores FP8;
* each dense decode layer is 8 kernels: 2 RMSNorms (Gemma's extra norms are fused into
  them), 4 GEMMs, attention (plus a reduction when it splits the context), act*up (a MoE
  layer's routing adds about 20 small PyTorch kernels around its two grouped GEMMs);
* the lm_head stays BF16 (ModelOpt's default), and prefill computes the logits of
  the last token only.

NVFP4 groups are refused on Hopper (no FP4 tensor cores there) with
:class:`UnsupportedError`; their accuracy is available from the fake-quantized model.
Without a GPU the kernels run in Triton's CPU interpreter (tests), BF16 only.

torch and triton are imported lazily by callers: import this module only where a
GPU run (or the interpreter) is intended.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from advisor.energy.meter import check_formats_supported
from advisor.energy.runtime import kernels as K
from advisor.energy.runtime._attention_torch import attention_over_cache
from advisor.energy.runtime._cuda_tools import CapturedStep
from advisor.energy.runtime._dims import AttentionSpec
from advisor.energy.runtime._moe import RoutedExperts
from advisor.energy.runtime._weights import DecoderWeights
from advisor.errors import SetupError
from advisor.formats import Format
from advisor.plan import DENSE_GROUP_KINDS

FP8_MAX = 448.0
MOE_GROUP_KINDS = ("qkv", "o", "experts")
SHARED_EXPERT_KINDS = ("shared_gate_up", "shared_down")
_PLAN_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.("
                       + "|".join((*DENSE_GROUP_KINDS, *SHARED_EXPERT_KINDS, "experts")) + r")$")


class GroupLinear:
    """One layer group's weight (and bias) in one format."""

    def __init__(
        self, w_bf16: torch.Tensor, fmt: Format, act_amax: float | None, bias: torch.Tensor | None = None
    ) -> None:
        self.fmt = fmt
        self.bias = bias
        self.out_features, self.in_features = w_bf16.shape
        if fmt == Format.BF16:
            self.w = w_bf16
            self.inv_scale_x = None
        else:
            w_amax = w_bf16.abs().amax().float().clamp(min=1e-12)
            self.scale_w = (w_amax / FP8_MAX).reshape(())
            self.w = (w_bf16.float() / self.scale_w).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
            if act_amax is None:
                raise SetupError("an FP8 group needs a calibrated activation amax")
            self.scale_x = torch.tensor(max(act_amax, 1e-12) / FP8_MAX, device=w_bf16.device)
            self.inv_scale_x = (1.0 / self.scale_x).reshape(1)
            self.wt = self.w.t()  # [K, N] column-major, as cuBLASLt wants it

    @property
    def weight_bytes(self) -> int:
        return self.w.numel() * self.w.element_size()

    def __call__(self, x: torch.Tensor, pdl: bool = False) -> torch.Tensor:
        if self.fmt == Format.BF16:
            return F.linear(x, self.w, self.bias)
        if x.dtype != torch.float8_e4m3fn:
            x = K.quant_fp8(x, self.inv_scale_x, pdl)
        return torch._scaled_mm(
            x, self.wt, scale_a=self.scale_x, scale_b=self.scale_w, bias=self.bias, out_dtype=torch.bfloat16
        )


def layer_kinds(dims_or_layers) -> list[tuple[str, ...]]:
    """The group kinds of each layer: dense (qkv, o, gate_up, down) or MoE (qkv, o, experts)."""
    if isinstance(dims_or_layers, int):
        return [DENSE_GROUP_KINDS] * dims_or_layers
    return [DENSE_GROUP_KINDS if la.moe is None else
            ("qkv", "o", *SHARED_EXPERT_KINDS, "experts") if la.shared_intermediate else MOE_GROUP_KINDS
            for la in dims_or_layers.layers]


def group_formats(plan_formats: Mapping[str, Format], dims_or_layers) -> dict[str, Format]:
    """Plan keys (``layers.{i}.{kind}``, with or without a stack prefix) -> ``{i}.{kind}``; missing stay BF16.

    ``dims_or_layers``: the DecoderDims (MoE layers have an ``experts`` group), or a layer count (dense)."""
    kinds = layer_kinds(dims_or_layers)
    num_layers = len(kinds)
    out = {f"{i}.{k}": Format.BF16 for i, ks in enumerate(kinds) for k in ks}
    for name, fmt in plan_formats.items():
        m = _PLAN_KEY.search(name)
        key = f"{m.group(1)}.{m.group(2)}" if m else None
        if key not in out:
            raise SetupError(f"plan group {name!r} is not a group of this {num_layers}-layer decoder")
        out[key] = Format(fmt)
    return out


class DecoderRuntime:
    """Runs one plan of a decoder (dense or routed-expert layers): prefill and decode, eager or graph-captured."""

    def __init__(
        self,
        weights: DecoderWeights,
        plan_formats: Mapping[str, Format],
        act_amax: Mapping[str, float] | None = None,
        decode_attention: str = "triton",
        linear_cache: dict | None = None,
        pdl: bool = False,
        kv_cache: Format = Format.BF16,
    ) -> None:
        self.w = weights
        self.dims = weights.dims
        fmts = group_formats(plan_formats, self.dims)
        check_formats_supported(set(fmts.values()))
        self.formats = fmts
        self.decode_attention = decode_attention
        dev = weights.device
        self.on_gpu = dev.type == "cuda"
        # Programmatic dependent launch of the Triton kernels: off by default, because it
        # does not pay (it only overlaps launches after cuBLAS GEMMs, which do not trigger
        # early); reports/benchmarks/decode_step_variants.md.
        self.pdl = pdl and self.on_gpu and torch.cuda.get_device_capability(dev)[0] >= 9
        self.attention_splits: int | None = None  # None: kernels.decode_splits decides
        # ``linear_cache`` lets several runtimes (plans) share converted weights.
        cache = linear_cache if linear_cache is not None else {}
        self.lin: dict[str, GroupLinear] = {}
        self.experts: dict[int, RoutedExperts] = {}
        amax = act_amax or {}
        for k, f in fmts.items():
            if (k, f) not in cache:
                if k.endswith(".experts"):
                    i = int(k.split(".")[0])
                    la, t = self.dims.layers[i], weights.t
                    cache[(k, f)] = RoutedExperts(la.moe, t[f"{i}.router"], t[f"{i}.experts_gate_up"],
                                                  t[f"{i}.experts_down"], f, amax.get(k), amax.get(f"{k}_down"),
                                                  la.activation)
                else:
                    cache[(k, f)] = GroupLinear(weights.t[k], f, amax.get(k), weights.t.get(f"{k}_bias"))
            if k.endswith(".experts"):
                self.experts[int(k.split(".")[0])] = cache[(k, f)]
            else:
                self.lin[k] = cache[(k, f)]
        self.kv_fp8 = Format(kv_cache) == Format.FP8
        if Format(kv_cache) not in (Format.BF16, Format.FP8):
            raise SetupError(f"a {Format(kv_cache).value} KV cache is not in the runtime (BF16 or FP8)")
        self.kv_scales = _kv_scales(act_amax or {}, self.dims.num_layers, dev) if self.kv_fp8 else None
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        # per layer [batch, kv_heads, length, head_dim]; a sliding-window layer's is a ring of window length
        self.k_cache: list[torch.Tensor] | None = None
        self.v_cache: list[torch.Tensor] | None = None
        self.cache_len = 0  # positions the caches cover

    # -- bookkeeping ----------------------------------------------------------
    def weight_bytes(self) -> int:
        """Bytes of every weight (linear groups, every routed expert, BF16 routers and lm_head)."""
        routers = sum(self.w.t[f"{i}.router"].numel() * 2 for i in self.experts)
        return (sum(lin.weight_bytes for lin in self.lin.values()) + sum(e.weight_bytes for e in self.experts.values())
                + routers + self.w.t["lm_head"].numel() * 2)

    def allocate_cache(self, batch: int, max_len: int) -> None:
        """Static KV cache for positions [0, max_len), random (not zeros); RoPE tables to max_len.

        Per layer [batch, kv_heads, length, head_dim]: length max_len, or the window for a
        sliding-window layer (a ring: position n in slot n % window), as a serving engine
        keeps only the window.
        """
        self.w.ensure_positions(max_len)
        shapes = [(batch, la.attention.kv_heads, _cache_len(la.attention, max_len), la.attention.head_dim)
                  for la in self.dims.layers]
        dtype = torch.float8_e4m3fn if self.kv_fp8 else torch.bfloat16
        if (self.k_cache is None or self.cache_len != max_len or [tuple(k.shape) for k in self.k_cache] != shapes
                or self.k_cache[0].dtype != dtype):
            self.free()
            dev = self.pos.device
            self.k_cache = [_random_cache(s, dev, self.kv_scales, i, 0) for i, s in enumerate(shapes)]
            self.v_cache = [_random_cache(s, dev, self.kv_scales, i, 1) for i, s in enumerate(shapes)]
            self.cache_len = max_len

    def free(self) -> None:
        """Drop the KV cache (graphs captured on it belong to their CapturedStep: drop those too)."""
        self.k_cache = self.v_cache = None
        self.cache_len = 0
        if self.on_gpu:
            torch.cuda.empty_cache()

    def share_cache(self, other: DecoderRuntime) -> None:
        if other.kv_fp8 != self.kv_fp8:
            raise SetupError("runtimes with different KV-cache formats cannot share a cache")
        self.k_cache, self.v_cache, self.cache_len = other.k_cache, other.v_cache, other.cache_len

    # -- forward --------------------------------------------------------------
    def _attention(self, i: int, spec: AttentionSpec, qkv: torch.Tensor, b: int, length: int, ctx: int, record=None):
        t, d = self.w.t, self.dims
        cos, sin = self.w.rope[spec.rope]
        kc, vc = self.k_cache[i], self.v_cache[i]
        norms = dict(q_norm=t.get(f"{i}.q_norm"), k_norm=t.get(f"{i}.k_norm"), norm_eps=d.rms_eps,
                     norm_round=not d.gemma_norms, q_scale=spec.q_scale)
        ring = kc.shape[2] < self.cache_len
        ks, vs = self.kv_scales[i] if self.kv_fp8 else (None, None)
        if length == 1 and self.decode_attention == "triton":
            return K.decode_attention(
                qkv, cos, sin, self.pos, kc, vc, ctx, spec.heads, spec.kv_heads, spec.head_dim,
                inv_scale=self.lin[f"{i}.o"].inv_scale_x, splits=self.attention_splits, pdl=self.pdl,
                kv_lo=spec.first_key(ctx), softcap=spec.softcap, ring=ring, k_scale=ks, v_scale=vs, **norms,
            )
        if self.kv_fp8:  # attend in BF16 over the dequantized cache, store the new positions back in FP8
            kb, vb = (kc.float() * ks).to(torch.bfloat16), (vc.float() * vs).to(torch.bfloat16)
            att = self._attention_bf16(spec, qkv, kb, vb, b, length, ctx, cos, sin, norms, ring)
            kc.copy_((kb.float() / ks).clamp(-FP8_MAX, FP8_MAX))
            vc.copy_((vb.float() / vs).clamp(-FP8_MAX, FP8_MAX))
            return att
        att = self._attention_bf16(spec, qkv, kc, vc, b, length, ctx, cos, sin, norms, ring)
        if record is not None:  # the cached keys (after RoPE) and values: the FP8 KV scales
            n = min(ctx, kc.shape[2])
            record(f"{i}.k_cache", kc[:, :, :n])
            record(f"{i}.v_cache", vc[:, :, :n])
        return att

    def _attention_bf16(self, spec: AttentionSpec, qkv, kc, vc, b: int, length: int, ctx: int, cos, sin, norms,
                        ring: bool):
        """Prefill and the eager decode variants over a BF16 cache (rope_qkv writes it, SDPA attends)."""
        if not ring:
            return self._attention_in_torch(spec, qkv, kc, vc, b, length, ctx, cos, sin, norms)
        # a ring (sliding window): attend over a linear copy of the window, then keep its last positions
        start, slots = ctx - length, kc.shape[2]
        old = torch.arange(spec.first_key(start + 1), start, device=kc.device)
        lin_k = kc.new_empty(b, spec.kv_heads, ctx, spec.head_dim)
        lin_v = torch.empty_like(lin_k)
        lin_k[:, :, old], lin_v[:, :, old] = kc[:, :, old % slots], vc[:, :, old % slots]
        att = self._attention_in_torch(spec, qkv, lin_k, lin_v, b, length, ctx, cos, sin, norms)
        keep = torch.arange(max(0, ctx - slots), ctx, device=kc.device)
        kc[:, :, keep % slots], vc[:, :, keep % slots] = lin_k[:, :, keep], lin_v[:, :, keep]
        return att

    def _attention_in_torch(self, spec: AttentionSpec, qkv, kc, vc, b: int, length: int, ctx: int, cos, sin, norms):
        """Prefill, and the eager decode variants: rope_qkv writes k and v, then SDPA (or matmul) attends."""
        h, hd = spec.heads, spec.head_dim
        q = K.rope_qkv(qkv, cos, sin, self.pos, kc, vc, b, length, h, spec.kv_heads, hd, self.pdl, **norms)
        att = attention_over_cache(q, kc, vc, ctx - length, spec, eager=self.decode_attention == "bmm")
        return att.transpose(1, 2).reshape(b * length, h * hd)

    def forward(self, tokens: torch.Tensor, start: int, calib: dict | None = None) -> torch.Tensor:
        """Run ``tokens`` [B, L] at positions ``start..start+L-1``; logits of the last token.

        L == 1 is a decode step attending to ``start + 1`` cached tokens (or the last
        window of them). ``calib`` (a dict) records the amax of every group's input
        (BF16 groups only). The position lives in a device tensor, so a captured graph
        reads it at replay.
        """
        d, t, pdl = self.dims, self.w.t, self.pdl
        b, length = tokens.shape
        ctx = start + length
        if ctx > self.w.max_pos or self.k_cache is None or ctx > self.cache_len:
            raise SetupError(f"context {ctx} exceeds the allocated cache or RoPE tables: call allocate_cache first")
        if not (self.on_gpu and torch.cuda.is_current_stream_capturing()):
            self.pos.fill_(start)
        eps, rnd = d.rms_eps, not d.gemma_norms

        def record(key: str, x: torch.Tensor) -> None:
            if calib is not None:
                calib[key] = max(calib.get(key, 0.0), x.float().abs().amax().item())

        resid = F.embedding(tokens.reshape(-1), t["embed"])
        h_out = out_norm = None
        for i, layer in enumerate(d.layers):
            lq, lo = self.lin[f"{i}.qkv"], self.lin[f"{i}.o"]
            moe = self.experts.get(i)
            lg, ld = (None, None) if moe else (self.lin[f"{i}.gate_up"], self.lin[f"{i}.down"])
            first = h_out is None
            a = K.add_rmsnorm(
                resid if first else h_out, None if first else resid, t[f"{i}.ln_attn"], eps, lq.inv_scale_x, pdl,
                x_weight=out_norm, norm_round=rnd,
            )  # fmt: skip
            record(f"{i}.qkv", a)
            att = self._attention(i, layer.attention, lq(a), b, length, ctx, record if calib is not None else None)
            record(f"{i}.o", att)
            h = lo(att, pdl)
            m = K.add_rmsnorm(
                h, resid, t[f"{i}.ln_mlp"], eps, None if moe else lg.inv_scale_x, pdl,
                x_weight=t.get(f"{i}.ln_attn_out"), norm_round=rnd,
            )  # fmt: skip
            if moe:  # the router reads the BF16 norm output; the experts quantize it themselves
                h_out = moe(m, record if calib is not None else None, f"{i}.experts")
                if layer.shared_intermediate:
                    h_out = h_out + self._shared_expert(i, layer.activation, m, record)
                out_norm = t.get(f"{i}.ln_mlp_out")
                continue
            record(f"{i}.gate_up", m)
            act = K.gated_act(lg(m), layer.activation, ld.inv_scale_x, pdl)
            record(f"{i}.down", act)
            h_out, out_norm = ld(act), t.get(f"{i}.ln_mlp_out")
        last = h_out.view(b, length, d.hidden)[:, -1].contiguous()
        resid_last = resid.view(b, length, d.hidden)[:, -1].contiguous()
        y = K.add_rmsnorm(last, resid_last, t["norm"], eps, pdl=pdl, x_weight=out_norm, norm_round=rnd)
        logits = F.linear(y, t["lm_head"])
        if d.final_softcap is not None:
            logits = torch.tanh(logits / d.final_softcap) * d.final_softcap
        return logits

    def _shared_expert(self, i: int, activation: str, m: torch.Tensor, record) -> torch.Tensor:
        """Qwen2-MoE's shared expert: a gated MLP on every token, its output times sigmoid(gate . x)."""
        sg, sd = self.lin[f"{i}.shared_gate_up"], self.lin[f"{i}.shared_down"]
        record(f"{i}.shared_gate_up", m)
        act = K.gated_act(sg(m), activation, sd.inv_scale_x)
        record(f"{i}.shared_down", act)
        return sd(act) * torch.sigmoid(F.linear(m, self.w.t[f"{i}.shared_gate"]))

    # -- CUDA graphs ------------------------------------------------------------
    def capture(self, tokens: torch.Tensor, start: int) -> CapturedStep:
        """Capture one step (decode if tokens is [B, 1], else prefill) at a fixed position."""
        self.pos.fill_(start)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.no_grad():
            for _ in range(2):
                self.forward(tokens, start)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.no_grad():
            logits = self.forward(tokens, start)
        torch.cuda.synchronize()
        return CapturedStep(graph, logits, tokens.shape[0], tokens.shape[1], start)


def _kv_scales(amax: Mapping[str, float], num_layers: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (k_scale, v_scale) = amax / 448 of the calibrated cache, as float32 device scalars."""
    missing = [i for i in range(num_layers) if f"{i}.k_cache" not in amax or f"{i}.v_cache" not in amax]
    if missing:
        raise SetupError(f"an FP8 KV cache needs the calibrated k/v amax of every layer (missing: layers {missing})")
    return [tuple(torch.tensor([max(amax[f"{i}.{c}_cache"], 1e-12) / FP8_MAX], device=device) for c in "kv")
            for i in range(num_layers)]


def _random_cache(shape, device, scales, layer: int, which: int) -> torch.Tensor:
    """A cache of random values (BF16), or their FP8 codes under the layer's k or v scale."""
    x = torch.randn(shape, device=device, dtype=torch.bfloat16) * 0.5
    if scales is None:
        return x
    return (x.float() / scales[layer][which]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def _cache_len(spec: AttentionSpec, max_len: int) -> int:
    return max_len if spec.sliding_window is None else min(max_len, spec.sliding_window)


def calibrate(weights: DecoderWeights, batch: int = 2, length: int = 256, seed: int = 0) -> dict[str, float]:
    """Per-group input amax of the BF16 model on random tokens (static FP8 activation scales)."""
    rt = DecoderRuntime(weights, {})
    rt.allocate_cache(batch, length)
    g = torch.Generator(device=weights.device).manual_seed(seed)
    tokens = torch.randint(0, weights.dims.vocab, (batch, length), device=weights.device, generator=g)
    calib: dict[str, float] = {}
    with torch.no_grad():
        rt.forward(tokens, start=0, calib=calib)
    rt.free()
    return calib
