"""report.md from a summary: the front, the baselines, the recommendation and the label of every number."""

from __future__ import annotations

from typing import Any

from advisor.estimate import DriftCheck
from advisor.report.decision import decision_lines
from advisor.report.operating_md import operating_section, payback_lines
from advisor.search.measured import largest_drift_pct


def _fmt_j(x: float) -> str:
    return f"{x:.4g}"


def _table(rows: list[list[str]], header: list[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def energy_tier(r: dict) -> str:
    """'measured' or 'predicted': which tier a trial record's J/token came from (the front mixes both)."""
    return "measured" if r.get("energy_measured") else "predicted"


def energy_sources(r: dict) -> str:
    """The labels of a trial record's own J/token numbers."""
    return "; ".join(sorted({e["source"] for e in r["energy"]}))


def _j_per_token(r: dict[str, Any], which: str = "energy") -> dict[str, float]:
    """workload -> J/token of a trial record's ``energy`` (measured where it exists) or ``predicted_energy``."""
    return {e["workload"]: e["j_per_token"] for e in r[which]}


def _row(r: dict, workloads: list[str]) -> list[str]:
    energies = _j_per_token(r)
    return [
        str(r["trial"]), f"`{r['plan_id']}`", r["label"], f"{r['effective_bits']:.2f}",
        f"{r['kl']:.4f}", f"{r['ppl']:.2f} ({r['ppl_increase_pct']:+.1f}%)",
        *[_fmt_j(energies[w]) for w in workloads], energy_tier(r), "yes" if r["feasible"] else "no",
    ]


def _measured_vs_predicted(summary: dict[str, Any], workloads: list[str]) -> list[str]:
    """Both energy tiers side by side for the plans measured after the search."""
    rows = []
    for r in {r["plan_id"]: r for r in summary["trials"] if r.get("energy_measured")}.values():
        pred, meas = _j_per_token(r, "predicted_energy"), _j_per_token(r)
        err = r.get("prediction_error_pct") or {}
        rows.append([f"`{r['plan_id']}`", r["label"],
                     *[f"{_fmt_j(pred[w])} / {_fmt_j(meas[w])} ({err.get(w, float('nan')):+.1f}%)"
                       for w in workloads]])
    if not rows:
        return []
    return ["## Energy: predicted / measured", "",
            "Every trial was priced by the predicted tier; these plans were then measured on the GPU, and their "
            "measured J/token is what the front and the recommendation use (only measured plans compete once any "
            "is measured). In brackets: the prediction's error against the measurement.", "",
            _table(rows, ["plan id", "plan", *[f"J/token {w}" for w in workloads]]), "",
            *_drift_lines(summary), *_unit_lines(summary)]


def _unit_lines(summary: dict[str, Any]) -> list[str]:
    """With plans measured on two or more GPUs: whether the units' all-BF16 agree within the drift."""
    units, check = summary.get("measured_units") or [], summary.get("unit_agreement")
    if len(units) < 2 or not check:
        return []
    named = "; ".join(f"{u['gpu']} {u['gpu_uuid'] or ''} ({len(u['plans'])} plans, all-BF16 "
                      f"{_fmt_j(check['reference_j_per_token'].get(u['gpu_uuid'] or u['gpu'], float('nan')))} J/token)"
                      for u in units)
    spread = f"their all-BF16 differ by {check['spread_pct']:.1f}% on '{check['workload']}'"
    if check["agree"] is None:
        verdict = f"{spread}; no drift check gives a tolerance, so the units were not compared"
    elif check["agree"]:
        verdict = f"{spread}, within the largest drift a unit showed against itself ({check['tolerance_pct']:.1f}%)"
    else:
        verdict = (f"the units disagree: {spread}, more than the largest drift a unit showed against itself "
                   f"({check['tolerance_pct']:.1f}%); so each plan measured on another GPU is put on "
                   f"{check.get('scaled_to')}'s scale by the ratio of the two GPUs' all-BF16, and its source says so")
    return [f"Measured on {len(units)} GPUs: {named}; {verdict}.", ""]


def _drift_lines(summary: dict[str, Any]) -> list[str]:
    """Each measured stage's drift check: the reference measured again at its end."""
    checks = summary.get("measured_drift") or []
    if not checks:
        return ["No drift check recorded: the reference was the only plan measured in its stage, or the study "
                "was measured before the check existed.", ""]
    out = ["Drift checks (the reference measured again at the end of each measured stage, against its first "
           "measurement; plans measured apart can differ by this much with no difference between them):", ""]
    out += [f"- {c['measured_at']}: {c['plan']} (`{c['plan_id']}`) "
            + ", ".join(f"{_fmt_j(c['first_j_per_token'][w])} -> {_fmt_j(c['again_j_per_token'][w])} J/token "
                        f"({c['drift_pct'][w]:+.1f}%) on '{w}'" for w in c["drift_pct"])
            for c in checks]
    return [*out, ""]


def near_ties_line(summary: dict[str, Any]) -> str:
    """The measured plans the drift checks cannot order against the recommendation ("" where none)."""
    ties = summary.get("near_ties") or []
    rec = summary.get("recommendation")
    if not ties or not rec:
        return ""
    by_trial = {r["trial"]: r for r in summary["trials"]}
    primary = summary["workloads"][0]["name"]
    drift = largest_drift_pct([DriftCheck.from_dict(c) for c in summary["measured_drift"]], primary)
    named = "; ".join(f"trial {t} ({by_trial[t]['label']}, KL {by_trial[t]['kl']:.4f}, "
                      f"{_fmt_j(_j_per_token(by_trial[t])[primary])} J/token)" for t in ties)
    return (f"Measured within {drift:.1f}% of this plan on '{primary}', the largest drift the checks saw, so the "
            f"measurements do not order them: {named}.")


def _kv_cache_effect(summary: dict[str, Any], workloads: list[str]) -> list[str]:
    """Plans scored with both KV-cache formats and the same weights: what FP8 KV changes per workload."""
    by_weights: dict[str, dict[str, dict]] = {}
    for r in summary["trials"]:
        key = repr(sorted(r["formats"].items()))
        by_weights.setdefault(key, {}).setdefault(r.get("kv_cache", "bf16"), r)
    rows = []
    for pair in by_weights.values():
        if "bf16" not in pair or "fp8" not in pair:
            continue
        a, b = pair["bf16"], pair["fp8"]
        ea, eb = _j_per_token(a), _j_per_token(b)
        rows.append([a["label"], f"`{a['plan_id']}` / `{b['plan_id']}`", f"{a['kl']:.4f} -> {b['kl']:.4f}",
                     *[f"{_fmt_j(ea[w])} -> {_fmt_j(eb[w])} ({100 * (eb[w] / ea[w] - 1):+.1f}%)" for w in workloads]])
    if not rows:
        return []
    return ["## KV cache: BF16 -> FP8", "",
            "Plans scored with both KV-cache formats and the same weights (KV format per plan: the `+ fp8 KV` in "
            "its name). FP8 KV halves the KV bytes a decode step reads, so it saves most at long contexts and large "
            "batches; its KL is measured with ModelOpt's FP8 k/v quantizers (FP8_KV_CFG).", "",
            _table(rows, ["weights", "plan ids (BF16 KV / FP8 KV)", "KL", *[f"J/token '{w}'" for w in workloads]]),
            ""]


def _serving_engines(summary: dict[str, Any]) -> list[str]:
    """Which engines can serve the recommended plan, and a warning per known problem (advisor.serving)."""
    from advisor.plan import Plan
    from advisor.serving import NOT_RUN, compatibility_table, compatibility_warnings, engine_compatibility

    rec = summary.get("recommendation")
    if not rec:
        return []
    plan = Plan(rec["formats"], rec.get("kv_cache", "bf16"))
    verdicts = engine_compatibility(plan, summary["target"])
    warnings = compatibility_warnings(verdicts)
    return ["## Serving engines (recommended plan)", "", f"Which engines can serve plan `{plan.id}` ({NOT_RUN}):",
            "", *compatibility_table(verdicts), "", *[f"- Warning: {w}" for w in warnings], *([""] if warnings else [])]


def _architecture_lines(shape: dict[str, Any]) -> list[str]:
    """The family, what was searched, and the layer features the energy numbers price."""
    if not shape.get("family"):
        return []  # a shape stored before adapters existed
    layers = shape.get("layers", [])
    facts = [f"{len(layers)} layers", f"{len(shape['groups'])} searched groups"]
    sliding = sum(1 for g in layers if g.get("sliding_window"))
    if sliding:
        facts.append(f"{sliding} sliding-window layers")
    moe = [g for g in layers if g.get("num_experts")]
    if moe:
        facts.append(f"{len(moe)} MoE layers ({moe[0]['num_experts']} experts, top-{moe[0]['top_k']}; "
                     "routers stay BF16; a layer's experts share one format)")
    line = f"- Architecture: {shape['family']} (`{shape['model_type']}`): {', '.join(facts)}"
    outer = shape.get("outer_model_type")
    if outer and outer != shape["model_type"]:
        line += (f". Only the language model of this `{outer}` multimodal model is searched: "
                 "its vision tower and projector stay BF16")
    return [line]


def render_markdown(summary: dict[str, Any], run_dir: str = "RUN_DIR") -> str:
    workloads = [w["name"] for w in summary["workloads"]]
    batch = {w["name"]: w["batch_size"] for w in summary["workloads"]}  # the stated batch: the trials' J/token
    by_trial = {r["trial"]: r for r in summary["trials"]}
    energy_label = "; ".join(summary["labels"]["energy"])
    header = ["trial", "plan id", "plan", "eff. bits", "KL", "perplexity (vs BF16)",
              *[f"J/token '{w}' (batch {batch[w]})" for w in workloads], "energy", "within budget"]
    out = [f"# precision-advisor report: {summary['run']}", "", *decision_lines(summary, run_dir)]
    wl = ", ".join(f"`{w['name']}` (batch {w['batch_size']}, {w['input_tokens']} in / {w['output_tokens']} out)"
                   for w in summary["workloads"])
    out += [
        f"- Model: `{summary['model']['name']}` (fingerprint `{summary['model']['fingerprint']}`)",
        *_architecture_lines(summary.get("shape") or {}),
        f"- Target GPU: **{summary['target']}**; workloads: {wl}",
        f"- Accuracy budget: KL <= {summary['accuracy_budget']['max_kl']}"
        + (f", perplexity +{summary['accuracy_budget']['max_ppl_increase_pct']}%"
           if summary["accuracy_budget"].get("max_ppl_increase_pct") else ""),
        f"- Accuracy numbers: {summary['labels']['accuracy']}",
        f"- Energy numbers: **{energy_label}**",
        f"- Generated {summary['generated']} by precision-advisor {summary['version']}; "
        f"trials: {len(summary['trials'])}",
        "",
        "## Recommendation",
        "",
    ]
    rec = summary["recommendation"]
    if rec:
        energies = ", ".join(f"{_fmt_j(e['j_per_token'])} J/token on '{e['workload']}'"
                             + (f" at batch {batch[e['workload']]}" if e["workload"] in batch else "")
                             for e in rec["energy"])
        ties = near_ties_line(summary)
        out += [
            f"**Plan `{rec['plan_id']}`: {rec['label']}** (trial {rec['trial']}, "
            f"{rec['effective_bits']:.2f} effective bits): KL {rec['kl']:.4f}, {energies} ({energy_sources(rec)}).",
            "",
            f"Why: {rec['reason']}.",
            "",
            *([ties, ""] if ties else []),
            "![recommended plan](format_map.png)",
            "",
        ]
    else:
        out += ["No trial finished; nothing to recommend.", ""]
    out += operating_section(summary) if summary.get("operating_points") else payback_lines(summary)
    out += _serving_engines(summary)
    tiers = {energy_tier(by_trial[t]) for t in summary["front_trials"]}
    mixed_note = ["The front holds plans of both energy tiers ('energy' column): a predicted J/token is the cost "
                  "model's, a measured one the GPU's; the recommendation compares measured plans only.", ""] \
        if len(tiers) > 1 else []
    out += ["## Pareto front (within budget)", "", *mixed_note,
            _table([_row(by_trial[t], workloads) for t in summary["front_trials"]], header), "",
            "![accuracy vs energy](front.png)", "", "## Baselines", "",
            _table([_row(by_trial[t], workloads) for t in summary["baselines"].values()], header), ""]
    out += _kv_cache_effect(summary, workloads)
    out += _measured_vs_predicted(summary, workloads)
    if summary.get("benchmark_status"):
        out += [f"lm-eval stage: {summary['benchmark_status']}", ""]
    out += _benchmark_section(summary)
    sens = summary.get("sensitivity")
    if sens:
        rows = [[s["group"], s["format"], f"{s['kl']:.4f}"] for s in sens["most_sensitive"]]
        out += ["## Most sensitive layer groups", "",
                f"Proxy KL when only that group is quantized (measured on {sens['tokens']} held-out tokens, "
                f"{sens['time_s']:.0f} s); the guided search proposes plans from these.", "",
                _table(rows, ["group", "format", "KL"]), ""]
    t = summary.get("timings_s", {})
    if t:
        out += ["## Run", "", ", ".join(f"{k}: {v:.1f}" if isinstance(v, float) else f"{k}: {v}"
                                        for k, v in t.items()), ""]
    out += ["## How the numbers were obtained", "",
            "- KL and perplexity: measured by running each plan's fake-quantized model (NVIDIA ModelOpt "
            "quantizers) on held-out tokens that were not used for calibration, against the BF16 model.",
            f"- Energy: {energy_label}. Predicted numbers are model outputs, not measurements.", ""]
    if "extrapolated" in energy_label:
        out[-1:-1] = [
            "- The energy profile was measured on a model of a very different size and scaled to this one. "
            "Such predictions miss per-kernel launch floors and the low power of a latency-bound step: for "
            "SmolLM2-135M on an H100 they came out 2-3x below the measured J/token and put FP8's saving at "
            "16-20% where 7-8% was measured (reports/benchmarks/costmodel_transfer.md). Compare plans by their "
            "ratios with care, and measure on the target GPU (`--energy measured`) where one is at hand."
        ]
    return "\n".join(out)




def _pts(x: float) -> str:
    return f"{100 * x:+.1f}"


def verdict_cell(t: dict[str, Any]) -> str:
    """'passes: +1.2 [-0.4, +2.9] pts, 400/5153 items'."""
    if not t["n_items"]:
        return f"{t['verdict']}: drop {t['method']}, 0/{t['n_available']} items"
    return (f"{t['verdict']}: {_pts(t['drop'])} [{_pts(t['ci_low'])}, {_pts(t['ci_high'])}] pts, "
            f"{t['n_items']}/{t['n_available']} items")


def _benchmark_section(summary: dict[str, Any]) -> list[str]:
    rows = list({r["plan_id"]: r for r in summary["trials"] if r.get("benchmark")}.values())
    if not rows:
        return []
    spec = summary.get("benchmark") or {}
    tasks = sorted({t for r in rows for t in r["benchmark"]})
    score_rows = []
    for r in rows:
        cells = []
        for t in tasks:
            s = r["benchmark"].get(t)
            cells.append(f"{s['value']:.4f} ± {s['stderr'] or 0:.4f} (n={s['n']})" if s else "-")
        score_rows.append([f"`{r['plan_id']}`", r["label"], *cells])
    metrics = sorted({s["metric"] for r in rows for s in r["benchmark"].values()})
    out = ["## Benchmark acceptance (lm-eval, measured)", "",
           f"A plan passes when, on every task, the upper bound of the {spec.get('confidence', 0.95):.0%} interval "
           f"of its drop against BF16, paired on the same items, is within {100 * spec.get('max_drop', 0):g} "
           "points; it fails when a lower bound exceeds that; otherwise it is undecided. Items come in nested "
           f"batches ({spec.get('first_batch', '?')}, doubling, up to {spec.get('limit') or 'the full set'}), more "
           "only while a task is undecided; each interval's level is corrected for the looks its task could take. "
           "Drops in points (BF16 minus plan; positive is worse).", ""]
    judged = [r for r in rows if r.get("acceptance")]
    if judged:
        table = [[f"`{r['plan_id']}`", r["label"], f"**{r['acceptance']['verdict']}**",
                  *[next((verdict_cell(t) for t in r["acceptance"]["tasks"] if t["task"] == task),
                         "not needed (another task failed)" if r["acceptance"]["verdict"] == "fails" else "not scored")
                    for task in tasks]] for r in judged]
        out += [_table(table, ["plan id", "plan", "verdict", *tasks]), ""]
        methods = sorted({t["method"] for r in judged for t in r["acceptance"]["tasks"]})
        out += [f"Intervals: {'; '.join(methods)}.", ""]
    out += [f"Scores ({', '.join(metrics)}; ± lm-eval's standard error):", "",
            _table(score_rows, ["plan id", "plan", *tasks]), ""]
    out += _calibration_lines(summary.get("proxy_calibration") or [])
    return out


def _fit_text(f: dict[str, Any]) -> str:
    """The fit in words; a statistic that is undefined says so, with its reason."""
    why = f.get("undefined") or {}
    if f["slope"] is None or f["intercept"] is None:
        return f"no fit: {why.get('slope', 'too few plans (3 or more with distinct KL needed)')}."
    rho_ci = f["spearman_ci"]
    rho = (f"undefined ({why.get('spearman', 'no reason recorded')})" if f["spearman"] is None
           else f"{f['spearman']:+.2f}" + (f" [{rho_ci[0]:+.2f}, {rho_ci[1]:+.2f}]" if rho_ci else ""))
    slope_ci = (f"undefined: {why.get('slope_ci', 'no reason recorded')}" if f["slope_ci"] is None
                else f"[{100 * f['slope_ci'][0]:.1f}, {100 * f['slope_ci'][1]:.1f}]")
    return (f"Spearman rho {rho}; drop = {100 * f['intercept']:+.2f} + {100 * f['slope']:.1f} x KL points per nat "
            f"(slope {f['confidence']:.0%} interval {slope_ci}).")


def _calibration_lines(fits: list[dict[str, Any]]) -> list[str]:
    if not fits:
        return []
    out = ["### Proxy calibration (KL against benchmark drop)", ""]
    for f in fits:
        out.append(f"- {f['task']}: {f['n_plans']} plans; " + _fit_text(f))
        for better, worse_by_proxy in f["contradicted_pairs"]:
            out.append(f"  - the proxy prefers {better} (lower KL) but the benchmark's intervals put "
                       f"{worse_by_proxy} clearly ahead")
    if any(f["disagrees"] for f in fits):
        out += ["", "**Warning:** the proxy's ranking disagrees with the benchmark beyond noise on "
                f"{', '.join(f['task'] for f in fits if f['disagrees'])}: do not trust the KL budget alone "
                "to order plans for this model; judge candidates with lm-eval."]
    return [*out, ""]
