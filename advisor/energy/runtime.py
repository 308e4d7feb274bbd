"""A serving-grade Llama runtime for energy measurement: static KV cache, CUDA graphs, real FP8.

What a serving engine does, and what this runtime does too:

* the weights of each layer group (fused qkv, o, fused gate_up, down) sit in the
  plan's format: BF16 ``F.linear`` or FP8 E4M3 with a per-tensor weight scale, run
  by ``torch._scaled_mm`` (cuBLASLt FP8 tensor-core GEMMs) with the static,
  calibrated per-tensor activation scale; the activation is quantized inside the
  kernel that produces it (RMSNorm, SiLU*up), not by a separate pass;
* a static KV cache; the decode step and the prefill are captured once per
  (batch, length) in CUDA graphs and replayed, so no CPU launch overhead;
* decode attention is one fused kernel (rotary embedding, KV-cache write,
  flash-decoding, FP8 output for an FP8 o_proj) that reads only the real context
  (graphs are captured per context length), never the whole allocated cache;
* each decode layer is 8 kernels: 2 RMSNorms, 4 GEMMs, attention (plus a
  reduction when it splits the context), SiLU*up;
* the lm_head stays BF16 (ModelOpt's default), and prefill computes the logits of
  the last token only.

NVFP4 groups are refused on Hopper (no FP4 tensor cores there) with
:class:`UnsupportedError`; their accuracy is available from the fake-quantized model.

torch and triton are imported lazily by callers: import this module only where a
GPU run is intended.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from advisor.energy import kernels as K
from advisor.energy.cuda_tools import CapturedStep
from advisor.energy.dims import LlamaDims
from advisor.energy.gpu_checks import check_formats_supported, require_gpu
from advisor.errors import SetupError
from advisor.formats import Format
from advisor.plan import DENSE_GROUP_KINDS

FP8_MAX = 448.0


class _Linear:
    """One layer group's weight in one format."""

    def __init__(self, w_bf16: torch.Tensor, fmt: Format, act_amax: float | None) -> None:
        self.fmt = fmt
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
            return F.linear(x, self.w)
        if x.dtype != torch.float8_e4m3fn:
            x = K.quant_fp8(x, self.inv_scale_x, pdl)
        return torch._scaled_mm(x, self.wt, scale_a=self.scale_x, scale_b=self.scale_w, out_dtype=torch.bfloat16)


