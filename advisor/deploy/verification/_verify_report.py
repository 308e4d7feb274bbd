"""verify.md and the "Verified in vLLM" section of report.md, from verify's typed result
(:class:`~advisor.report.VerifyResult`; the tables read its JSON form, as verify.json holds it). Torch-free."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from advisor.deploy.vllm import MAX_ENTRIES
from advisor.report import VerifyResult
from advisor.report.verify_record import VerifiedPlan
from advisor.search.frontier import percent_less
from advisor.search.measured import went_past_prediction
from advisor.search.operating import BUSY_BELOW

BEGIN, END = "<!-- advisor verify: begin -->", "<!-- advisor verify: end -->"

#: another GPU of the host at least this busy (%, NVML) over a metering: the report says that a job ran beside it
OTHERS_BUSY = 10.0


def num(x: Any, fmt: str = ".4g") -> str:
    return "n/a" if x is None else format(x, fmt)


def _pct(a: Any, b: Any) -> str:
    return "n/a" if a is None or b is None or not b else f"{100.0 * (a / b - 1.0):+.1f}%"


def shown_role(role: str, plan_id: str) -> str:
    """A plan's role as printed: one asked for with ``--plan`` (its role is its id) reads ``--plan``."""
    return "+".join("--plan" if part == plan_id else part for part in role.split("+"))


