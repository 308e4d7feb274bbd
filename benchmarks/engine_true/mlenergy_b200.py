"""The B200 vLLM step profile anchored on ML.ENERGY's public B200 measurements, and the engine_true report's
ML.ENERGY section: its Llama-3.1-8B rows (B200 and H100, batch 8-256) against the advisor's prediction, and the
held-out models' rows as a check.

ML.ENERGY Leaderboard v3 (github.com/ml-energy/leaderboard, ``public/data/models/*.json``; vLLM 0.11.1, steady
state, J per output token, one GPU) measured the same model on B200 and H100 with the same software. The advisor
has no B200 of its own: its B200 step costs are derived from datasheets. The bridge: the H100 vLLM step model
(this project's fit on its own H100 measurements, vLLM 0.26.0) predicts ML.ENERGY's H100 rows under ML.ENERGY's
serving settings; what it misses there (vLLM 0.11.1 against 0.26.0, the prompts' length) is taken to hold on
B200 too, so the B200 device time and energy scales are fitted to make B200's prediction miss ML.ENERGY's B200 rows
as the H100 one misses its H100 rows, batch by batch (robust least squares on the log ratios of J/token and
tokens/s). Only the ``meta-llama__Llama-3.1-8B-Instruct`` files are fitted on; every other file is held out.
The B200 profile's other terms (host time, launches) are the H100 profile's: they are the CPU's.

    python benchmarks/engine_true/mlenergy_b200.py --fit ML/meta-llama__Llama-3.1-8B-Instruct__lm-arena-chat.json \
        --heldout ML/Qwen__Qwen3-8B__lm-arena-chat.json ML/Qwen__Qwen3-14B__lm-arena-chat.json \
        ML/Qwen__Qwen3-30B-A3B-Instruct-2507__lm-arena-chat.json --ml-commit COMMIT
    (ML: a folder of the files read out of a checkout of github.com/ml-energy/leaderboard,
    ``git show COMMIT:public/data/models/NAME.json > ML/NAME.json``; they are not kept in this repository, only the
    numbers the report quotes)
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[1])]
os.environ.setdefault("ADVISOR_PROFILE_DIR", tempfile.mkdtemp())  # the shipped profiles only, never a user's

from _report import ENGINE_TRUE_TITLE, command_line, dump_json, md_table, write_sections  # noqa: E402
from mlenergy_shapes import FIT_PREFIX, FP8_KINDS, shape_of  # noqa: E402

from advisor.energy.prediction import (  # noqa: E402
    VllmServedModel,
    VllmServing,
    make_predicted_model,
    predicted_for_gpus,
)
from advisor.energy.profiling import shipped_vllm_profile  # noqa: E402
from advisor.formats import GPU, GPU_SPECS, Format  # noqa: E402
from advisor.plan import Plan  # noqa: E402
from advisor.recipe.schema import Workload  # noqa: E402

INPUT_TOKENS = 512  # the files give output lengths only (module notes in the report say why 512)
SENSITIVITY_INPUTS = (256, 1024)
BATCHES = (8, 16, 32, 64, 128, 256)
#: vLLM's OpenAI server (ML.ENERGY serves through it): max_num_batched_tokens on a GPU of >= 70 GiB
#: (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults, the same in 0.11 and 0.26)
SERVER_BATCHED_TOKENS = 8192
ML_VLLM = "0.11.1"


def ml_rows(path: str, batches: tuple[int, ...] = BATCHES, gpus: str = "one") -> list[dict[str, Any]]:
    """A file's rows at ``batches`` (max_num_seqs), H100 and B200: served on one GPU (``gpus`` "one") or over
    several (``gpus`` "several", tensor parallel: vLLM's default for a model spread over a node's GPUs)."""
    data = json.loads(Path(path).read_text())
    return [{"file": Path(path).name, "model": data["model_id"], "gpu": c["gpu_model"].lower(), "gpus": c["num_gpus"],
             "batch": c["max_num_seqs"], "avg_batch": c["avg_batch_size"], "output_tokens": round(c["avg_output_len"]),
             "j_per_token": c["energy_per_token_joules"], "tokens_per_s": c["output_throughput_tokens_per_sec"],
             "median_itl_ms": c["median_itl_ms"], "power_w": c["avg_power_watts"]}
            for c in data["configurations"]
            if (c["num_gpus"] == 1) == (gpus == "one") and c["max_num_seqs"] in batches
            and c["gpu_model"].lower() in ("h100", "b200")]


class Predictor:
    """The advisor's prediction of an ML.ENERGY row: the vLLM step model of the row's GPU kind, on the row's GPU
    count (tensor parallel over several), in the formats of the published checkpoint (BF16, or
    :data:`~mlenergy_shapes.FP8_KINDS`), under ML.ENERGY's serving settings (vLLM's own CUDA-graph bound and its
    OpenAI server's token budget)."""

    def __init__(self, profiles: dict[str, dict[str, Any]]) -> None:
        self.profiles = profiles
        self._models: dict[tuple[str, str, int], VllmServedModel] = {}

    def model(self, model_id: str, gpu: str, gpus: int = 1) -> VllmServedModel:
        if (model_id, gpu, gpus) not in self._models:
            shape, config = shape_of(model_id)
            builtin = (make_predicted_model(shape, GPU(gpu), model_config=config) if gpus == 1
                       else predicted_for_gpus(shape, GPU(gpu), gpus, model_config=config))
            self._models[(model_id, gpu, gpus)] = VllmServedModel(builtin, shape, GPU(gpu), self.profiles[gpu])
        return self._models[(model_id, gpu, gpus)]

    @staticmethod
    def plan(model_id: str, m: VllmServedModel) -> Plan:
        fp8 = FP8_KINDS.get(model_id, ())
        return Plan({g.name: Format.FP8 if g.name.rsplit(".", 1)[-1] in fp8 else Format.BF16 for g in m.shape.groups})

    def __call__(self, row: dict[str, Any], input_tokens: int = INPUT_TOKENS) -> dict[str, float]:
        m = self.model(row["model"], row["gpu"], row.get("gpus", 1))
        w = Workload(name="ml", batch_size=row["batch"], input_tokens=input_tokens,
                     output_tokens=row["output_tokens"])
        s = m.served_state(self.plan(row["model"], m), w, row["batch"],
                           serving=VllmServing.vllm_defaults(row["batch"], SERVER_BATCHED_TOKENS))
        return {"j_per_token": s.j_per_token, "tokens_per_s": s.tokens_per_s, "tpot_ms": s.tpot_ms}


