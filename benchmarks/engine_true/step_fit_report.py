"""The Markdown and the RMS summary of a ``vllm_step_fit.py`` report (a fit or a check): each row predicted against
served, the GPU's busy share measured against the step model's, and the operating batches a check's sweeps searched.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from _report import md_table  # noqa: E402

OBSERVED = ("tokens_per_s", "j_per_token", "tpot_ms", "ttft_ms")
BATCH_TOLERANCE_PCT = 10.0  # issue 56: the predicted largest batch within 10% of the largest that met as served


def _rms(values: list[float]) -> float | None:
    return math.sqrt(sum(v * v for v in values) / len(values)) if values else None


def summary(errors: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """RMS per observed quantity of the fitted rows and of the checks; where some rows were disturbed (the host
    held the GPU back: ServedRow.disturbed), of the checks without them too."""
    parts = [("fitted", lambda e: e["fitted"]), ("checks", lambda e: not e["fitted"])]
    if any(e.get("disturbed") for e in errors):
        parts.append(("checks, undisturbed", lambda e: not e["fitted"] and not e.get("disturbed")))
    return {part: {k: _rms([e[key][k] for e in errors if keep(e) and k in e[key]]) for k in OBSERVED}
            for part, keep in parts}


def markdown(report: dict[str, Any]) -> str:
    p = report["profile"]
    head = (f"# vLLM step profile, {p['gpu_kind'].upper()} ({p['gpu']}, driver {p['driver']}, vLLM "
            f"{p['vllm_version']}, {p['date']})" + (f", checked on rows of {report['date']} it was not fitted on"
                                                    if report.get("checked") else ""))
    lines = [head, "", f"Command: `{report['command']}`", "",
             "Engine terms (advisor/energy/prediction/_vllm_step.py): " + ", ".join(
                 f"{k} {v:.4g}" for k, v in p["params"].items()) + ".", "", p["source"], "",
             "RMS error, % (vLLM step model | built-in runtime's prediction):", ""]
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    rms = [[part] + [f"{pct(report['rms_pct'][part][k])} \\| {pct(report['builtin_rms_pct'][part][k])}"
                     for k in OBSERVED] for part in report["rms_pct"]]
    lines += md_table(["rows", *OBSERVED], rms) + ["", "## Rows", ""]
    body = []
    for e in report["rows"]:
        cell = [f"{e[k]:.4g}" if e.get(k) else "-" for k in OBSERVED]
        err = [f"{e['error_pct'][k]:+.1f} ({e['builtin_error_pct'][k]:+.1f})" if k in e["error_pct"] else "-"
               for k in OBSERVED]
        graph = e["max_capture_size"] if e["max_capture_size"] else "default"
        role = "yes" if e["fitted"] else "check" + (f" (disturbed: {e['disturbed']})" if e.get("disturbed") else "")
        busy = e.get("gpu_busy_pct")
        busy_cell = f"{busy:.0f} ({e['gpu_busy_pct_predicted']:.0f})" if busy is not None else \
            f"- ({e['gpu_busy_pct_predicted']:.0f})"
        body.append([e["plan"], str(e["batch"]), e["fp8_kernel"] or "-", str(graph), role, *cell, *err, busy_cell,
                     Path(e["source"].split(" [")[0]).name])
    lines += md_table(["plan", "batch", "FP8 kernel", "graph bound", "fitted", "tokens/s", "J/token", "TPOT ms",
                       "TTFT ms", "tokens/s err % (built-in)", "J/token err %", "TPOT err %", "TTFT err %",
                       "GPU busy % (predicted)", "file"], body)
    lines += ["", "Measured values are vLLM's (the advisor's NVML meter, steady load, p50 latencies); errors are "
              "predicted against measured; a row whose FP8 layers ran vLLM's CUTLASS kernel is a check: the "
              "advisor serves FP8 through cuBLASLt on Hopper (advisor/serving.py), and the profile prices that. "
              "GPU busy: NVML's share of the load's time a kernel ran, where the file kept it, and in brackets the "
              "step model's busy share of the row's steady state (the device's time and the per-sequence time; the "
              "fixed host time and the launches are the GPU's wait).", *busy_summary(report["rows"]), ""]
    return "\n".join(lines)


def busy_summary(rows: list[dict[str, Any]]) -> list[str]:
    """A line comparing the GPU busy share NVML measured with the step model's, over the undisturbed rows that
    kept it."""
    kept = [e for e in rows if e.get("gpu_busy_pct") is not None and not e.get("disturbed")]
    if not kept:
        return []
    measured = [e["gpu_busy_pct"] for e in kept]
    predicted = [e["gpu_busy_pct_predicted"] for e in kept]
    return ["", f"Over the {len(kept)} undisturbed rows that kept it, the GPU was busy "
            f"{sum(measured) / len(kept):.1f}% of the time as measured ({min(measured):.0f}-{max(measured):.0f}%); "
            f"the step model says {sum(predicted) / len(kept):.1f}% ({min(predicted):.0f}-{max(predicted):.0f}%)."]



def objectives_markdown(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    within = [r for r in rows if r["batch_error_pct"] is not None and abs(r["batch_error_pct"]) <= BATCH_TOLERANCE_PCT]
    body = [[r["shape"], r["plan"], r["objective"], str(r["predicted_batch"]), str(r["predicted_when_served"]),
             str(r["largest_met"] or "none"), "-" if r["batch_error_pct"] is None else f"{r['batch_error_pct']:+.1f}",
             r["search"]] for r in rows]
    return ["", "## The operating batch: predicted against the largest that met as vLLM served it", "",
            f"Within {BATCH_TOLERANCE_PCT:.0f}%: {len(within)} of {len(rows)} (the search meters vLLM's CUDA-graph "
            "sizes only, so one graph size is the finest it resolves). 'Largest met': the largest batch any metering "
            "of the engine met the objective at (TPOT p50), the sweep's fixed batches included; the error is this "
            "code's prediction's.", "",
            *md_table(["shape", "plan", "objective", "predicted batch", "predicted when served", "largest met",
                       "error %", "search (as served)"], body)]