class LlamaWeights:
    """BF16 weights of a Llama model in fused layout, plus rope tables."""

    def __init__(self, dims: LlamaDims, tensors: dict[str, torch.Tensor], cos: torch.Tensor, sin: torch.Tensor):
        self.dims, self.t, self.cos, self.sin = dims, tensors, cos, sin

    @staticmethod
    def _rope(dims: LlamaDims, max_pos: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        rot = LlamaRotaryEmbedding(dims.hf_config(), device=device)
        pos = torch.arange(max_pos, device=device)[None]
        dummy = torch.zeros(1, device=device, dtype=torch.float32)
        cos, sin = rot(dummy, pos)
        half = dims.head_dim // 2
        return cos[0, :, :half].float().contiguous(), sin[0, :, :half].float().contiguous()

    @classmethod
    def random(cls, dims: LlamaDims, max_pos: int = 8192, seed: int = 0, std: float = 0.02) -> LlamaWeights:
        """Random weights (energy does not depend on trained values); no hub, no HF init."""
        dev = require_gpu()
        g = torch.Generator(device=dev).manual_seed(seed)

        def rnd(*shape):
            return (torch.randn(*shape, device=dev, generator=g, dtype=torch.float32) * std).to(torch.bfloat16)

        d = dims
        t: dict[str, torch.Tensor] = {
            "embed": rnd(d.vocab, d.hidden),
            "lm_head": rnd(d.vocab, d.hidden),
            "norm": torch.ones(d.hidden, device=dev, dtype=torch.bfloat16),
        }
        for i in range(d.num_layers):
            t[f"{i}.qkv"] = rnd((d.heads + 2 * d.kv_heads) * d.head_dim, d.hidden)
            t[f"{i}.o"] = rnd(d.hidden, d.heads * d.head_dim)
            t[f"{i}.gate_up"] = rnd(2 * d.intermediate, d.hidden)
            t[f"{i}.down"] = rnd(d.hidden, d.intermediate)
            t[f"{i}.ln1"] = torch.ones(d.hidden, device=dev, dtype=torch.bfloat16)
            t[f"{i}.ln2"] = torch.ones(d.hidden, device=dev, dtype=torch.bfloat16)
        return cls(dims, t, *cls._rope(dims, max_pos, dev))

    @classmethod
    def from_hf(cls, model, max_pos: int = 4096) -> LlamaWeights:
        """Fused copies of a loaded HF Llama's weights (for checking against the HF model)."""
        c = model.config
        dims = LlamaDims(
            c.num_hidden_layers,
            c.hidden_size,
            c.intermediate_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
            c.vocab_size,
            c.rms_norm_eps,
        )
        dev = require_gpu()
        m = model.model
        bf = lambda x: x.detach().to(dev, torch.bfloat16).contiguous()  # noqa: E731
        t = {"embed": bf(m.embed_tokens.weight), "lm_head": bf(model.lm_head.weight), "norm": bf(m.norm.weight)}
        for i, layer in enumerate(m.layers):
            a, mlp = layer.self_attn, layer.mlp
            t[f"{i}.qkv"] = bf(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
            t[f"{i}.o"] = bf(a.o_proj.weight)
            t[f"{i}.gate_up"] = bf(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
            t[f"{i}.down"] = bf(mlp.down_proj.weight)
            t[f"{i}.ln1"] = bf(layer.input_layernorm.weight)
            t[f"{i}.ln2"] = bf(layer.post_attention_layernorm.weight)
        rot = m.rotary_emb
        pos = torch.arange(max_pos, device=dev)[None]
        cos, sin = rot(torch.zeros(1, device=dev), pos)
        half = dims.head_dim // 2
        return cls(dims, t, cos[0, :, :half].float().contiguous(), sin[0, :, :half].float().contiguous())


def group_formats(plan_formats: Mapping[str, Format], num_layers: int) -> dict[str, Format]:
    """``layers.{i}.{kind}`` plan keys -> ``{i}.{kind}``; missing groups stay BF16."""
    out = {f"{i}.{k}": Format.BF16 for i in range(num_layers) for k in DENSE_GROUP_KINDS}
    for name, fmt in plan_formats.items():
        key = name.removeprefix("layers.")
        if key not in out:
            raise SetupError(f"plan group {name!r} is not a group of this {num_layers}-layer Llama")
        out[key] = Format(fmt)
    return out


class LlamaRuntime:
    """Runs one plan of a Llama model: prefill and decode, eager or CUDA-graph captured."""

    def __init__(
        self,
        weights: LlamaWeights,
        plan_formats: Mapping[str, Format],
        act_amax: Mapping[str, float] | None = None,
        decode_attention: str = "triton",
        linear_cache: dict | None = None,
        pdl: bool = False,
    ) -> None:
        self.w = weights
        self.dims = weights.dims
        fmts = group_formats(plan_formats, self.dims.num_layers)
        check_formats_supported(set(fmts.values()))
        self.formats = fmts
        self.decode_attention = decode_attention
        # Programmatic dependent launch of the Triton kernels: off by default, because
        # on an H100 it changed decode step times by -0.7% to +1.6% (it only overlaps
        # launches after cuBLAS GEMMs, which do not trigger early);
        # reports/benchmarks/decode_step_variants.md.
        self.pdl = pdl and torch.cuda.get_device_capability()[0] >= 9
        self.attention_splits: int | None = None  # None: kernels.decode_splits decides
        # ``linear_cache`` lets several runtimes (plans) share converted weights.
        cache = linear_cache if linear_cache is not None else {}
        self.lin = {}
        for k, f in fmts.items():
            if (k, f) not in cache:
                cache[(k, f)] = _Linear(weights.t[k], f, (act_amax or {}).get(k))
            self.lin[k] = cache[(k, f)]
        self.pos = torch.zeros(1, dtype=torch.long, device=weights.t["embed"].device)
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    # -- bookkeeping ----------------------------------------------------------
    def weight_bytes(self) -> int:
        """Bytes of every weight a decode step reads (linear groups + BF16 lm_head)."""
        return sum(lin.weight_bytes for lin in self.lin.values()) + self.w.t["lm_head"].numel() * 2

    def allocate_cache(self, batch: int, max_len: int) -> None:
        """Static KV cache [layers, batch, kv_heads, max_len, head_dim], random (not zeros)."""
        d = self.dims
        shape = (d.num_layers, batch, d.kv_heads, max_len, d.head_dim)
        dev = self.pos.device
        if self.k_cache is None or self.k_cache.shape != shape:
            self.k_cache = self.v_cache = None
            torch.cuda.empty_cache()
            self.k_cache = torch.randn(shape, device=dev, dtype=torch.bfloat16) * 0.5
            self.v_cache = torch.randn(shape, device=dev, dtype=torch.bfloat16) * 0.5

    def share_cache(self, other: LlamaRuntime) -> None:
        self.k_cache, self.v_cache = other.k_cache, other.v_cache

    # -- forward --------------------------------------------------------------
    def _inv(self, key: str):
        return self.lin[key].inv_scale_x

    def _reference_attention(self, qkv, kc, vc, b: int, length: int, ctx: int, pdl: bool) -> torch.Tensor:
        """Prefill attention (SDPA), and the eager decode variants the fused kernel is checked against."""
        d = self.dims
        q = K.rope_qkv(qkv, self.w.cos, self.w.sin, self.pos, kc, vc, b, length, d.heads, d.kv_heads, d.head_dim, pdl)
        kk, vv = kc[:, :, :ctx], vc[:, :, :ctx]
        if length > 1:
            att = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, scale=1.0, enable_gqa=True)
            return att.transpose(1, 2).reshape(b * length, d.heads * d.head_dim)
        qg = q.view(b, d.kv_heads, d.heads // d.kv_heads, d.head_dim)
        if self.decode_attention == "bmm":
            att = torch.matmul(torch.softmax(torch.matmul(qg, kk.transpose(-1, -2)), dim=-1), vv)
        else:
            att = F.scaled_dot_product_attention(qg, kk, vv, scale=1.0)
        return att.reshape(b, d.heads * d.head_dim)

    def forward(self, tokens: torch.Tensor, start: int, calib: dict | None = None) -> torch.Tensor:
        """Run ``tokens`` [B, L] at positions ``start..start+L-1``; logits of the last token.

        L == 1 is a decode step attending to ``start + 1`` cached tokens. ``calib``
        (a dict) records the amax of every group's input (BF16 groups only). The
        position lives in a device tensor, so a captured graph reads it at replay.
        """
        d = self.dims
        b, length = tokens.shape
        if not torch.cuda.is_current_stream_capturing():
            self.pos.fill_(start)
        ctx = start + length
        pdl = self.pdl
        resid = F.embedding(tokens.reshape(-1), self.w.t["embed"])
        first = True
        h_out = None
        for i in range(d.num_layers):
            lq, lo, lg, ld = (self.lin[f"{i}.{k}"] for k in DENSE_GROUP_KINDS)
            a = K.add_rmsnorm(
                resid if first else h_out,
                None if first else resid,
                self.w.t[f"{i}.ln1"],
                d.rms_eps,
                lq.inv_scale_x,
                pdl,
            )
            first = False
            if calib is not None:
                calib[f"{i}.qkv"] = max(calib.get(f"{i}.qkv", 0.0), a.float().abs().amax().item())
            qkv = lq(a)
            kc, vc = self.k_cache[i], self.v_cache[i]
            if length == 1 and self.decode_attention == "triton":
                att = K.decode_attention(
                    qkv,
                    self.w.cos,
                    self.w.sin,
                    self.pos,
                    kc,
                    vc,
                    ctx,
                    d.heads,
                    d.kv_heads,
                    d.head_dim,
                    inv_scale=lo.inv_scale_x,
                    splits=self.attention_splits,
                    pdl=pdl,
                )
            else:
                att = self._reference_attention(qkv, kc, vc, b, length, ctx, pdl)
            if calib is not None:
                calib[f"{i}.o"] = max(calib.get(f"{i}.o", 0.0), att.float().abs().amax().item())
            h = lo(att, pdl)
            m = K.add_rmsnorm(h, resid, self.w.t[f"{i}.ln2"], d.rms_eps, lg.inv_scale_x, pdl)
            if calib is not None:
                calib[f"{i}.gate_up"] = max(calib.get(f"{i}.gate_up", 0.0), m.float().abs().amax().item())
            gu = lg(m)
            act = K.silu_mul(gu, ld.inv_scale_x, pdl)
            if calib is not None:
                calib[f"{i}.down"] = max(calib.get(f"{i}.down", 0.0), act.float().abs().amax().item())
            h_out = ld(act)
        last = h_out.view(b, length, d.hidden)[:, -1].contiguous()
        resid_last = resid.view(b, length, d.hidden)[:, -1].contiguous()
        y = K.add_rmsnorm(last, resid_last, self.w.t["norm"], d.rms_eps, pdl=pdl)
        return F.linear(y, self.w.t["lm_head"])

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


def calibrate(weights: LlamaWeights, batch: int = 2, length: int = 256, seed: int = 0) -> dict[str, float]:
    """Per-group input amax of the BF16 model on random tokens (static FP8 activation scales)."""
    rt = LlamaRuntime(weights, {})
    rt.allocate_cache(batch, length)
    g = torch.Generator(device="cuda").manual_seed(seed)
    tokens = torch.randint(0, weights.dims.vocab, (batch, length), device="cuda", generator=g)
    calib: dict[str, float] = {}
    with torch.no_grad():
        rt.forward(tokens, start=0, calib=calib)
    rt.k_cache = rt.v_cache = None
    return calib
