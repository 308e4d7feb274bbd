"""The report's operating-point section: each plan at its largest batch under each latency objective, and
what the search cost back (:mod:`advisor.search.operating`, :mod:`advisor.search.operating._payback`)."""

from __future__ import annotations

from typing import Any

from advisor.recipe.schema import MAX_CONCURRENCY
from advisor.search.operating import describe_days


def _objective(w: dict[str, Any]) -> str:
    parts = [f"TPOT <= {w['tpot_ms']:g} ms" if w.get("tpot_ms") is not None else "",
             f"TTFT <= {w['ttft_ms']:g} ms" if w.get("ttft_ms") is not None else ""]
    return " and ".join(p for p in parts if p) + f" ({w.get('percentile') or 'p50'}), at most " \
        f"{w.get('max_concurrency') or MAX_CONCURRENCY} in flight"


def _predicted_from(source: str, tpot_margin: float = 0.0) -> str:
    """What predicted batches rest on, by their label: the vLLM step model (:class:`~advisor.energy.prediction.
    VllmServedModel`'s label; ``tpot_margin``, the share of the TPOT objective its batches were kept under) or the
    built-in runtime's steps."""
    if source.startswith("predicted") and " step model: " in source and "vLLM " in source:
        kept = "each the largest whose predicted TPOT meets the objective"
        if tpot_margin:
            kept = (f"each the largest whose predicted TPOT is {tpot_margin:.1%} under the objective (its TPOT error "
                    "on shapes outside its fit)")
        return ("These batches come from a step model of vLLM as it serves (one pass a step over the decodes and the "
                f"prompt chunks joining them, on its CUDA-graph sizes), {kept}. Kept 3.5% under, 21 of 24 predicted "
                "batches of five such shapes (a MoE among them, on an H200) met their objective as vLLM served them, "
                "the other 3 one graph size above (reports/benchmarks/engine_true.md and energy_model.md in the "
                "advisor's repository).")
    return ("These batches come from the built-in runtime's step times, prefill and decode apart. An engine that runs "
            "a prefill and the decodes as one step can be slower there: in vLLM the measured TPOT at such predicted "
            "batches was above the objective (reports/benchmarks/operating_points_8b.md in the advisor's repository).")


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def operating_section(summary: dict[str, Any]) -> list[str]:
    points = summary.get("operating_points") or []
    if not points:
        return []
    rec = (summary.get("recommendation") or {}).get("plan_id")
    workloads = {w["name"]: w for w in summary["workloads"]}
    out = ["## Operating points under the latency objectives", "",
           "Each plan at the largest batch that meets the objective in a served steady state (requests in flight, "
           "each step carrying its share of new prefills; docs/architecture.md), bounded by the KV cache in the "
           "GPU's memory and the service's concurrency. The recommendation is chosen on these points: where "
           "every plan compared was measured, at the largest batch that met the objective as measured.", ""]
    for name in dict.fromkeys(p["workload"] for p in points):
        here = sorted((p for p in points if p["workload"] == name), key=lambda p: (not p["meets"], p["j_per_token"]))
        w = workloads.get(name, {})
        cap = here[0].get("power_cap_w")
        out += [f"### '{name}': {_objective(w)}, {w.get('input_tokens')} in / {w.get('output_tokens')} out"
                + (f", within a {cap:g} W power cap per GPU" if cap is not None else ""), ""]
        if not any(p["meets"] for p in here):
            out += ["**No plan meets this objective, not even at batch 1; BF16 is kept.** Relax the objective.", ""]
        elif ((summary.get("operating_basis") or {}).get(name) or {}).get("measured") and not any(
                (p.get("measured") or {}).get("meets") for p in here):
            out += ["**As measured, no plan meets this objective at any batch metered; BF16 is kept.** Relax the "
                    "objective.", ""]
        measured = any(p.get("measured") for p in here)
        rows = [[("**" if p["plan_id"] == rec else "") + f"{p['plan']} (`{p['plan_id'][:8]}`)"
                 + ("**" if p["plan_id"] == rec else ""),
                 str(p["batch"]) if p["meets"] else f"none (b1: {p['batch']})", p["bound"] if p["meets"] else "-",
                 f"{p['tpot_ms']:.3g}", f"{p['ttft_ms']:.3g}", f"{p['j_per_token']:.4g}", f"{p['tokens_per_s']:.0f}",
                 f"{p['power_w']:.0f}", *(_measured_cells(p.get("measured")) if measured else [])] for p in here[:12]]
        head = ["plan", "largest batch", "bound", "TPOT ms", "TTFT ms", "J/token", "tokens/s", "W"]
        out += [*_table(rows, [*head[:3], *(f"{h} (predicted)" for h in head[3:]), *MEASURED_HEAD] if measured
                        else head), ""]
        if len(here) > 12:
            out += [f"({len(here) - 12} more plans in summary.json)", ""]
        out += [f"{'Predicted' if measured else 'All predicted'}: {here[0]['source']}.", ""]
        if not measured:
            margin = max(p.get("tpot_margin") or 0.0 for p in here)
            out += [_predicted_from(here[0]["source"], margin) + " Meter them before serving at this concurrency: "
                    "`advisor verify RUN_DIR --engine vllm` on the GPU serves each plan there and, where one misses, "
                    "finds its largest batch that meets in vLLM.", ""]
        out += _measured_sources(here) + _searches(here) + _basis_lines(summary, name)
        out += _recommendation_as_measured(next((p for p in here if p["plan_id"] == rec), None))
    out += ["![time-energy frontier](operating_points.png)", ""]
    return out + payback_lines(summary)


