"""NVFP4 parity: our CPU kernel (advisor.quantize.nvfp4_cpu) against ModelOpt's CUDA path.

Needs an NVIDIA GPU of compute capability >= 8.9 (ModelOpt's Triton NVFP4 kernel).
Three CUDA references, all ModelOpt's own code:

* ``fp4_fake_quant_block``: the Triton kernel that ModelOpt's fake quantization runs
  (``tensorrt::dynamic_block_quantize_op`` on CUDA);
* a ``TensorQuantizer`` built from ``NVFP4_DEFAULT_CFG``'s weight quantizer, on CUDA
  against the same quantizer on CPU (where ``prepare_device('cpu')`` registers ours);
* 4-bit codes and FP8 block scales from a small Triton kernel made of ModelOpt's own
  JIT building blocks (``fp8_quantize_scale``, ``fp4_round_magnitude`` from
  ``modelopt/torch/kernels/quantization/common/nvfp4_quant.py``), step for step the
  fake-quant kernel, but writing codes and scales instead of their product.

Cases: random tensors (several shapes, bf16 and fp32, per-block magnitudes spread
over 1e-8..1e4 so that block scales saturate and underflow in FP8), exact rounding
ties, zero blocks; and one real SmolLM2 layer (weight and a captured activation),
through its calibrated ModelOpt ``QuantLinear``.

Usage (on the GPU machine):  python benchmarks/studies/nvfp4_parity.py --out reports/nvfp4_cpu_parity
The accuracy benchmark calls :func:`run_random` and :func:`run_layer` in its own run.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import math
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

warnings.simplefilter("ignore")

BLOCK = 16
E2M1_THRESHOLDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


# ---------------------------------------------------------------- CPU side (ours)


def cpu_codes_scales(x: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Signed E2M1 values per element and float32 block scales, from advisor.quantize.nvfp4_cpu."""
    from advisor.quantize.nvfp4_cpu import e2m1_round_magnitude, nvfp4_block_scales

    blocks = x.float().reshape(-1, BLOCK)
    scale = nvfp4_block_scales(x, amax, BLOCK)
    q = e2m1_round_magnitude(blocks.abs() / scale)
    return torch.where(blocks >= 0, q, -q), scale.reshape(-1)


def register_cpu_kernel() -> None:
    """The product's own registration (advisor.quantize.nvfp4_cpu), which must work on the GPU's torch too."""
    from advisor.quantize.modelopt_config import prepare_device

    prepare_device("cpu")


# ---------------------------------------------------------------- CUDA side (ModelOpt)

_codes_kernel = None


def _build_codes_kernel():
    global _codes_kernel
    if _codes_kernel is not None:
        return _codes_kernel
    import triton
    import triton.language as tl
    from modelopt.torch.kernels.quantization.common.nvfp4_quant import fp4_round_magnitude, fp8_quantize_scale

    @triton.jit
    def kernel(x_ptr, q_ptr, s_ptr, n_blocks, gs_ptr, BLOCK_SIZE: tl.constexpr, ROWS: tl.constexpr):
        pid = tl.program_id(0)
        rows = pid * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_SIZE)
        offs = rows[:, None] * BLOCK_SIZE + cols[None, :]
        mask = rows[:, None] < n_blocks
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        gs = tl.load(gs_ptr).to(tl.float32)
        gs = tl.where(gs > 0.0, gs, 1e-12)  # as fp4_fake_quant_kernel
        xa = tl.abs(x)
        bmax = tl.max(xa, axis=1, keep_dims=True)
        s = fp8_quantize_scale(bmax, gs)
        s = tl.where(s >= 1e-5, s, 1.0)
        q = fp4_round_magnitude(xa / s)
        q = tl.where(x >= 0, q, -q)
        tl.store(q_ptr + offs, q, mask=mask)
        tl.store(s_ptr + rows, tl.reshape(s, (ROWS,)), mask=rows < n_blocks)

    _codes_kernel = kernel
    return kernel


