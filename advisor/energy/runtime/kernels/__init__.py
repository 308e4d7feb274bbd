"""Fused Triton kernels of the serving runtime (imported only where torch and triton exist).

Each kernel replaces several eager PyTorch launches, so that a CUDA-graph decode
step is made of GEMMs, attention and one small kernel between each:

* ``add_rmsnorm``: residual add + RMSNorm (+ FP8 quantization of the output with a
  static per-tensor scale, so the next GEMM reads FP8 directly); with ``x_weight``
  the added input is normalized first (Gemma's post-attention/post-MLP norms), so a
  Gemma layer has as many kernels as a Llama one;
* ``decode_attention``: one decode step's attention straight from the fused qkv
  GEMM output: per-head q/k RMSNorm where the family has it, rotary embedding of q
  and of the new k, the new k and v written into the KV cache, flash-decoding over
  the cached context or only its sliding window (split over programs when the batch
  alone cannot fill the GPU), score soft-capping where the family has it, and the
  output in BF16 or FP8. Head dims that are not a power of two run padded and masked;
* ``rope_qkv``: rotary embedding for prefill (q written head-major, k and v into
  the KV cache);
* ``gated_act``: SiLU(gate) * up or GELU-tanh(gate) * up (+ FP8 quantization);
  ``silu_mul`` is the SiLU one;
* ``quant_fp8``: per-tensor static FP8 quantization (prefill attention output).

``pdl=True`` launches a kernel with programmatic dependent launch (Hopper and
newer): the GPU may start it while the kernel before it drains, and it waits in
``griddepcontrol.wait`` before touching anything that kernel wrote. It does not pay
(the GEMMs before these kernels do not trigger early:
reports/benchmarks/decode_step_variants.md), so the runtime leaves it off unless asked.
"""


from advisor.energy.runtime.kernels.attention import decode_attention
from advisor.energy.runtime.kernels.attention_policy import decode_splits, head_tiles
from advisor.energy.runtime.kernels.elementwise import (
    GATED_ACTIVATIONS,
    add_rmsnorm,
    gated_act,
    quant_fp8,
    rope_qkv,
    silu_mul,
)

__all__ = [
    "GATED_ACTIVATIONS",
    "add_rmsnorm",
    "decode_attention",
    "decode_splits",
    "gated_act",
    "head_tiles",
    "quant_fp8",
    "rope_qkv",
    "silu_mul",
]
