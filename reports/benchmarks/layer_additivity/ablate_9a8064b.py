"""Ablation behind reports/benchmarks/layer_additivity.md (notes): the trial per-model cost model of commit 9a8064b
(last-layer corner, third decode context), with and without each addition, on the same measured runs. Runs
against that commit only (`git worktree add /tmp/t 9a8064b`, then from /tmp/t:
`python reports/benchmarks/layer_additivity/ablate_9a8064b.py RAW.json [RAW2.json ...]`, RAW being runs under
reports/benchmarks/energy_transfer_data/, h100_raw12.json and the others)."""

import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, "benchmarks")
import energy_transfer as et  # noqa: E402
from energy_transfer_collect import plan_formats  # noqa: E402

from advisor.energy.prediction import ModelProfileCostModel  # noqa: E402
from advisor.energy.profiling import REFERENCE_SHAPES  # noqa: E402
from advisor.plan import Plan  # noqa: E402


def variant(p: dict, corner: bool, mid: bool) -> dict:
    """The profile without the last-layer corner (``corner`` False) and/or without its context 640 (``mid`` False)."""
    p = copy.deepcopy(p)
    if not corner:
        for ph in ("decode", "prefill"):
            p[ph].pop("last_fp8", None)
    if not mid and "640" in map(str, p["decode"]["contexts"]):
        d = p["decode"]
        d["contexts"] = [c for c in d["contexts"] if str(c) != "640"]
        d["energy_contexts"] = d["contexts"]

        def drop(t) -> None:
            if isinstance(t, dict):
                t.pop("640", None)

        for k in ("step_ms", "j_per_step"):
            for v in d[k].values():
                drop(v)
            if "last_fp8" in d:
                drop(d["last_fp8"][k])
    return p


def pct(values) -> str:
    return f"{100 * max(map(abs, values)):.1f}%"


for f in sys.argv[1:]:
    d = json.loads(Path(f).read_text())
    for name, v in d["shapes"].items():
        shape = REFERENCE_SHAPES[name].shape(v["num_layers"])
        plans = {k: Plan(x) for k, x in plan_formats(v["num_layers"]).items()}
        out = []
        for corner in (True, False):
            for mid in (True, False):
                m = ModelProfileCostModel(variant(v["profile"], corner, mid), shape)
                errs = [et.predict(m, plans[r["plan"]], r) / r["measured_j_per_token"] - 1 for r in v["rows"]]
                dec = [e for e, r in zip(errs, v["rows"], strict=True) if r["phase"] == "decode"]
                mixed = [e for e, r in zip(errs, v["rows"], strict=True) if r["plan"] in ("mlp-fp8", "middle-fp8")]
                mean = 100 * sum(map(abs, errs)) / len(errs)
                out.append(f"corner={int(corner)} ctx640={int(mid)}: max {pct(errs)} decode {pct(dec)} "
                           f"mixed {pct(mixed)} mean|e| {mean:.2f}%")
        print(f.split("/")[-1], name)
        for o in out:
            print("   ", o)