def cuda_codes_scales(x: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    import triton

    kernel = _build_codes_kernel()
    xc = x.reshape(-1, BLOCK).contiguous()
    n_blocks = xc.shape[0]
    q = torch.empty(xc.shape, dtype=torch.float32, device=x.device)
    s = torch.empty(n_blocks, dtype=torch.float32, device=x.device)
    gs = (amax.float() / (6.0 * 448.0)).reshape(1).to(x.device)
    rows = 64
    kernel[(triton.cdiv(n_blocks, rows),)](xc, q, s, n_blocks, gs, BLOCK_SIZE=BLOCK, ROWS=rows)
    return q, s


def cuda_fake_quant(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    from modelopt.torch.kernels.quantization.gemm import fp4_fake_quant_block

    return fp4_fake_quant_block(x, amax.to(x.device))


def nvfp4_weight_quantizer():
    from modelopt.torch.quantization.config import QuantizerAttributeConfig
    from modelopt.torch.quantization.nn import TensorQuantizer

    from advisor.formats import Format
    from advisor.quantize.modelopt_config import format_quantizer_cfg

    return TensorQuantizer(QuantizerAttributeConfig(**format_quantizer_cfg(Format.NVFP4)["weight_quantizer"]))


# ---------------------------------------------------------------- comparison


def _near_threshold(ratio64: torch.Tensor) -> torch.Tensor:
    """Elements whose exact |x|/scale lies within 2 fp32 ulps of an E2M1 rounding threshold."""
    near = torch.zeros_like(ratio64, dtype=torch.bool)
    for t in E2M1_THRESHOLDS:
        ulp32 = math.ulp(t) * 2**29  # float32 has 29 fewer mantissa bits than float64
        near |= (ratio64 - t).abs() <= 2 * ulp32
    return near


def compare(name: str, x_cpu: torch.Tensor, amax: torch.Tensor, y_ref_cpu: torch.Tensor,
            y_ours: torch.Tensor, codes: tuple | None = None, scales: tuple | None = None) -> dict[str, Any]:
    """Mismatch counts (elements, blocks), max abs diff, and why any element differs."""
    diff = (y_ref_cpu.float() - y_ours.float()).abs().reshape(-1)
    bad = ~((y_ref_cpu.float() == y_ours.float()) | (y_ref_cpu.isnan() & y_ours.isnan())).reshape(-1)
    out: dict[str, Any] = {
        "case": name, "shape": list(x_cpu.shape), "dtype": str(x_cpu.dtype).replace("torch.", ""),
        "elements": x_cpu.numel(), "blocks": x_cpu.numel() // BLOCK,
        "amax": float(amax), "output_mismatch_elements": int(bad.sum()),
        "output_mismatch_blocks": int(bad.reshape(-1, BLOCK).any(1).sum()),
        "max_abs_diff": float(diff.max()) if diff.numel() else 0.0,
    }
    if codes is not None:
        qc, qo = codes
        out["code_mismatch_elements"] = int((qc.reshape(-1) != qo.reshape(-1)).sum())
    if scales is not None:
        sc, so = scales
        out["scale_mismatch_blocks"] = int((sc.reshape(-1) != so.reshape(-1)).sum())
    if out["output_mismatch_elements"] or out.get("code_mismatch_elements"):
        from advisor.quantize.nvfp4_cpu import nvfp4_block_scales

        scale = nvfp4_block_scales(x_cpu, amax, BLOCK).double()
        ratio = (x_cpu.double().reshape(-1, BLOCK).abs() / scale).reshape(-1)
        mism = bad if codes is None else bad | (codes[0].reshape(-1) != codes[1].reshape(-1))
        near = _near_threshold(ratio)
        out["mismatches_at_rounding_threshold"] = int((mism & near).sum())
        out["mismatches_elsewhere"] = int((mism & ~near).sum())
        idx = mism.nonzero().reshape(-1)[:5].tolist()
        out["examples"] = [
            {"index": i, "x": float(x_cpu.reshape(-1)[i]), "x_over_scale_exact": float(ratio[i]),
             "cuda": float(y_ref_cpu.reshape(-1)[i]), "cpu": float(y_ours.reshape(-1)[i])}
            for i in idx
        ]
    return out


# ---------------------------------------------------------------- cases


def random_cases(seed: int = 0):
    """(name, tensor on CPU) pairs."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(16,), (4, 64), (128, 576), (3, 7, 1536), (576, 1536)]
    for dtype in (torch.bfloat16, torch.float32):
        for shape in shapes:
            x = torch.randn(shape, generator=g)
            yield f"randn{list(shape)}", x.to(dtype)
            # per-block magnitudes spread over 1e-8 .. 1e4 (FP8 scales saturate/underflow)
            n_blocks = x.numel() // BLOCK
            mag = 10 ** (torch.rand(n_blocks, 1, generator=g) * 12 - 8)
            spread = (x.reshape(-1, BLOCK) * mag).reshape(shape)
            yield f"spread1e-8..1e4{list(shape)}", spread.to(dtype)
        heavy = torch.distributions.StudentT(2.0).sample((256, 512)).to(dtype)
        yield "student_t2[256, 512]", heavy
        # exact ties: every element sits on an E2M1 threshold or value for a power-of-two scale
        vals = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 0.0, -6.0])
        ties = torch.cat([vals * 2.0**k for k in range(-6, 7)] + [-vals, vals.flip(0)]).reshape(-1, BLOCK)
        yield "ties[15, 16]", ties.to(dtype)
        zeros = torch.zeros(8, 32)
        zeros[1, :16] = 1e-30
        zeros[2, 16:] = torch.randn(16, generator=g)
        yield "zero_and_tiny_blocks[8, 32]", zeros.to(dtype)


def run_random(device: str = "cuda", seed: int = 0) -> list[dict[str, Any]]:
    from advisor.quantize.nvfp4_cpu import nvfp4_fake_quant

    register_cpu_kernel()
    tq_cuda, tq_cpu = nvfp4_weight_quantizer().to(device), nvfp4_weight_quantizer()
    rows = []
    for name, x in random_cases(seed):
        amax = x.float().abs().amax()
        xd = x.to(device)
        y_ref = cuda_fake_quant(xd, amax.to(device)).cpu()
        y_ours = nvfp4_fake_quant(x, amax)
        codes_ref, scales_ref = cuda_codes_scales(xd, amax.to(device))
        codes_ours, scales_ours = cpu_codes_scales(x, amax)
        row = compare(name, x, amax, y_ref, y_ours, (codes_ref.cpu(), codes_ours), (scales_ref.cpu(), scales_ours))
        with torch.no_grad():
            tq_ref, tq_ours = tq_cuda(xd).cpu(), tq_cpu(x)
        row["tensor_quantizer_mismatch_elements"] = int((tq_ref != tq_ours).sum())
        row["tensor_quantizer_max_abs_diff"] = float((tq_ref.float() - tq_ours.float()).abs().max())
        rows.append(row)
    return rows


@torch.no_grad()
def run_layer(weight: torch.Tensor, input_quantizer: torch.nn.Module, activation: torch.Tensor,
              name: str) -> dict[str, Any]:
    """One real layer on CUDA against CPU copies with our kernel.

    ``weight``: the layer's BF16 weight (CUDA), quantized by a fresh NVFP4 weight quantizer;
    ``input_quantizer``: the layer's calibrated ModelOpt NVFP4 input quantizer (static amax);
    ``activation``: a real input of the layer (CUDA).
    """
    register_cpu_kernel()
    wq_d, wq_c = nvfp4_weight_quantizer().to(weight.device), nvfp4_weight_quantizer()
    iq_d, iq_c = input_quantizer, copy.deepcopy(input_quantizer).cpu()
    out: dict[str, Any] = {"layer": name, "weight_shape": list(weight.shape),
                           "activation_shape": list(activation.shape)}
    operands = {}
    for part, q_d, q_c, t_d in (("weight", wq_d, wq_c, weight), ("activation", iq_d, iq_c, activation)):
        t_c = t_d.cpu()
        ref, ours = q_d(t_d), q_c(t_c)
        operands[part] = (ref, ours)
        amax = q_d.amax if q_d.amax is not None else t_d.float().abs().amax()
        amax = amax.float().reshape(-1).amax().cpu()
        codes_ref, scales_ref = cuda_codes_scales(t_d, amax.to(t_d.device))
        codes_ours, scales_ours = cpu_codes_scales(t_c, amax)
        row = compare(f"{name}.{part}", t_c, amax, ref.cpu(), ours, (codes_ref.cpu(), codes_ours),
                      (scales_ref.cpu(), scales_ours))
        row["quantizer_amax"] = float(amax)
        out[part] = row
    (x_d, x_c), (w_d, w_c) = operands["activation"], operands["weight"]
    y_d = torch.nn.functional.linear(x_d, w_d).float().cpu()
    y_c = torch.nn.functional.linear(x_c, w_c).float()
    rel = (y_d - y_c).abs().max() / y_d.abs().max().clamp_min(1e-30)
    out["output"] = {
        "max_abs_diff": float((y_d - y_c).abs().max()), "max_abs_output": float(y_d.abs().max()),
        "max_rel_diff": float(rel), "mismatch_elements": int((y_d != y_c).sum()), "elements": y_d.numel(),
        "note": "same quantized operands; the BF16 GEMM itself differs between cuBLAS and the CPU "
                "(accumulation order), so the output is equal up to float rounding",
    }
    return out


def summarize(random_rows: list[dict[str, Any]], layer: dict[str, Any] | None) -> dict[str, Any]:
    keys = ("output_mismatch_elements", "output_mismatch_blocks", "code_mismatch_elements",
            "scale_mismatch_blocks", "tensor_quantizer_mismatch_elements")
    total = {k: sum(r.get(k, 0) for r in random_rows) for k in keys}
    total["elements"] = sum(r["elements"] for r in random_rows)
    total["blocks"] = sum(r["blocks"] for r in random_rows)
    total["max_abs_diff"] = max(r["max_abs_diff"] for r in random_rows)
    total["mismatches_at_rounding_threshold"] = sum(r.get("mismatches_at_rounding_threshold", 0) for r in random_rows)
    total["mismatches_elsewhere"] = sum(r.get("mismatches_elsewhere", 0) for r in random_rows)
    return {"random_total": total, "layer": layer}


def write_markdown(result: dict[str, Any], path: Path) -> None:
    s = result["summary"]["random_total"]
    lines = [
        "# NVFP4 parity: advisor CPU kernel vs ModelOpt CUDA path", "",
        f"- device: {result['device']}; date: {result['date']}; command: `{result['command']}`",
        f"- torch {result['versions']['torch']}, triton {result['versions'].get('triton')}, "
        f"nvidia-modelopt {result['versions']['modelopt']}", "",
        "## Random tensors (all cases together)", "",
        f"- elements: {s['elements']}, blocks: {s['blocks']}",
        f"- fake-quant output mismatches vs `fp4_fake_quant_block` (Triton): {s['output_mismatch_elements']} "
        f"elements in {s['output_mismatch_blocks']} blocks; max abs diff {s['max_abs_diff']:g}",
        f"- 4-bit code mismatches: {s['code_mismatch_elements']}; FP8 block-scale mismatches: "
        f"{s['scale_mismatch_blocks']} blocks",
        f"- `TensorQuantizer` (NVFP4 weight config) CUDA vs CPU mismatches: {s['tensor_quantizer_mismatch_elements']}",
        f"- mismatches with |x|/scale within 2 fp32 ulps of a rounding threshold: "
        f"{s['mismatches_at_rounding_threshold']}; elsewhere: {s['mismatches_elsewhere']}", "",
        "| case | dtype | elements | out mism. (elem/blocks) | code mism. | scale mism. | TQ mism. | max abs diff |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["random"]:
        lines.append(
            f"| {r['case']} | {r['dtype']} | {r['elements']} | {r['output_mismatch_elements']}/"
            f"{r['output_mismatch_blocks']} | {r['code_mismatch_elements']} | {r['scale_mismatch_blocks']} | "
            f"{r['tensor_quantizer_mismatch_elements']} | {r['max_abs_diff']:g} |"
        )
    layer = result["summary"].get("layer")
    if layer:
        lines += ["", f"## Real layer: SmolLM2-135M `{layer['layer']}` (calibrated ModelOpt NVFP4 QuantLinear)", ""]
        for part in ("weight", "activation"):
            r = layer[part]
            lines.append(
                f"- {part} {r['shape']} ({r['dtype']}), amax {r['quantizer_amax']:.6g}: output mismatches "
                f"{r['output_mismatch_elements']} elements / {r['output_mismatch_blocks']} blocks, code mismatches "
                f"{r['code_mismatch_elements']}, scale mismatches {r['scale_mismatch_blocks']}, max abs diff "
                f"{r['max_abs_diff']:g}"
            )
        o = layer["output"]
        lines.append(
            f"- layer output (CUDA BF16 GEMM vs CPU BF16 GEMM on the same quantized operands): max abs diff "
            f"{o['max_abs_diff']:.3g} of max |y| {o['max_abs_output']:.3g} (relative {o['max_rel_diff']:.2g})"
        )
    lines += ["", "## Notes", "", result.get("notes", "")]
    path.write_text("\n".join(lines) + "\n")


def versions() -> dict[str, str]:
    import modelopt

    v = {"torch": torch.__version__, "modelopt": modelopt.__version__}
    try:
        import triton

        v["triton"] = triton.__version__
    except ImportError:
        pass
    return v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("reports/nvfp4_cpu_parity"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layer", type=Path, help="torch file {name, weight, activation} of one real layer")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("nvfp4_parity needs a CUDA GPU (compute capability >= 8.9)")
    rows = run_random("cuda", args.seed)
    layer = None
    if args.layer:
        saved = torch.load(args.layer)
        iq = nvfp4_weight_quantizer()  # NVFP4 input and weight quantizer attributes are the same preset
        x = saved["activation"].cuda()
        iq.amax = x.float().abs().amax()  # static amax, as max calibration on this batch would set
        layer = run_layer(saved["weight"].cuda(), iq.cuda(), x, saved["name"])
    result = {
        "device": torch.cuda.get_device_name(), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv), "versions": versions(), "random": rows, "summary": summarize(rows, layer),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "parity.json").write_text(json.dumps(result, indent=2))
    write_markdown(result, args.out / "parity.md")
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