def render_verify(verified: VerifyResult) -> str:
    result = verified.data()
    lines = [f"## Verified in vLLM {result['vllm_version']} ({result['gpu']}, {result['date']})", ""]
    bad = [r for r in result["plans"] if r["formats_match"] is not True]
    lines.append("Every layer group was served in the format the plan gives it." if not bad else
                 "**Served otherwise than planned:** " + "; ".join(
                     f"plan {r['plan_id']} ({shown_role(r['role'], r['plan_id'])}): "
                     + ", ".join(f"{g}: {why}" for g, why in r["formats_match"].items()) for r in bad))
    kind, target = result.get("gpu_kind"), result.get("target")
    if kind and target and kind != target:
        lines += ["", f"**Served on another GPU kind than the run's target:** the run priced its plans for {target}, "
                  f"vLLM served them on {result['gpu']} ({kind}). The energy table's predicted column is re-priced "
                  f"for {kind} (verify.json keeps the run's own beside it); the operating points' predicted columns "
                  f"are the run's, for {target}, and compare with this GPU's numbers only loosely."]
    lines += _served_decision(result)
    lines += time_section(result)
    lines += ["", "### Formats as served", "", "| plan | role | served as planned | formats vLLM built |",
              "|---|---|---|---|"]
    for r in result["plans"]:
        counts: dict[str, int] = {}
        for f in r["served_formats"].values():
            counts[f] = counts.get(f, 0) + 1
        built = ", ".join(f"{n} x {f}" for f, n in sorted(counts.items()))
        ok = "yes" if r["formats_match"] is True else f"**no** ({len(r['formats_match'])} groups)"
        lines.append(f"| `{r['plan_id']}` {r['label']} | {shown_role(r['role'], r['plan_id'])} | {ok} | {built} |")
    lines += ["", "### Accuracy as served", "",
              "KL(advisor BF16 reference || model) per token over the whole vocabulary, on the run's held-out "
              "tokens: vLLM's log-probabilities of every token at every position; the advisor's own model of the "
              "exported plan on the same positions; the proxy KL the search scored (the same quantity, on the same "
              "tokens, of the plan in memory).", "",
              "| plan | role | served KL (vLLM) | advisor KL (its export) | proxy KL (search) | served vs proxy | "
              "items: vLLM | items: advisor |", "|---|---|---|---|---|---|---|---|"]
    for r in result["plans"]:
        a = r["accuracy"]
        it = a.get("items") or {}
        role = shown_role(r["role"], r["plan_id"])
        lines.append(f"| `{r['plan_id']}` | {role} | {num(a['served_kl'])} | {num(a['advisor_kl'])} "
                     f"| {num(r['proxy_kl'])} | {_pct(a['served_kl'], r['proxy_kl'])} "
                     f"| {num(it.get('vllm_accuracy'), '.3f')} | {num(it.get('advisor_accuracy'), '.3f')} |")
    first = result["plans"][0]["accuracy"] if result["plans"] else {}
    if first.get("sequences", 0) < first.get("heldout_sequences", 0):
        lines += ["", f"Served and advisor KL on the first {first['sequences']} of the run's "
                  f"{first['heldout_sequences']} held-out sequences (the proxy KL: all of them): vLLM answers every "
                  f"token's log-probability at every position, and verify bounds that to {MAX_ENTRIES:,} entries a "
                  "plan."]
    over = [r.model_dump(mode="json") for r in over_budget(verified)]
    if over:
        lines += ["", "**Over the accuracy budget as served:** " + "; ".join(
            f"plan {r['plan_id']} ({shown_role(r['role'], r['plan_id'])}) served KL "
            f"{r['accuracy']['served_kl']:.4g} against max_kl {result['max_kl']:g}" for r in over)]
    if result.get("lambada"):
        lines += ["", f"Items: the first {result['lambada']['items']} of {result['lambada']['file']}, last word "
                  "greedy (every target token the top-1 next token)."]
    lines += ["", "### Energy as served", "",
              "| plan | workload | vLLM J/token (measured) | built-in runtime J/token (measured) | vs vLLM | "
              "predicted J/token | vs vLLM | steady | GPU busy % |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["plans"]:
        for e in r["energy"]:
            steady = "yes" if e["batch_full"] and not e["vllm_unstable"] else (
                "unstable" if e["vllm_unstable"] else "batch not full")
            if e.get("vllm_starved_windows"):
                steady += f" ({e['vllm_starved_windows']} starved windows left out)"
            lines.append(f"| `{r['plan_id']}` | {e['workload']} | {num(e['vllm_j_per_token'])} | "
                         f"{num(e['runtime_j_per_token'])} | {_pct(e['runtime_j_per_token'], e['vllm_j_per_token'])} "
                         f"| {num(e['predicted_j_per_token'])} | "
                         f"{_pct(e['predicted_j_per_token'], e['vllm_j_per_token'])} | {steady} | "
                         f"{num(e.get('gpu_busy_pct'), '.0f')} |")
    if any((e.get("gpu_busy_pct") or 100.0) < BUSY_BELOW for r in result["plans"] for e in r["energy"]):
        lines += ["", f"GPU busy under {BUSY_BELOW:.0f}% (NVML's utilization over the load): the GPU waited on the "
                  "engine's host side (its scheduler, its output processing) part of the time, so these numbers "
                  "depend on the host's CPU as well as on the GPU."]
    lines += _beside_line(result)
    lines += served_options(result)
    return "\n".join(lines + _operating_lines(result)) + "\n"


def _beside_line(result: dict[str, Any]) -> list[str]:
    """A line where another GPU of the host was busy during the energy rows' meterings (none otherwise)."""
    rows = [e for r in result["plans"] for e in r["energy"]]
    beside = [e["other_gpus_busy_pct"] for e in rows if (e.get("other_gpus_busy_pct") or 0.0) >= OTHERS_BUSY]
    if not beside:
        return []
    return ["", f"Another GPU of this host was busy during {len(beside)} of these {len(rows)} meterings (up to "
            f"{max(beside):.0f}%, NVML's utilization): a job there (this verify's own workers count too) shares "
            "the host's CPUs, memory and PCIe with this engine and can make its serving noisier (beside another "
            "verify on an H200 host, five of an 8B's meterings ran to the 30 s ceiling, alone one). Serve it again "
            "alone before comparing these numbers with another run's."]


def served_options(result: dict[str, Any]) -> list[str]:
    """The ``vllm.LLM`` options beyond the lengths that each plan was served with (its ``max_num_seqs``, and the
    export's ``vllm_config.yaml``: its CUDA-graph bound, and on Hopper cuBLASLt for FP8 GEMMs), since vLLM's
    J/token depends on them."""
    said = [f"`{r['plan_id']}` " + ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(r["vllm_options"].items()))
            for r in result["plans"] if r.get("vllm_options")]
    return ["", "vLLM options each plan was served with: " + "; ".join(said) + "."] if said else []


def over_budget(result: VerifyResult) -> list[VerifiedPlan]:
    """The plans whose served KL is over the run's accuracy budget (``max_kl``)."""
    budget = result.max_kl
    return [r for r in result.plans if budget is not None and (r.accuracy.served_kl or 0.0) > budget]


def _as_served(operating: dict[str, Any]) -> dict[str, Any]:
    """A plan's operating point as vLLM served it: the batch search's outcome where it ran, else the serving at the
    predicted batch."""
    return operating.get("vllm_search") or operating["vllm"]


def _basis(operating: dict[str, Any]) -> str:
    """Which batch a plan is compared at: the largest that met where vLLM also served batches around the predicted
    one, else the predicted batch (met there; larger batches were not served, so the plan may serve more)."""
    if went_past_prediction(operating.get("vllm_search") or {}):
        return "largest batch that met the objective in vLLM"
    return "predicted operating batch, which met the objective in vLLM (no larger batch was served)"