def fit_b200(rows: list[dict[str, Any]], h100: dict[str, Any], b200_base: dict[str, Any]) -> tuple[dict, dict]:
    """B200's device time and energy scales that make its prediction miss each B200 row as the H100 prediction
    misses the H100 row of the same batch; the bridge (H100 measured over predicted, per batch and quantity)."""
    from scipy.optimize import least_squares

    predict_h100 = Predictor({"h100": h100})
    h = {r["batch"]: r for r in rows if r["gpu"] == "h100"}
    b = {r["batch"]: r for r in rows if r["gpu"] == "b200" and r["batch"] in h}
    bridge = {n: {k: h[n][k] / predict_h100(h[n])[k] for k in ("j_per_token", "tokens_per_s")} for n in b}

    def residuals(x) -> list[float]:
        profile = {**b200_base, "params": {**b200_base["params"], "device_time_scale": x[0],
                                           "device_energy_scale": x[1]}}
        predict = Predictor({"b200": profile})
        out = []
        for n, row in b.items():
            pred = predict(row)
            out += [math.log(pred[k] * bridge[n][k] / row[k]) for k in ("j_per_token", "tokens_per_s")]
        return out

    res = least_squares(residuals, [1.0, 1.0], bounds=([0.2, 0.2], [5.0, 5.0]), loss="soft_l1", f_scale=0.1,
                        diff_step=1e-3)
    return {"device_time_scale": float(res.x[0]), "device_energy_scale": float(res.x[1])}, bridge


