"""acceptance.md from the acceptance.json that benchmarks/acceptance_smollm2.py writes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import md_table  # noqa: E402


def _pts(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}"


def replay_check(report: dict[str, Any]) -> list[dict[str, Any]]:
    """For each replayed budget: do the accepted plans' full-set drops stay within it on every task,
    and are the rejected ones over it on some task?"""
    full = {p["plan_id"]: {t["task"]: t["full_set_drop"] for t in p["tasks"]} for p in report["plans"]}
    out = []
    for r in report["replay"]:
        rows = []
        for p in r["plans"]:
            within = all(d <= r["max_drop"] for d in full[p["plan_id"]].values())
            agrees = {"passes": within, "fails": not within}.get(p["verdict"])
            rows.append({"plan_id": p["plan_id"], "verdict": p["verdict"], "full_set_within": within,
                         "agrees": agrees})
        out.append({"max_drop": r["max_drop"], "plans": rows,
                    "disagreements": sum(1 for x in rows if x["agrees"] is False)})
    return out


def _label(p: dict[str, Any]) -> str:
    return f"`{p['plan_id']}` {p['label']}" + (" (off the front)" if p.get("on_front") is False else "")


def _machine(m: dict[str, Any]) -> str:
    cpu = (f"{m['cores']} CPU cores (load average {', '.join(f'{x:.1f}' for x in m['load_average_at_start'])} at "
           f"the start), torch {m['torch_threads']} threads")
    if "gpu" in m:
        return f"{m['gpu']} (driver {m['driver']}, CUDA {m['cuda']}, power limit {m['power_limit_w']:.0f} W); {cpu}"
    return f"{m.get('device', m['cpu'])}; {cpu}"


def _model_check(check: dict[str, Any] | None) -> list[str]:
    """The same-weights evidence, when the run compared itself with another machine's load of the model."""
    if not check:
        return []
    out = [f"- model file: `{check['gguf_file']}` sha256 `{check['gguf_sha256']}`; BF16 weights sha256 "
           f"`{check['weights_sha256']}`"]
    other = check.get("other")
    if other:
        probe = check["probe_vs_other"]
        n, same = probe.get("positions", "?"), probe.get("same_argmax", "?")
        weights = "identical" if check["same_weights_as_other"] else "DIFFER"
        out.append(
            f"- same model as the {other['machine']['device']} run (transformers {other['versions']['transformers']}, "
            f"torch {other['versions']['torch']}): weights {weights}; logits on a {n}-token prompt: same arg-max at "
            f"{same} of {n} positions, largest difference {probe.get('max_abs_logit_diff', '?')} in a logit and "
            f"{probe.get('max_abs_logprob_diff', '?')} in the next token's log-probability")
    return [*out, ""]


