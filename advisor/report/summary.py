"""Markdown report, PNG plots and summary.json, rebuilt from the study storage alone."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import optuna

from advisor.formats import Format
from advisor.models.shape import ModelShape
from advisor.plan import LayerGroup, Plan
from advisor.search.frontier import Candidate, Recommendation, pareto_front, recommend
from advisor.search.study import candidates

FORMAT_COLORS = {Format.BF16: "#4c72b0", Format.FP8: "#dd8452", Format.NVFP4: "#55a868"}


def _trial_record(
    c: Candidate, study_trial: optuna.trial.FrozenTrial, groups: Sequence[LayerGroup], bench: dict
) -> dict:
    ua = study_trial.user_attrs
    return {
        "trial": c.trial,
        "plan_id": c.plan.id,
        "label": c.plan.label(),
        "formats": {k: v.value for k, v in c.plan.formats.items()},
        "effective_bits": round(c.plan.effective_bits(groups), 3),
        "kl": c.kl,
        "ppl": c.ppl,
        "ppl_increase_pct": 100 * (c.ppl / ua["ppl_bf16"] - 1),
        "energy": ua["energy"],
        "feasible": c.feasible,
        "benchmark": bench.get(c.plan.id, {}),
        "benchmark_drop": c.benchmark_drop,
    }


def build_summary(study: optuna.Study) -> dict[str, Any]:
    meta = study.user_attrs
    shape = ModelShape.from_dict(meta["shape"])
    workloads = [w["name"] for w in meta["recipe"]["workloads"]]
    cands = candidates(study)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    front = pareto_front(cands, workloads[0])
    rec = recommend(cands, workloads)
    bench = study.user_attrs.get("benchmark", {})
    records = [_trial_record(c, trials[c.trial], shape.groups, bench) for c in cands]
    baselines = {}
    for c in cands:
        u = c.plan.uniform_format()
        if u is not None and f"all-{u.value}" not in baselines:
            baselines[f"all-{u.value}"] = c.trial
    energy_labels = sorted({e["source"] for r in records for e in r["energy"]})
    return {
        "tool": "precision-advisor",
        "version": meta.get("version"),
        "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "run": study.study_name,
        "model": meta.get("model"),
        "target": meta["recipe"]["target"],
        "workloads": meta["recipe"]["workloads"],
        "accuracy_budget": meta["recipe"]["accuracy"],
        "benchmark": meta["recipe"].get("benchmark"),
        "labels": {
            "accuracy": meta.get("accuracy_label", "measured (proxy on held-out tokens)"),
            "energy": energy_labels,
        },
        "versions": meta.get("versions", {}),
        "timings_s": meta.get("timings", {}),
        "trials": records,
        "front": [c.plan.id for c in front],
        "front_trials": [c.trial for c in front],
        "baselines": baselines,
        "recommendation": _recommendation_dict(rec, records),
        "proxy_benchmark_spearman": _spearman(records),
        "benchmark_status": meta.get("benchmark_status"),
        "sensitivity": meta.get("sensitivity"),
        "shape": meta["shape"],
        "recipe": meta["recipe"],
    }


def _spearman(records: list[dict]) -> float | None:
    """Rank correlation of proxy KL and mean benchmark accuracy over distinct scored plans."""
    scored = {r["plan_id"]: r for r in records if r["benchmark"]}
    if len(scored) < 3:
        return None
    import pandas as pd

    kl = pd.Series([r["kl"] for r in scored.values()])
    acc = pd.Series([sum(s["acc"] for s in r["benchmark"].values()) / len(r["benchmark"]) for r in scored.values()])
    value = float(kl.corr(acc, method="spearman"))
    return None if math.isnan(value) else value


def _recommendation_dict(rec: Recommendation | None, records: list[dict]) -> dict | None:
    if rec is None:
        return None
    record = next(r for r in records if r["trial"] == rec.candidate.trial)
    return {**record, "reason": rec.reason, "accuracy_metric": rec.accuracy_metric}


def _fmt_j(x: float) -> str:
    return f"{x:.4g}"


def _plot_front(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w0 = summary["workloads"][0]["name"]
    recs = summary["trials"]

    def e(r: dict) -> float:
        return next(x["j_per_token"] for x in r["energy"] if x["workload"] == w0)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    floor = 1e-6
    feas = [r for r in recs if r["feasible"]]
    infeas = [r for r in recs if not r["feasible"]]
    ax.scatter([e(r) for r in infeas], [max(r["kl"], floor) for r in infeas], c="#bbbbbb", s=14, label="over budget")
    ax.scatter([e(r) for r in feas], [max(r["kl"], floor) for r in feas], c="#4c72b0", s=14, label="within budget")
    front = [r for pid in summary["front"] for r in recs if r["plan_id"] == pid]
    front = sorted({r["plan_id"]: r for r in front}.values(), key=e)
    if front:
        ax.plot([e(r) for r in front], [max(r["kl"], floor) for r in front], "-o", c="#c44e52", ms=4, label="front")
    for name, trial in summary["baselines"].items():
        r = next(x for x in recs if x["trial"] == trial)
        ax.scatter([e(r)], [max(r["kl"], floor)], marker="s", s=60, facecolors="none", edgecolors="k")
        ax.annotate(name, (e(r), max(r["kl"], floor)), textcoords="offset points", xytext=(5, 5), fontsize=8)
    rec = summary["recommendation"]
    if rec:
        ax.scatter([e(rec)], [max(rec["kl"], floor)], marker="*", s=220, c="gold", edgecolors="k",
                   label="recommended", zorder=5)
    ax.axhline(summary["accuracy_budget"]["max_kl"], ls="--", c="gray", lw=1, label="KL budget")
    ax.set_yscale("log")
    ax.set_xlabel(f"J per output token, workload '{w0}'\n{'; '.join(summary['labels']['energy'])}", fontsize=8)
    ax.set_ylabel("KL(BF16 || plan), nats/token (measured)")
    ax.set_title(f"{summary['run']}: accuracy vs energy ({len(recs)} trials)")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_format_map(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rec = summary["recommendation"]
    groups = [g["name"] for g in summary["shape"]["groups"]]
    layered = [g for g in groups if g.startswith("layers.") and g.count(".") == 2]
    fig, ax = plt.subplots(figsize=(max(6, len(groups) * 0.08 + 3), 2.6))
    if layered and len(layered) == len(groups):
        roles = list(dict.fromkeys(g.split(".")[2] for g in groups))
        layers = sorted({int(g.split(".")[1]) for g in groups})
        for g in groups:
            _, idx, role = g.split(".")
            fmt = Format(rec["formats"][g])
            ax.add_patch(plt.Rectangle((int(idx), roles.index(role)), 0.95, 0.9, color=FORMAT_COLORS[fmt]))
        ax.set_xlim(0, max(layers) + 1)
        ax.set_ylim(0, len(roles))
        ax.set_yticks([i + 0.45 for i in range(len(roles))], roles)
        ax.set_xlabel("decoder layer")
    else:
        for i, g in enumerate(groups):
            ax.bar(i, 1, color=FORMAT_COLORS[Format(rec["formats"][g])])
        ax.set_xticks(range(len(groups)), groups, rotation=90, fontsize=6)
        ax.set_yticks([])
    ax.legend(handles=[Patch(color=c, label=f.value) for f, c in FORMAT_COLORS.items()], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(f"recommended plan {rec['plan_id']}: {rec['label']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _table(rows: list[list[str]], header: list[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _row(r: dict, workloads: list[str]) -> list[str]:
    energies = {e["workload"]: e["j_per_token"] for e in r["energy"]}
    return [
        str(r["trial"]), f"`{r['plan_id']}`", r["label"], f"{r['effective_bits']:.2f}",
        f"{r['kl']:.4f}", f"{r['ppl']:.2f} ({r['ppl_increase_pct']:+.1f}%)",
        *[_fmt_j(energies[w]) for w in workloads], "yes" if r["feasible"] else "no",
    ]


def render_markdown(summary: dict) -> str:
    workloads = [w["name"] for w in summary["workloads"]]
    by_trial = {r["trial"]: r for r in summary["trials"]}
    energy_label = "; ".join(summary["labels"]["energy"])
    header = ["trial", "plan id", "plan", "eff. bits", "KL", "perplexity (vs BF16)",
              *[f"J/token '{w}'" for w in workloads], "within budget"]
    out = [f"# precision-advisor report: {summary['run']}", ""]
    wl = ", ".join(f"`{w['name']}` (batch {w['batch_size']}, {w['input_tokens']} in / {w['output_tokens']} out)"
                   for w in summary["workloads"])
    out += [
        f"- Model: `{summary['model']['name']}` (fingerprint `{summary['model']['fingerprint']}`)",
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
        energies = ", ".join(f"{_fmt_j(e['j_per_token'])} J/token on '{e['workload']}'" for e in rec["energy"])
        out += [
            f"**Plan `{rec['plan_id']}`: {rec['label']}** (trial {rec['trial']}, "
            f"{rec['effective_bits']:.2f} effective bits): KL {rec['kl']:.4f}, {energies} ({energy_label}).",
            "",
            f"Why: {rec['reason']}.",
            "",
            "![recommended plan](format_map.png)",
            "",
        ]
    else:
        out += ["No trial finished; nothing to recommend.", ""]
    out += ["## Pareto front (within budget)", "",
            _table([_row(by_trial[t], workloads) for t in summary["front_trials"]], header), "",
            "![accuracy vs energy](front.png)", "", "## Baselines", "",
            _table([_row(by_trial[t], workloads) for t in summary["baselines"].values()], header), ""]
    if summary.get("benchmark_status"):
        out += [f"lm-eval stage: {summary['benchmark_status']}", ""]
    bench_rows = list({r["plan_id"]: r for r in summary["trials"] if r.get("benchmark")}.values())
    if bench_rows:
        tasks = sorted({t for r in bench_rows for t in r["benchmark"]})
        rows = []
        for r in bench_rows:
            cells = []
            for t in tasks:
                s = r["benchmark"].get(t)
                cells.append(f"{s['acc']:.4f} ± {s['acc_stderr']:.4f} (n={s['n']})" if s else "-")
            drop = r.get("benchmark_drop")
            rows.append([f"`{r['plan_id']}`", r["label"], *cells, "-" if drop is None else f"{drop:+.4f}"])
        out += ["## Benchmark accuracy (lm-eval, measured)", "",
                _table(rows, ["plan id", "plan", *tasks, "mean drop vs BF16"]), ""]
        corr = summary.get("proxy_benchmark_spearman")
        if corr is not None:
            out += [f"Spearman rank correlation between proxy KL and mean benchmark accuracy over the "
                    f"{len(bench_rows)} scored plans: {corr:+.3f} (a strongly negative value means the "
                    f"proxy ranks plans as the benchmark does).", ""]
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


def write_report(study: optuna.Study, out_dir: Path, extra: dict | None = None) -> Path:
    """Write summary.json, report.md, front.png and format_map.png into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = build_summary(study)
    if extra:
        summary.update(extra)
    if summary["trials"]:
        _plot_front(summary, out_dir / "front.png")
    if summary["recommendation"]:
        _plot_format_map(summary, out_dir / "format_map.png")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    (out_dir / "report.md").write_text(render_markdown(summary))
    return out_dir / "report.md"


def load_plan_from_summary(summary_path: Path, plan_id: str | None = None) -> Plan:
    data = json.loads(summary_path.read_text())
    target = plan_id or (data.get("recommendation") or {}).get("plan_id")
    for r in data["trials"]:
        if r["plan_id"] == target:
            return Plan({k: Format(v) for k, v in r["formats"].items()})
    raise KeyError(target)


def finite(x: float) -> bool:
    return not (math.isnan(x) or math.isinf(x))