def compare(rows: list[dict[str, Any]], profiles: dict[str, dict[str, Any]], inputs: tuple[int, ...] = ()
            ) -> list[dict[str, Any]]:
    predict = Predictor(profiles)
    out = []
    for r in rows:
        p = predict(r)
        row = {**r, "predicted": p, "error_pct": {k: 100 * (p[k] / r[k] - 1) for k in ("j_per_token", "tokens_per_s")}}
        row["j_error_pct_at_input"] = {n: 100 * (predict(r, n)["j_per_token"] / r["j_per_token"] - 1) for n in inputs}
        row["builtin_error_pct"] = builtin_error(predict, r)
        out.append(row)
    return out


def builtin_error(predict: Predictor, row: dict[str, Any]) -> float:
    """The error of the built-in runtime's prediction (the predicted tier before the vLLM step model) of a row's
    J/token, in percent."""
    from advisor.search.operating import steady_state

    m = predict.model(row["model"], row["gpu"], row.get("gpus", 1))
    w = Workload(name="ml", batch_size=row["batch"], input_tokens=INPUT_TOKENS, output_tokens=row["output_tokens"])
    s = steady_state(m.builtin, predict.plan(row["model"], m), w, row["batch"])
    return 100 * (s.j_per_token / row["j_per_token"] - 1)


def unanchored(profile: dict[str, Any]) -> dict[str, Any]:
    """``profile`` (B200's) with its anchor's scales taken off: the datasheet-derived device costs as they are."""
    return {**profile, "params": {**profile["params"], "device_time_scale": 1.0, "device_energy_scale": 1.0}}


