"""The report's first screen: the decision in one sentence, the saving with its label, the accuracy
verdict with its interval, and what to run next. The tables follow it."""

from __future__ import annotations

from typing import Any


def _j_per_token(record: dict[str, Any], workload: str) -> float | None:
    return next((e["j_per_token"] for e in record["energy"] if e["workload"] == workload), None)


def _tier(record: dict[str, Any], workload: str) -> str:
    energy = next((e for e in record["energy"] if e["workload"] == workload), None)
    return energy["source"] if energy else "no number"  # the source names its tier: measured ... / predicted ...


def _verdict_line(record: dict[str, Any], max_drop: float | None) -> str:
    acceptance = record.get("acceptance")
    if not acceptance:
        return "Accuracy: judged by the proxy only (KL {:.4f}); no lm-eval task judged it.".format(record["kl"])
    parts = []
    for task in acceptance["tasks"]:
        if task["n_items"] == 0:
            parts.append(f"{task['task']}: {task['verdict']}")
            continue
        parts.append(f"{task['task']} drop {100 * task['drop']:+.1f} points "
                     f"[{100 * task['ci_low']:+.1f}, {100 * task['ci_high']:+.1f}] "
                     f"({task['confidence']:.1%} interval, {task['n_items']} items paired with BF16)")
    budget = f" against a budget of {100 * max_drop:.0f} points" if max_drop is not None else ""
    return f"Accuracy: **{acceptance['verdict']}**{budget}: " + "; ".join(parts) + "."


def operating_line(summary: dict[str, Any], plan_id: str, workload: str) -> list[str]:
    """Under the primary workload's latency objective: the batch to serve the recommendation at, on the points
    the choice compared (measured, labelled, or predicted), beside all-BF16's."""
    basis = (summary.get("operating_basis") or {}).get(workload)
    here = {p["plan_id"]: p for p in summary.get("operating_points") or [] if p["workload"] == workload}
    if basis is None or plan_id not in here:
        return []
    measured = bool(basis["measured"])

    def compared(point: dict[str, Any]) -> dict[str, Any]:
        return (point.get("measured") or {}) if measured else point

    def at(point: dict[str, Any]) -> str:
        p = compared(point)
        tpot = f", TPOT {p['tpot_ms']:.3g} ms" if p.get("tpot_ms") is not None else ""
        return f"batch {p['batch']} at {p['j_per_token']:.4g} J/token{tpot}"

    if not compared(here[plan_id]).get("meets"):
        return []
    bf16 = next((here[r["plan_id"]] for r in summary["trials"] if r["label"] == "all-bf16" and r["plan_id"] in here
                 and r["plan_id"] != plan_id), None)
    against = f", against all-BF16's {at(bf16)}" if bf16 is not None and compared(bf16).get("meets") else ""
    where = basis["label"] if measured else "predicted"
    return [f"Operating point under the objective on '{workload}', {where}: serve at {at(here[plan_id])}{against}.",
            ""]


def decision_lines(summary: dict[str, Any], run_dir: str = "RUN_DIR") -> list[str]:
    """The first lines of report.md (Markdown)."""
    rec = summary.get("recommendation")
    if not rec:
        return ["**Decision: none.** No trial finished; nothing to recommend.", ""]
    workload = summary["workloads"][0]["name"]
    bf16 = next((t for t in summary["trials"] if t["label"] == "all-bf16"), None)
    max_drop = (summary.get("benchmark") or {}).get("max_drop")
    if rec["label"] == "all-bf16":
        lines = [f"**Decision: keep BF16.** {rec['reason'][0].upper()}{rec['reason'][1:]}.", ""]
    else:
        mine, base = _j_per_token(rec, workload), _j_per_token(bf16, workload) if bf16 else None
        saving = (f"{1 - mine / base:.0%} less energy per token than all-BF16 on '{workload}' "
                  f"({mine:.4g} against {base:.4g} J/token)" if mine and base else "energy against BF16 unknown")
        lines = [f"**Decision: serve plan `{rec['plan_id']}` ({rec['label']})**: {saving}.", "",
                 f"Energy: {_tier(rec, workload)}.", "", *operating_line(summary, rec["plan_id"], workload),
                 _verdict_line(rec, max_drop), ""]
    lines += ["Next: `advisor export " + run_dir + " --out CHECKPOINT_DIR` writes the checkpoint TensorRT-LLM, vLLM "
              "and SGLang load; on a GPU with vLLM, `advisor verify " + run_dir + " --engine vllm` serves it and "
              "puts vLLM's formats, KL and J/token beside these.", ""]
    return lines
