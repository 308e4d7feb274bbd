"""The report's PNG plots (matplotlib, Agg backend): the accuracy/energy front, the format map and the
time-energy frontier of the operating points."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from advisor.files import replace_atomically
from advisor.formats import Format

FORMAT_COLORS = {Format.BF16: "#4c72b0", Format.FP8: "#dd8452", Format.NVFP4: "#55a868"}


def plot_front(summary: dict[str, Any], path: Path) -> None:
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
    try:
        replace_atomically(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    finally:
        plt.close(fig)


def plot_format_map(summary: dict[str, Any], path: Path) -> None:
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
    try:
        replace_atomically(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    finally:
        plt.close(fig)




def plot_operating_points(summary: dict[str, Any], path: Path, most_plans: int = 6, near_objective: bool = False
                          ) -> None:
    """The time-energy frontier: J/token against TPOT over the batches, one curve per plan (the baselines,
    the recommendation and the cheapest others), each workload's objective drawn in, the operating points
    (the largest batch under the objective) marked, and beside each the batches the measured tier metered from it
    (hollow diamonds, dotted from the predicted point) and the largest that met the objective as measured
    (filled). ``near_objective``: linear axes around each TPOT objective (0.6-1.4 times it), where the points are."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = summary["operating_points"]
    names = list(dict.fromkeys(p["workload"] for p in points))
    objectives = {w["name"]: w for w in summary["workloads"]}
    rec = (summary["recommendation"] or {}).get("plan_id")
    baselines = {r["plan_id"] for r in summary["trials"] if r["trial"] in summary["baselines"].values()}
    fig, axes = plt.subplots(1, len(names), figsize=(6.5 * len(names), 4.5), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        here = sorted((p for p in points if p["workload"] == name), key=lambda p: (not p["meets"], p["j_per_token"]))
        shown = [p for p in here if p["plan_id"] in baselines or p["plan_id"] == rec]
        shown += [p for p in here if p not in shown][:max(0, most_plans - len(shown))]
        for p in shown:
            xs, ys = [c[1] for c in p["curve"]], [c[2] for c in p["curve"]]
            chosen = p["plan_id"] == rec
            (line,) = ax.plot(xs, ys, "-", lw=2.2 if chosen else 1.1, label=f"{p['plan']} ({p['plan_id'][:6]})")
            ax.scatter([p["tpot_ms"]], [p["j_per_token"]], marker="*" if chosen else "o", s=200 if chosen else 40,
                       color=line.get_color(), edgecolors="k", zorder=5)
            ax.annotate(f"b{p['batch']}", (p["tpot_ms"], p["j_per_token"]), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
            m = p.get("measured") or {}
            trail = [t for t in m.get("trail") or [m] if t.get("j_per_token") is not None
                     and t.get("tpot_ms") is not None]
            if trail:  # as measured: every batch metered, from the predicted one down
                ax.scatter([t["tpot_ms"] for t in trail], [t["j_per_token"] for t in trail], marker="D", s=40,
                           facecolors="none", edgecolors=line.get_color(), zorder=5)
                ax.plot([p["tpot_ms"], *(t["tpot_ms"] for t in trail)],
                        [p["j_per_token"], *(t["j_per_token"] for t in trail)], ":", lw=0.8, c=line.get_color())
            if m.get("meets") and m.get("tpot_ms") is not None:
                ax.scatter([m["tpot_ms"]], [m["j_per_token"]], marker="D", s=50, color=line.get_color(),
                           edgecolors="k", zorder=6)
                ax.annotate(f"b{m['batch']} measured", (m["tpot_ms"], m["j_per_token"]), textcoords="offset points",
                            xytext=(4, -10), fontsize=7)
        objective = objectives.get(name, {})
        if objective.get("tpot_ms") is not None:
            ax.axvline(objective["tpot_ms"], ls="--", c="gray", lw=1,
                       label=f"TPOT objective {objective['tpot_ms']:g} ms ({objective.get('percentile') or 'p50'})")
        if near_objective and objective.get("tpot_ms") is not None:
            lo, hi = 0.6 * objective["tpot_ms"], 1.4 * objective["tpot_ms"]
            ys = [p["j_per_token"] for p in shown]  # the marked points, predicted and measured
            ys += [t["j_per_token"] for p in shown for t in (p.get("measured") or {}).get("trail") or []
                   if t.get("j_per_token") is not None]
            ax.set_xlim(lo, hi)
            ax.set_ylim(0.8 * min(ys), 1.25 * max(ys))
        else:
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlabel(f"TPOT, ms ({objective.get('percentile') or 'p50'}; curves predicted, diamonds measured)")
        ax.set_ylabel("J per output token")
        ax.set_title(f"'{name}': time-energy frontier (star: recommended; diamonds: measured, filled: chosen)",
                     fontsize=8)
        ax.legend(fontsize=6, loc="upper right")
    fig.tight_layout()
    try:
        replace_atomically(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    finally:
        plt.close(fig)
