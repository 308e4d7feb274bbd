"""Trials of what a per-model profile meters, read back from runs that metered more than a profile does.

No GPU: reads ``benchmarks/energy_transfer_collect.py`` outputs and prices each run's end-to-end rows from
that run's own profile with three cost models: the kept one ('kept', :class:`~advisor.energy.prediction.
ModelProfileCostModel`: the line between all-BF16 and all-FP8, a prefill's bent by the profile's mixing point),
the one before it ('bent', :class:`BentCostModel`: decode steps bent too) and no bend ('line',
:class:`LineCostModel`), on variants of the profile:

* as metered (a profile of four decode contexts is read between the two nearest the rows', 512 and 768);
* ``--contexts 320,1280 --contexts 512,768 ...``: cut to those decode contexts (runs that metered several
  with ``energy_transfer_collect.py --contexts``);
* ``--point alt_fp8_odd`` / ``--point middle_fp8`` (bent model only): a second mixing point metered beside the
  profile's put in the place of ``alt_fp8`` (run 26 metered every other layer counted back from the last as its
  ``alt_fp8`` and the odd layers, as profiles did, as ``alt_fp8_odd``; runs 30-31 the middle half of the layers,
  ``energy_transfer_collect.py --extra-points middle_fp8``).

For each column: every row's error and the worst. Also the share of all-FP8's saving over idle that the
profile's mixing point(s) saved, per decode point, and the share of all-FP8's end-to-end saving each mixed
plan saved.

    python benchmarks/studies/profile_point_trials.py --raw R.json [--raw R2.json] [--contexts 320,1280 ...] \\
        [--point alt_fp8_odd] --out reports/benchmarks/profile_point_trials.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _report import command_line, read_notes, write_report  # noqa: E402
from energy_transfer import predict  # noqa: E402
from energy_transfer_collect import plan_formats  # noqa: E402

from advisor.energy.prediction import ModelProfileCostModel  # noqa: E402
from advisor.energy.profiling import (
    ALT_FP8,  # noqa: E402
    REFERENCE_SHAPES,  # noqa: E402
)
from advisor.plan import Plan  # noqa: E402

MIXED = ("mlp-fp8", "middle-fp8", "attn+half-mlp-fp8", "outer-fp8")


class BentCostModel(ModelProfileCostModel):
    """The cost model as it was until 2026-11-23 (commit e7e24ae): decode steps bent by the mixing point too."""

    bend_decode = True


class LineCostModel(ModelProfileCostModel):
    """No bend at all: every plan on the line between all-BF16 and all-FP8 (split by kind)."""

    def _dynamic_mj(self, phase, plan, x, step_ms, power):
        return super()._dynamic_mj(phase, plan, x, {k: v for k, v in step_ms.items() if k != ALT_FP8},
                                   {k: v for k, v in power.items() if k != ALT_FP8})


def cut_contexts(profile: dict, keep: tuple[int, ...]) -> dict:
    """``profile`` with its decode records at the contexts ``keep`` only."""
    names = {str(c) for c in profile["decode"]["contexts"]}
    kept = {str(c) for c in keep}

    def walk(x):
        if isinstance(x, dict):
            if x and set(x) == names:  # a per-context record
                return {k: v for k, v in x.items() if k in kept}
            return {k: walk(v) for k, v in x.items()}
        return x

    out = copy.deepcopy(profile)
    out["decode"] = walk(out["decode"])
    out["decode"]["contexts"] = out["decode"]["energy_contexts"] = sorted(keep)
    return out


def with_point(profile: dict, key: str) -> dict:
    """``profile`` with the mixing point metered as ``key`` in the place of ``alt_fp8``."""
    out = copy.deepcopy(profile)
    for phase in ("decode", "prefill"):
        out[phase]["alt_fp8"] = out[phase].pop(key)
    return out


def variants(profile: dict, contexts: list[tuple[int, ...]], points: list[str]) -> dict[str, tuple[type, dict]]:
    """(cost model, profile) per column: the kept model ('kept': prefill bent by the mixing point), the one
    before it ('bent': decode steps too) and none ('line'), on the profile as metered and cut to each context
    subset it metered more than; and the bent model with each named second mixing point in the place of the
    profile's own."""
    metered = set(profile["decode"]["contexts"])
    cuts = {"": profile}
    cuts.update({f", contexts {'/'.join(map(str, c))}": cut_contexts(profile, c) for c in contexts
                 if set(c) < metered})
    out: dict[str, tuple[type, dict]] = {}
    for label, p in cuts.items():
        out[f"kept{label}"] = (ModelProfileCostModel, p)
        if ALT_FP8 in profile["decode"]:
            out[f"bent{label}"] = (BentCostModel, p)
            out[f"line{label}"] = (LineCostModel, p)
    out.update({f"bent, point {k}": (BentCostModel, with_point(profile, k)) for k in points
                if k in profile["decode"] and holds_half(profile, k)})
    return out