def write_markdown(report: dict[str, Any], path: Path, notes: str = "") -> None:
    tasks = list(report["task_sets"])
    max_drop = report["max_drop"]
    md = [
        "# Sequential paired acceptance: SmolLM2-135M, the quickstart's front plans", "",
        f"- model: {report['model']}",
        f"- machine: {_machine(report['machine'])}",
        *([f"- run: `{r['command']}` on {r['date']}: {r['total_s'] / 60:.1f} min (setup {r['setup_s']:.0f} s, "
           f"load average {r['load_average_at_start'][0]:.1f} at the start); scored {', '.join(r['scored'])}"
           for r in report["runs"]] if report.get("runs") else [
            f"- date: {report['date']}; total {report['total_s'] / 60:.1f} min (setup {report['setup_s']:.0f} s)",
            f"- command: `{report['command']}`"]),
        f"- versions: {report['versions']}",
        f"- calibration: {report['calibration']}",
        f"- rule: a plan passes when, on every task, the upper bound of the {report['confidence']:.0%} interval of "
        f"its drop against BF16 (same items, paired) is within {100 * max_drop:g} points; fails when a lower bound "
        "exceeds it; else undecided. Items: the first n of a seeded order of the task "
        f"(seed {report['seed']}), n = {report['first_batch']}, doubling, up to the set below; a task is extended only "
        "while undecided; each look's interval is at level 1 - (1 - confidence) / looks, so all looks hold together.",
        "- sets: " + ", ".join(f"{t}: {s['items_used']} of {s['items_in_task']} items"
                               for t, s in report["task_sets"].items()),
        "",
    ]
    md = md[:-1] + (_model_check(report.get("model_check")) or [""])
    if notes:
        md += [notes, ""]
    md += ["## Sequential verdicts against the full sets", "",
           "Drops in points (BF16 minus plan; positive is worse). 'items' is what the sequential rule scored out of "
           "the set; the full-set columns score the whole set (one look, plain "
           f"{report['confidence']:.0%} interval).", ""]
    rows = []
    for p in report["plans"]:
        for t in p["tasks"]:
            rows.append([_label(p), f"**{p['verdict']}**", t["task"], t["verdict"],
                         f"{t['n_items']}/{t['n_available']}",
                         f"{_pts(t['drop'])} [{_pts(t['ci_low'])}, {_pts(t['ci_high'])}]",
                         f"{_pts(t['full_set_drop'])} [{_pts(t['full_set_ci_low'])}, {_pts(t['full_set_ci_high'])}]",
                         t["full_set_verdict"]])
    md += md_table(["plan", "plan verdict", "task", "task verdict", "items", "sequential drop [interval]",
                  "full-set drop [interval]", "full-set verdict"], rows)
    needed = sum(t["n_items"] for p in report["plans"] for t in p["tasks"])
    available = sum(t["n_available"] for p in report["plans"] for t in p["tasks"])
    md += ["", f"Items the sequential rule needed: {needed} of {available} ({100 * needed / available:.0f}%).", ""]
    check = report["full_set_check"]
    md += ["## Full-set check", "",
           f"- accepted: {check['accepted']}; within {100 * max_drop:g} points on every task's full set: "
           f"{check['accepted_and_within_on_full_sets']}",
           f"- rejected: {check['rejected']}; over on some task's full set: {check['rejected_and_over_on_full_sets']}",
           f"- undecided: {check['undecided']}",
           f"- disagreements: {len(check['disagreements'])}"
           + "".join(f"\n  - `{d['plan_id']}` ({d['verdict']}): full-set drops "
                     + ", ".join(f"{k} {_pts(v)}" for k, v in d["full_set_drops"].items())
                     for d in check["disagreements"]),
           ""]
    md += ["## The same rule at other budgets (replayed from the cached items)", ""]
    checks = {(c["max_drop"], x["plan_id"]): x for c in replay_check(report) for x in c["plans"]}
    rows = []
    for r in report["replay"]:
        for p in r["plans"]:
            check = checks[(r["max_drop"], p["plan_id"])]
            agree = {True: "yes", False: "**no**", None: "-"}[check["agrees"]]
            rows.append([f"{100 * r['max_drop']:g} pts", f"`{p['plan_id']}` {p['label']}", p["verdict"],
                         ", ".join(f"{t} {n}" for t, n in p["items"].items()),
                         "within" if check["full_set_within"] else "over", agree])
    md += md_table(["max_drop", "plan", "verdict", "items needed", "full-set drops vs max_drop",
                  "full-set check agrees"], rows) + [""]
    md += ["## Proxy calibration (quickstart KL against full-set drop)", ""]
    for f in report["proxy_calibration"]:
        rho = "n/a" if f["spearman"] is None else f"{f['spearman']:+.2f}"
        ci = f" [{f['spearman_ci'][0]:+.2f}, {f['spearman_ci'][1]:+.2f}]" if f["spearman_ci"] else ""
        slope = "n/a" if f["slope"] is None else (
            f"{100 * f['slope']:.0f} points per nat [{100 * f['slope_ci'][0]:.0f}, {100 * f['slope_ci'][1]:.0f}]")
        pairs = "; ".join(f"proxy prefers {a}, benchmark clearly prefers {b}" for a, b in f["contradicted_pairs"])
        md.append(f"- {f['task']}: {f['n_plans']} plans, Spearman {rho}{ci}, slope {slope}; "
                  f"{'disagrees beyond noise: ' + pairs if f['disagrees'] else 'no disagreement beyond noise'}")
    md += ["", "## Time per 100 items (s, this run, this machine)", ""]
    md += md_table(["plan", *tasks], [[label, *[str(v.get(t, "-")) for t in tasks]]
                                     for label, v in report["seconds_per_100_items"].items()]) + [""]
    path.write_text("\n".join(md))