def _bases(mine: dict[str, Any], theirs: dict[str, Any]) -> str:
    a, b = _basis(mine), _basis(theirs)
    return f"each at its {a}" if a == b else f"the recommendation at its {a}, all-BF16 at its {b}"


def _point(p: dict[str, Any]) -> str:
    tpot = f", TPOT {p['tpot_ms']:.4g} ms" if p.get("tpot_ms") is not None else ""
    return f"batch {p['batch']} at {p['j_per_token']:.4g} J/token{tpot}"


def served_decision(result: VerifyResult) -> list[str]:
    """:func:`_served_decision` of ``result``."""
    return _served_decision(result.data())


def _served_decision(result: dict[str, Any]) -> list[str]:
    """Per latency objective: the recommendation against all-BF16, each at the largest batch that met the objective
    in vLLM (or at its predicted batch, where that met and nothing larger was served: :func:`_basis`), and the
    saving as served; where either met it at no batch served, or the recommendation costs more than BF16 as served,
    that is said instead of a saving."""
    roles = {part: r for r in result["plans"] for part in r["role"].split("+")}
    rec, bf16 = roles.get("recommendation"), roles.get("bf16")
    if rec is None or bf16 is None or not rec.get("operating"):
        return []
    bf16_by = {o["workload"]: o for o in bf16.get("operating") or []}
    lines = ["", "### The decision as served", ""]
    for o in rec["operating"]:
        w, mine, their_o = o["workload"], _as_served(o), bf16_by.get(o["workload"])
        theirs = _as_served(their_o) if their_o else None
        if rec is bf16:
            met = "meets" if mine.get("meets") else "does not meet"
            lines.append(f"- '{w}': the recommendation is all-BF16; vLLM serves it at {_point(mine)} ({met} the "
                         "objective).")
        elif theirs is None:
            lines.append(f"- '{w}': the recommendation at {_point(mine)}; all-BF16 was not served under it.")
        elif not (mine.get("meets") and theirs.get("meets")):
            missed = " and ".join(name for name, q in (("the recommendation", mine), ("all-BF16", theirs))
                                  if not q.get("meets"))
            lines.append(f"- '{w}': {missed} met the objective at no batch vLLM served (the recommendation at "
                         f"{_point(mine)}, all-BF16 at {_point(theirs)}); no saving is stated as served.")
        elif mine["j_per_token"] > theirs["j_per_token"]:
            lines.append(f"- '{w}': **the recommendation costs more than all-BF16 as served**: {_point(mine)} "
                         f"against {_point(theirs)}; serve BF16 under this objective.")
        else:
            lines.append(f"- '{w}': the recommendation `{rec['plan_id']}` at {_point(mine)} against all-BF16 at "
                         f"{_point(theirs)}: **{percent_less(mine['j_per_token'], theirs['j_per_token'])} less "
                         f"energy per token**, {_bases(o, their_o or {})}.")
    if rec is not bf16 and rec.get("devices") and bf16.get("devices") and rec["devices"] != bf16["devices"]:
        lines.append(f"- The two were served on different GPUs of this node ({', '.join(rec['devices'])}; "
                     f"{', '.join(bf16['devices'])}): units of one kind differ by a few percent, not checked here.")
    return lines


def _meets(m: Any) -> str:
    return {True: "yes", False: "**no**", None: "not timed"}[m]


def _error(predicted: dict[str, Any], served: dict[str, Any], key: str) -> str:
    """The prediction against what vLLM served at the same batch, in percent of the served value."""
    p, v = predicted.get(key), served.get(key)
    return "" if p is None or not v else f"{100 * (p - v) / v:+.1f}%"