def compare_several(rows: list[dict[str, Any]], profiles: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`compare` for rows served over several GPUs, with B200's rows also priced without the anchor (what the
    8B-fitted scales do to a model whose GPUs each hold several times the 8B's weights)."""
    out = compare(rows, profiles)
    bare = Predictor({**profiles, "b200": unanchored(profiles["b200"])})
    for r in out:
        if r["gpu"] == "b200":
            p = bare(r)
            r["unanchored_error_pct"] = {k: 100 * (p[k] / r[k] - 1) for k in ("j_per_token", "tokens_per_s")}
    return out


def several_summary(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Per GPU kind, the span of the errors of the rows served over several GPUs: what the label says of them."""
    out = {}
    for gpu in sorted({r["gpu"] for r in rows}):
        mine = [r for r in rows if r["gpu"] == gpu]
        j, t = ([r["error_pct"][k] for r in mine] for k in ("j_per_token", "tokens_per_s"))
        models = sorted({f"{r['model'].split('/')[-1]} on {r['gpus']}" for r in mine})
        out[gpu] = (f"ML.ENERGY's {', '.join(models)} {gpu.upper()}s (held out, batch 8-256): J/token "
                    f"{min(j):+.0f}% to {max(j):+.0f}%, tokens/s {min(t):+.0f}% to {max(t):+.0f}%")
    return out


SECTION = "ML.ENERGY Llama-3.1-8B rows (B200 and H100, batch 8-256) against the advisor's prediction"


def table(rows: list[dict[str, Any]], inputs: tuple[int, ...]) -> list[str]:
    body = [[r["model"].split("/")[-1], r["gpu"].upper(), str(r["batch"]), str(r["output_tokens"]),
             f"{r['j_per_token']:.4f}", f"{r['predicted']['j_per_token']:.4f}", f"{r['error_pct']['j_per_token']:+.1f}",
             f"{r['builtin_error_pct']:+.1f}",
             *[f"{r['j_error_pct_at_input'][str(n)]:+.1f}" for n in inputs],
             f"{r['tokens_per_s']:.0f}", f"{r['predicted']['tokens_per_s']:.0f}",
             f"{r['error_pct']['tokens_per_s']:+.1f}"]
            for r in rows]
    return md_table(["model", "GPU", "batch", "output tokens (mean)", "J/token measured (ML.ENERGY)",
                     "J/token predicted", "error %", "built-in runtime's prediction, error %",
                     *[f"error % at {n} in" for n in inputs], "tokens/s measured", "tokens/s predicted",
                     "error %"], body, "lll" + "r" * (len(inputs) + 8))


def several_table(rows: list[dict[str, Any]]) -> list[str]:
    def bare(r: dict[str, Any], k: str) -> str:
        return f"{r['unanchored_error_pct'][k]:+.1f}" if "unanchored_error_pct" in r else "-"

    body = [[r["model"].split("/")[-1], f"{r['gpus']} x {r['gpu'].upper()}", str(r["batch"]),
             f"{r['j_per_token']:.3f}", f"{r['predicted']['j_per_token']:.3f}", f"{r['error_pct']['j_per_token']:+.1f}",
             bare(r, "j_per_token"), f"{r['tokens_per_s']:.0f}", f"{r['predicted']['tokens_per_s']:.0f}",
             f"{r['error_pct']['tokens_per_s']:+.1f}", bare(r, "tokens_per_s")] for r in rows]
    return md_table(["model", "GPUs", "batch", "J/token measured (ML.ENERGY)", "J/token predicted", "error %",
                     "error %, B200 unanchored", "tokens/s measured", "tokens/s predicted", "error %",
                     "error %, B200 unanchored"], body, "lll" + "r" * 8)


def section_markdown(s: dict[str, Any]) -> list[str]:
    return [*s["notes"], "", *table(s["rows"], tuple(int(n) for n in s["inputs_checked"])), "",
            f"Within 15% (J/token): {s['within_15pct']} of {len(s['rows'])} rows.", "",
            "### Held-out models (not fitted on)", "",
            *table(s["heldout"], ()), "",
            f"Within 15% (J/token): {s['heldout_within_15pct']} of {len(s['heldout'])} rows.",
            *(["", "### Held-out models served over several GPUs (tensor parallel)", "", *s["several_notes"], "",
               *several_table(s["several"]), "",
               f"Within 15% (J/token): {s['several_within_15pct']} of {len(s['several'])} rows."]
              if s.get("several") else [])]


def main(argv: list[str] | None = None) -> None:
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--fit", nargs="+", required=True, help=f"ML.ENERGY files named {FIT_PREFIX}*")
    a.add_argument("--heldout", nargs="*", default=[], help="other models' ML.ENERGY files (checks only)")
    a.add_argument("--ml-commit", required=True, help="the ml-energy/leaderboard commit the files were read at")
    a.add_argument("--profile-out", default="advisor/energy/profiles/vllm/b200.json")
    a.add_argument("--report", default="reports/benchmarks/engine_true")
    args = a.parse_args(argv)
    if bad := [f for f in args.fit if not Path(f).name.startswith(FIT_PREFIX)]:
        raise SystemExit(f"only {FIT_PREFIX}* files are fitted on; held out: {bad}")
    if bad := [f for f in args.heldout if Path(f).name.startswith(FIT_PREFIX)]:
        raise SystemExit(f"{bad} is fitted on; it cannot be held out too")
    h100 = shipped_vllm_profile(GPU.H100)
    if h100 is None:
        raise SystemExit("no H100 vLLM step profile: fit it first (benchmarks/engine_true/vllm_step_fit.py)")
    fit_rows = [r for f in args.fit for r in ml_rows(f)]
    spec = GPU_SPECS[GPU.B200]
    base = {**h100, "gpu": "NVIDIA B200 (datasheet-derived device costs)", "gpu_kind": "b200", "driver": "n/a",
            "date": datetime.date.today().isoformat(),
            "params": {**h100["params"], "gap_power_w": spec.idle_w}}
    scales, bridge = fit_b200(fit_rows, h100, base)
    files = sorted(Path(f).name for f in args.fit)
    label = (f"B200: BF16 device time x{scales['device_time_scale']:.3f} and energy over idle "
             f"x{scales['device_energy_scale']:.3f} anchored on ML.ENERGY v3's {', '.join(files)} B200 runs (vLLM "
             f"{ML_VLLM}) bridged through its H100 runs; FP8 and NVFP4 relative to BF16 datasheet-derived (fitted on "
             "no B200 measurement of them); host terms the H100's")
    command = command_line(argv)
    profile = {**base, "params": {**base["params"], **{k: round(v, 6) for k, v in scales.items()}},
               "free": list(scales), "command": command,
               "source": (f"Device costs: the shipped datasheet-derived B200 profiles. {label}. Bridge (ML.ENERGY H100 "
                          "measured over this project's H100 vLLM step model, per batch): " + "; ".join(
                              f"b{n}: J x{v['j_per_token']:.3f}, tokens/s x{v['tokens_per_s']:.3f}"
                              for n, v in sorted(bridge.items())) + "."),
               "anchor": {"label": label, "repository": "github.com/ml-energy/leaderboard", "commit": args.ml_commit,
                          "files": files, "vllm_version": ML_VLLM, "input_tokens_assumed": INPUT_TOKENS,
                          "batches": sorted(bridge), **{k: round(v, 6) for k, v in scales.items()}}}
    profiles = {"h100": h100, "b200": profile}
    several = compare_several([r for f in args.heldout for r in ml_rows(f, gpus="several")
                               if not shape_of(r["model"])[0].is_moe], profiles)
    if b200_several := several_summary(several).get("b200"):
        profile["anchor"]["several_gpus"] = f"checked on {b200_several}"
    dump_json(Path(args.profile_out), profile, indent=1, newline=True)
    rows = compare(fit_rows, profiles, SENSITIVITY_INPUTS)
    held = compare([r for f in args.heldout for r in ml_rows(f)], profiles)
    section = {
        "notes": notes(args.ml_commit, files, [Path(f).name for f in args.heldout]),
        "rows": rows, "inputs_checked": list(SENSITIVITY_INPUTS), "anchor": profile["anchor"],
        "bridge": {str(n): v for n, v in bridge.items()},
        "within_15pct": sum(abs(r["error_pct"]["j_per_token"]) <= 15 for r in rows),
        "heldout": held, "heldout_within_15pct": sum(abs(r["error_pct"]["j_per_token"]) <= 15 for r in held),
        "several": several, "several_within_15pct": sum(abs(r["error_pct"]["j_per_token"]) <= 15 for r in several),
        "several_notes": several_notes(several)}
    section["header"] = {
        "gpu": ("NVIDIA B200 and H100 (ML.ENERGY v3, public data: their measurements); NVIDIA H100 80GB HBM3 (this "
                f"project's vLLM step profile, {h100['date']})"),
        "driver": f"not published by ML.ENERGY; {h100['driver']} (this project's H100 measurements)",
        "date": f"ML.ENERGY v3 (2025-12-01, files at {args.ml_commit[:7]}); this project's fit {h100['date']}",
        "command": command,
        "vllm_version": f"{ML_VLLM} (ML.ENERGY's runs); {h100['vllm_version']} (this project's step profile)"}
    section = json.loads(json.dumps(section))  # rendered as it is kept: its batches' keys are strings there
    section["markdown"] = section_markdown(section)
    write_sections(Path(args.report), ENGINE_TRUE_TITLE, SECTION, section)
    print(json.dumps({"scales": scales, "within_15pct": section["within_15pct"], "rows": len(rows),
                      "heldout_within_15pct": section["heldout_within_15pct"], "heldout": len(held),
                      "several_within_15pct": section["several_within_15pct"], "several": len(several)}, indent=1))


def several_notes(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    spans = several_summary(rows)
    return [
        "- **What is checked.** The held-out files' rows served over several GPUs (dense models only: the "
        "tensor-parallel prediction does not price routed experts), each priced by the advisor's tensor-parallel "
        "predicted tier (`advisor/energy/prediction/_tensor_parallel.py`: one GPU's shard from the GPU profile, its "
        "all-reduces assumed, not measured) under that GPU kind's vLLM step model, in the published checkpoint's "
        "formats: BF16, or for Llama-3.1-405B-Instruct-FP8 its feed-forward layers in FP8 and attention in BF16 "
        "(Meta's model card; per-channel FBGEMM FP8 as vLLM runs it, where the advisor prices per-tensor FP8: assumed "
        "close).",
        "- **'B200 unanchored'**: the same B200 rows priced with the datasheet-derived device costs as they are, the "
        "anchor's device time and energy scales (fitted on the 8B on one GPU) taken off. The anchor's time scale "
        "(the 8B's B200 steps were that much slower than the datasheet says) does not carry over to a GPU holding "
        "several times the 8B's weights; unanchored, the errors are smaller at small batches and still grow with the "
        "batch, on H100 too. Under vLLM's default graph bound every step a prompt joins runs uncaptured, and the step "
        "model adds its launches to it (312 us a layer: 25 ms for the 70B's 80 layers); timed on one H200 they hide "
        "under a long step (`vllm_eager_steps_h200.md`), and priced so the H100 rows lose their drift, but the "
        "H200's served checks got worse, so the added launches stay (`reports/energy_model.md`).",
        *[f"- {gpu.upper()}: {span}." for gpu, span in spans.items()],
    ]


def notes(commit: str, fitted: list[str], heldout: list[str]) -> list[str]:
    return [
        f"- **Public data and this project's.** Measured: ML.ENERGY Leaderboard v3's rows (github.com/ml-energy/"
        f"leaderboard at {commit[:7]}, `public/data/models/`: {', '.join(fitted)}; vLLM {ML_VLLM}, one GPU, steady "
        "state, J per output token, batch = max_num_seqs 8-256); only the numbers quoted here are taken from them. "
        "Predicted: this project's vLLM step model (H100: its own profile fitted on its H100 measurements with vLLM "
        "0.26.0, `reports/benchmarks/vllm_step_fit_h100.md`; B200: the datasheet-derived device costs, anchored as "
        "below), BF16, under ML.ENERGY's serving settings (vLLM's own CUDA-graph bound, min(2 x max_num_seqs, 512), "
        f"and its OpenAI server's {SERVER_BATCHED_TOKENS}-token budget), each row's mean output length.",
        f"- **Input length: {INPUT_TOKENS} tokens assumed.** The files give output lengths only (LM Arena "
        "conversations, about 400 tokens out on average for this model); they do not say how long the prompts were. "
        "512 is this project's reference prompt (its verify and operating-point runs serve 512 in); the columns "
        "'error % at 256 / 1024 in' show what the assumption moves: the prefill's share of J/token, and the steps "
        "that run eagerly under vLLM's default graph bound when a prompt joins them.",
        "- **The B200 anchor.** Fitted on the Llama-3.1-8B file only: B200's device time and energy-over-idle scales "
        "make the B200 prediction miss each B200 row as the H100 prediction misses ML.ENERGY's H100 row of the same "
        "batch (the bridge: what vLLM 0.11.1 against 0.26.0 and the prompt length do on H100 is taken to do the same "
        "on B200; ML.ENERGY's notes say the vLLM version alone moved J/token 15-41% on H100). Robust least squares: "
        "a row far off the others (B200 batch 128: slower than batch 64 at 449 W) weighs little. FP8 and NVFP4 on "
        "B200 keep their datasheet-derived ratio to BF16: no one-GPU measurement of them exists (the FP8 405B over "
        "four B200s is checked below, not fitted).",
        f"- **Held out**: {', '.join(heldout) or 'none'}; priced with the same profiles, never fitted on.",
    ]


if __name__ == "__main__":
    main()
