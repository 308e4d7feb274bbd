"""The report's first screen: the decision in one sentence, the saving with its label, the accuracy
verdict with its interval, and what to run next. The tables follow it."""

from __future__ import annotations

from typing import Any

from advisor.search.frontier import percent_less


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


def _compared_points(summary: dict[str, Any], plan_id: str, workload: str
                     ) -> tuple[dict[str, Any], dict[str, Any] | None, str] | None:
    """Under ``workload``'s latency objective, the points the rule compared (the measured twins where the basis is
    measured, else the predicted points): the plan's, all-BF16's (None where BF16 meets no batch) and the basis's
    words. None where the workload states no objective or the plan meets it at no batch on that basis."""
    basis = (summary.get("operating_basis") or {}).get(workload)
    here = {p["plan_id"]: p for p in summary.get("operating_points") or [] if p["workload"] == workload}
    if basis is None or plan_id not in here:
        return None
    measured = bool(basis["measured"])

    def compared(point: dict[str, Any]) -> dict[str, Any]:
        return (point.get("measured") or {}) if measured else point

    mine = compared(here[plan_id])
    if not mine.get("meets"):
        return None
    bf16 = next((compared(here[r["plan_id"]]) for r in summary["trials"] if r["label"] == "all-bf16"
                 and r["plan_id"] in here and r["plan_id"] != plan_id), None)
    return mine, (bf16 if bf16 is not None and bf16.get("meets") else None), basis["label"] if measured else "predicted"


def operating_line(summary: dict[str, Any], plan_id: str, workload: str) -> list[str]:
    """Under the primary workload's latency objective: the batch to serve the recommendation at, on the points
    the choice compared (measured, labelled, or predicted), beside all-BF16's."""
    points = _compared_points(summary, plan_id, workload)
    if points is None:
        return []
    mine, bf16, where = points

    def at(p: dict[str, Any]) -> str:
        tpot = f", TPOT {p['tpot_ms']:.3g} ms" if p.get("tpot_ms") is not None else ""
        return f"batch {p['batch']} at {p['j_per_token']:.4g} J/token{tpot}"

    against = f", against all-BF16's {at(bf16)}" if bf16 is not None else ""
    return [f"Operating point under the objective on '{workload}', {where}: serve at {at(mine)}{against}.", ""]


def _objective_saving(summary: dict[str, Any], plan_id: str, workload: str) -> str | None:
    """The saving the rule chose on: the plan at its largest batch under the objective against all-BF16 at its own
    (None where the workload states no objective, or either meets it at no batch)."""
    points = _compared_points(summary, plan_id, workload)
    if points is None or points[1] is None or not points[1]["j_per_token"]:
        return None
    mine, bf16, where = points
    return (f"{percent_less(mine['j_per_token'], bf16['j_per_token'])} less energy per token than all-BF16 under "
            f"the objective on '{workload}' (batch {mine['batch']} at {mine['j_per_token']:.4g} against batch "
            f"{bf16['batch']} at {bf16['j_per_token']:.4g} J/token, {where})")


def _fixed_saving(rec: dict[str, Any], bf16: dict[str, Any] | None, workload: str, scope: str) -> str | None:
    """The saving at the workload's stated batch (None where either J/token is unknown)."""
    mine, base = _j_per_token(rec, workload), _j_per_token(bf16, workload) if bf16 else None
    if not mine or not base:
        return None
    return (f"{percent_less(mine, base)} less energy per token than all-BF16{scope} "
            f"({mine:.4g} against {base:.4g} J/token)")


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
        saving = _objective_saving(summary, rec["plan_id"], workload)
        at_batch: list[str] = []
        if saving is None:
            saving = _fixed_saving(rec, bf16, workload, f" on '{workload}'") or "energy against BF16 unknown"
        elif (fixed := _fixed_saving(rec, bf16, workload, "")) is not None:
            batch = summary["workloads"][0].get("batch_size")
            at_batch = [f"At the fixed batch{f' {batch}' if batch else ''} that '{workload}' states: {fixed}.", ""]
        lines = [f"**Decision: serve plan `{rec['plan_id']}` ({rec['label']})**: {saving}.", "",
                 f"Energy: {_tier(rec, workload)}.", "", *operating_line(summary, rec["plan_id"], workload),
                 *at_batch, _verdict_line(rec, max_drop), ""]
    lines += ["Next: `advisor export " + run_dir + " --out CHECKPOINT_DIR` writes the checkpoint TensorRT-LLM, vLLM "
              "and SGLang load; on a GPU with vLLM, `advisor verify " + run_dir + " --engine vllm` serves it and "
              "puts vLLM's formats, KL and J/token beside these.", ""]
    return lines