def _operating_lines(result: dict[str, Any]) -> list[str]:
    """Each plan at its own operating batch under each objective: predicted, built-in runtime (where the search
    measured it) and vLLM, with the objective met as each says."""
    rows = [(r, o) for r in result["plans"] for o in r.get("operating") or []]
    if not rows:
        return []
    lines = ["", "### Operating points as served", "",
             "Each plan at its largest batch under the workload's latency objective (predicted by the search), "
             "served there by vLLM; TPOT/TTFT at the objective's percentile; the prediction's error is the predicted "
             "value against vLLM's at that batch, in percent of vLLM's.", "",
             "| plan | workload | batch | J/token predicted | J/token built-in | J/token vLLM | prediction's error | "
             "TPOT ms predicted | TPOT ms vLLM | prediction's error | TTFT ms vLLM | tokens/s vLLM | meets: predicted "
             "| meets: vLLM |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, o in rows:
        p, v, rt = o["predicted"], o["vllm"], o.get("runtime") or {}
        lines.append(f"| `{r['plan_id']}` | {o['workload']} | {o['batch']} | {num(p['j_per_token'])} | "
                     f"{num(rt.get('j_per_token'))} | {num(v['j_per_token'])} | {_error(p, v, 'j_per_token')} | "
                     f"{num(p['tpot_ms'], '.3g')} | {num(v['tpot_ms'], '.3g')} | {_error(p, v, 'tpot_ms')} | "
                     f"{num(v['ttft_ms'], '.3g')} | {num(v['tokens_per_s'], '.0f')} "
                     f"| {'yes' if p['meets'] else '**no**'} | {_meets(v['meets'])} |")
    searched = [(r, o, s) for r, o in rows if (s := o.get("vllm_search")) and s.get("trail")
                and (len(s["trail"]) > 1 or s.get("batch") != s["trail"][0]["batch"])]
    if searched:
        lines += ["", "Where vLLM served batches beside the predicted one in the same engine (smaller after a miss, "
                  "larger after a batch that met with room to spare), until the largest that meets; a batch of the "
                  "same load served there for another workload counts too:", ""]
    for r, o, s in searched:
        steps = ", ".join(f"{t['batch']} ({num(t.get('tpot_ms'), '.4g')} ms, {_meets(t.get('meets'))})"
                          for t in s["trail"])
        lines.append(f"- `{r['plan_id']}` on '{o['workload']}': batches {steps}: {s['search']}.")
    if result.get("operating_plot"):
        lines += ["", f"![the time-energy frontier as served]({result['operating_plot']})", "",
                  "Curves and stars: the search's predicted points; diamonds: the batches vLLM served, filled where "
                  "the largest that met the objective as served."]
    return lines


def served_operating_summary(summary: dict[str, Any], result: VerifyResult) -> dict[str, Any] | None:
    """The run's summary with only the served plans' operating points, each carrying what vLLM served from it as
    its ``measured`` (the batch search's outcome and trail): what
    :func:`~advisor.report.plots.plot_operating_points` draws. None where verify served no operating point."""
    served = {}
    for r in result.plans:
        for o in r.operating:
            point = o.vllm_search or o.vllm.model_copy(update={"trail": [o.vllm]})
            served[(r.plan_id, o.workload)] = point.model_dump(mode="json")
    if not served:
        return None
    points = [{**p, "measured": served[(p["plan_id"], p["workload"])]}
              for p in summary.get("operating_points") or [] if (p["plan_id"], p["workload"]) in served]
    return {**summary, "operating_points": points}


def write_report_section(report: Path, section: str) -> None:
    """Put ``section`` into report.md between the verify markers (replacing an earlier one), or append it."""
    text = report.read_text() if report.is_file() else ""
    block = f"{BEGIN}\n{section}{END}\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1].lstrip("\n")
    else:
        text = (text.rstrip("\n") + "\n\n" if text else "") + block
    report.write_text(text)


def time_section(result: dict[str, Any]) -> list[str]:
    """Where verify's time went: the model's load, each export, each plan's engine start, served KL and
    meterings (a plan read back from an earlier verify spent nothing here)."""
    t = result.get("timings_s")
    if not t:
        return []
    lines = ["", "### Time", "", f"{t['total_s'] / 60:.1f} min in all" + (" (--quick)" if result.get("quick") else "")
             + f"; the model's load and tokens {t['load_s']:.0f} s.", "",
             "| plan | export s | engine start s | kernel warm-up s | compile cache | served KL s | meterings | "
             "metering s |", "|---|---|---|---|---|---|---|---|"]
    for role, p in (t.get("plans") or {}).items():
        p = p or {}
        m = p.get("meterings") or []
        start = p.get("engine_start") or {}
        hit = "read" if start.get("compile_cache_hit") else ("compiled" if "compile_s" in start else "")
        lines.append(f"| {role} | {t['export_s'].get(role, 0):.0f} | {num_s(p.get('engine_start_s'))} | "
                     f"{num_s(start.get('kernel_warmup_s'))} | {hit} | "
                     f"{num_s(p.get('served_kl_s'))} | {len(m)} | {sum(x['seconds'] for x in m):.0f} |")
    held = [(role, p["held_s"]) for role, p in (t.get("plans") or {}).items() if p and p.get("held_s") is not None]
    lines += ["", "; ".join(f"{role}'s engine started while the plans exported, then waited {s:.0f} s before "
                            "metering (for the exports, the other engines' starts and the meterings before its own)"
                            for role, s in held) + "."] if held else []
    return lines


def num_s(value: float | None) -> str:
    return "" if value is None else f"{value:.0f}"
