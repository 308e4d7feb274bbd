"""Fused Triton kernels of the serving runtime (imported only where torch and triton exist).

Each kernel replaces several eager PyTorch launches, so that a CUDA-graph decode
step is made of GEMMs, attention and one small kernel between each:

* ``add_rmsnorm``: residual add + RMSNorm (+ FP8 quantization of the output with a
  static per-tensor scale, so the next GEMM reads FP8 directly);
* ``decode_attention``: one decode step's attention straight from the fused qkv
  GEMM output: rotary embedding of q and of the new k, the new k and v written
  into the KV cache, flash-decoding over the cached context (split over programs
  when the batch alone cannot fill the GPU), and the output in BF16 or FP8;
* ``rope_qkv``: rotary embedding for prefill (q written head-major, k and v into
  the KV cache);
* ``silu_mul``: SiLU(gate) * up (+ FP8 quantization);
* ``quant_fp8``: per-tensor static FP8 quantization (prefill attention output).

``pdl=True`` launches a kernel with programmatic dependent launch (Hopper and
newer): the GPU may start it while the kernel before it drains, and it waits in
``griddepcontrol.wait`` before touching anything that kernel wrote. Measured on an
H100 it did not pay (the GEMMs before these kernels do not trigger early), so the
runtime leaves it off unless asked.
"""


from advisor.energy.kernels.attention import decode_attention, decode_splits
from advisor.energy.kernels.elementwise import add_rmsnorm, quant_fp8, rope_qkv, silu_mul

__all__ = ["add_rmsnorm", "decode_attention", "decode_splits", "quant_fp8", "rope_qkv", "silu_mul"]