def holds_half(profile: dict, key: str) -> bool:
    """Whether the point ``key`` holds half of the layers in FP8, as the alternating point of an even layer
    count does: the bent model measures a substituted point's bend against the alternating layout, which is
    right only then (the middle half of 24 layers is 12; of SmolLM2-135M's 30, 16)."""
    layers = len(profile["model"]["layers"])
    if key == "middle_fp8":
        return 2 * (layers - 2 * (layers // 4)) == layers
    return layers % 2 == 0


def saving_shares(profile: dict) -> list[dict]:
    """Per decode point, the share of all-FP8's saving over idle that each mixing-type point saved."""
    d, idle = profile["decode"], profile["idle_power_w"]
    points = [k for k in d if k != "mlp_fp8" and isinstance(d[k], dict) and "j_per_step" in d[k]]
    out = []
    for c in map(str, d["contexts"]):
        for i, b in enumerate(d["batches"]):
            def dyn(j, ms):
                return j - idle * ms / 1e3
            bf16 = dyn(d["j_per_step"]["bf16"][c][i], d["step_ms"]["bf16"][c][i])
            fp8 = dyn(d["j_per_step"]["fp8"][c][i], d["step_ms"]["fp8"][c][i])
            row = {"context": int(c), "batch": b}
            for p in points:
                row[p] = (bf16 - dyn(d[p]["j_per_step"][c][i], d[p]["step_ms"][c][i])) / (bf16 - fp8)
                row[f"{p}_cv"] = d[p]["cv"][c][i]
            out.append(row)
    return out


def plan_shares(rows: list[dict]) -> list[dict]:
    """Per decode batch, the share of all-FP8's end-to-end saving each mixed plan saved."""
    by = {(r["plan"], r["phase"], r["batch"]): r["measured_j_per_token"] for r in rows}
    out = []
    for b in sorted({r["batch"] for r in rows if r["phase"] == "decode"}):
        bf16, fp8 = by["bf16", "decode", b], by["fp8", "decode", b]
        out.append({"batch": b, **{p: (bf16 - by[p, "decode", b]) / (bf16 - fp8) for p in MIXED
                                   if (p, "decode", b) in by}})
    return out


def evaluate(path: Path, raw: dict, contexts: list[tuple[int, ...]], points: list[str]) -> list[dict]:
    out = []
    for name, data in raw["shapes"].items():
        shape = REFERENCE_SHAPES[name].shape(data["num_layers"])
        plans = {k: Plan(v) for k, v in plan_formats(data["num_layers"]).items()}
        models = {k: cls(p, shape) for k, (cls, p) in variants(data["profile"], contexts, points).items()}
        rows = [{"plan": r["plan"], "phase": r["phase"], "batch": r["batch"],
                 **{k: predict(m, plans[r["plan"]], r) / r["measured_j_per_token"] - 1 for k, m in models.items()}}
                for r in data["rows"]]
        out.append({"raw": str(path), "gpu_uuid": raw["gpu_uuid"], "shape": name, "variants": list(models),
                    "worst": {k: max(abs(r[k]) for r in rows) for k in models}, "rows": rows,
                    "mixing_point_shares": saving_shares(data["profile"]), "plan_shares": plan_shares(data["rows"])})
    return out


def render(d: dict) -> str:
    lines = [f"# Per-model profile trials ({d['gpu']})", "",
             f"Computed {d['date']}, no GPU, from runs on {d['units']} units, driver {d['driver']} (random weights, "
             f"the project's runtime, the NVML meter); command `{d['command']}`. Each run's end-to-end rows priced "
             "from that run's own profile: 'kept' is the kept cost model (a prefill's line bent by the profile's "
             "mixing point), 'bent' the one before it (decode steps bent too), 'line' no bend; see the script's doc "
             "for the profile variants. Target: 3%.", ""]
    if d.get("notes"):
        lines += ["## Findings", ""] + [f"- {n}" for n in d["notes"]] + [""]
    for s in d["shapes"]:
        ks = s["variants"]
        lines += [f"## {s['shape']}, GPU {s['gpu_uuid'][-12:]} (`{Path(s['raw']).name}`)", "",
                  "| plan | phase | batch | " + " | ".join(ks) + " |", "|---|---|---:|" + "---:|" * len(ks)]
        lines += [f"| {r['plan']} | {r['phase']} | {r['batch']} | " + " | ".join(f"{r[k] * 100:+.1f}%" for k in ks)
                  + " |" for r in s["rows"]]
        lines += ["| **worst** | | | " + " | ".join(f"**{s['worst'][k] * 100:.1f}%**" for k in ks) + " |", ""]
        points = [k for k in s["mixing_point_shares"][0] if k not in ("context", "batch") and not k.endswith("_cv")]
        plans = [p for p in MIXED if p in s["plan_shares"][0]]
        lines += ["Share of all-FP8's saving over idle that the mixing point(s) saved (window CV):", "",
                  "| context | batch | " + " | ".join(points) + " |", "|---:|---:|" + "---:|" * len(points)]
        lines += [f"| {m['context']} | {m['batch']} | " + " | ".join(f"{m[p]:.2f} ({m[p + '_cv'] * 100:.1f}%)"
                                                                  for p in points) + " |"
                  for m in s["mixing_point_shares"]]
        lines += ["", "Share of all-FP8's end-to-end decode saving that each mixed plan saved:", "",
                  "| batch | " + " | ".join(plans) + " |", "|---:|" + "---:|" * len(plans)]
        lines += [f"| {p['batch']} | " + " | ".join(f"{p[k]:.2f}" for k in plans) + " |" for p in s["plan_shares"]]
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", type=Path, action="append", required=True, help="energy_transfer_collect output")
    ap.add_argument("--contexts", action="append", default=[], help="c,c,...: a decode-context subset to read")
    ap.add_argument("--point", action="append", default=[], help="a second mixing point's key (alt_fp8_odd)")
    ap.add_argument("--notes", type=Path, help="a JSON list of notes for the Markdown")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    contexts = [tuple(int(c) for c in text.split(",")) for text in args.contexts]
    raws = [(p, json.loads(p.read_text())) for p in args.raw]
    shapes = []
    for path, raw in raws:
        shapes += evaluate(path, raw, contexts, args.point)
    d = {"gpu": " and ".join(sorted({r["gpu"] for _, r in raws})),
         "driver": " / ".join(sorted({r["driver"] for _, r in raws})),
         "units": len({r["gpu_uuid"] for _, r in raws}), "date": date.today().isoformat(),
         "command": command_line(argv),
         "runs": [str(p) for p, _ in raws], "shapes": shapes, "notes": read_notes(args.notes)}
    write_report(args.out, d, render)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