MEASURED_HEAD = ["largest batch (measured)", "J/token (measured)", "TPOT ms (measured)", "TTFT ms (measured)",
                 "tokens/s (measured)", "meets (measured)"]


def _opt(x: Any, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def _measured_cells(m: dict[str, Any] | None) -> list[str]:
    """The point as measured at the same batch: numbers, and the objective met as measured."""
    if not m:
        return ["-"] * len(MEASURED_HEAD)
    if m.get("not_measured"):
        return ["not measured", *["-"] * (len(MEASURED_HEAD) - 1)]
    meets = {True: "yes", False: "**no**", None: "not timed"}[m.get("meets")]
    batch = str(m["batch"]) if m.get("meets") is not False else f"none (b{m['batch']})"
    return [batch, _opt(m.get("j_per_token"), ".4g"), _opt(m.get("tpot_ms"), ".3g"), _opt(m.get("ttft_ms"), ".3g"),
            _opt(m.get("tokens_per_s"), ".0f"), meets]


def _measured_words(m: dict[str, Any] | None) -> str:
    if not m or m.get("not_measured"):
        return ""
    tpot = f", TPOT {m['tpot_ms']:.4g} ms" if m.get("tpot_ms") is not None else ""
    where = f"batch {m['batch']}" if m.get("meets") is not False else f"no batch meets; batch {m['batch']}"
    return f" (measured: {where} at {m['j_per_token']:.4g} J/token{tpot})"


def _measured_sources(here: list[dict[str, Any]]) -> list[str]:
    found = [p["measured"] for p in here if p.get("measured")]
    sources = sorted({f"{m['source']}, at {m['measured_at']}" for m in found if not m.get("not_measured")})
    why = sorted({m["not_measured"] for m in found if m.get("not_measured")})
    out = [f"Measured from the predicted batch down: {'; '.join(sources)}." if sources else ""]
    out += [f"Not measured: {w}." for w in why]
    return [*(line for line in out if line), ""] if found else []


def _searches(here: list[dict[str, Any]]) -> list[str]:
    """Per measured plan: the batches metered (the trail), what the search concluded, and the prediction's error
    at the predicted batch."""
    out = []
    for p in here:
        m = p.get("measured") or {}
        trail = m.get("trail") or []
        if not trail:
            continue
        steps = ", ".join(f"{t['batch']} ({_opt(t.get('tpot_ms'), '.3g')} ms, "
                          f"{ {True: 'meets', False: 'misses', None: 'not timed'}[t.get('meets')]})" for t in trail)
        errors = m.get("prediction_error_pct") or {}
        error = "; at batch {} the prediction is off by {}".format(p["batch"], ", ".join(
            f"{name} {errors[key]:+.0f}%" for key, name in (("j_per_token", "J/token"), ("tpot_ms", "TPOT"))
            if key in errors)) if {"j_per_token", "tpot_ms"} & set(errors) else ""
        out.append(f"- {p['plan']}: metered batches {steps}: {m.get('search')}{error}.")
    return [*out, ""] if out else []


def _basis_lines(summary: dict[str, Any], name: str) -> list[str]:
    basis = (summary.get("operating_basis") or {}).get(name)
    if not basis:
        return []
    if basis["measured"]:
        return [f"The recommendation compared these plans at their operating points as measured: {basis['label']}.",
                ""]
    return [f"The recommendation compared the predicted points: {basis['note']}.", ""] if basis.get("note") else []


def _recommendation_as_measured(point: dict[str, Any] | None) -> list[str]:
    m = (point or {}).get("measured") or {}
    if point is None or not m:
        return []
    if m.get("meets") is False:
        return [f"**As measured, the recommendation meets this objective at no batch metered** ({m.get('search')}): "
                "serve it at a lower concurrency than any metered, or relax the objective.", ""]
    if m.get("meets") and m["batch"] != point["batch"]:
        return [f"**As measured, the recommendation meets this objective at batch {m['batch']}, not the predicted "
                f"{point['batch']}** (TPOT {_opt(m.get('tpot_ms'), '.3g')} ms): serve it at that concurrency.", ""]
    return []


def payback_lines(summary: dict[str, Any]) -> list[str]:
    pay = summary.get("payback")
    if not pay:
        return []
    return ["## What the search cost back", "",
            f"The search spent {pay['search_j'] / 3.6e6:.3g} kWh ({pay['search_j']:.4g} J; {pay['search_source']}). "
            f"At {pay['requests_per_s']:g} requests/s of '{pay['workload']}' ({pay['tokens_per_day']:.3g} tokens a "
            f"day; recipe `site.requests_per_s`) the recommendation saves {pay['saved_j_per_token']:.4g} J/token "
            f"against BF16, {pay['saved_j_per_day'] / 3.6e6:.3g} kWh a day (predicted): it pays the search back in "
            f"**{describe_days(pay['days'])}**.", ""]


def operating_lines(summary: dict[str, Any]) -> list[str]:
    """The console's short form: the recommended plan's and BF16's points per objective, and the payback."""
    rec = (summary.get("recommendation") or {}).get("plan_id")
    bf16 = {r["plan_id"] for r in summary["trials"] if set(r["formats"].values()) == {"bf16"}}
    out = []
    for name in dict.fromkeys(p["workload"] for p in summary.get("operating_points") or []):
        here = {p["plan_id"]: p for p in summary["operating_points"] if p["workload"] == name}
        shown = [here[i] for i in dict.fromkeys([rec, *sorted(bf16)]) if i in here]
        out.append(f"operating points on '{name}' (predicted): " + "; ".join(
            f"{p['plan']} batch {p['batch']} at {p['j_per_token']:.4g} J/token, TPOT {p['tpot_ms']:.3g} ms"
            + _measured_words(p.get("measured")) if p["meets"] else f"{p['plan']} meets no batch" for p in shown))
    pay = summary.get("payback")
    if pay:
        out.append(f"the search spent {pay['search_j']:.4g} J ({pay['search_source']}); paid back in "
                   f"{describe_days(pay['days'])} at {pay['requests_per_s']:g} requests/s")
    return out
