"""Ablation behind reports/benchmarks/layer_additivity.md (kind corner): the per-model cost model with and without
the kind corner (MLP-only FP8) on the same measured runs; "without" drops the corner from the stored profile, which
the cost model then prices by weight alone, as before the corner. From the repository root:
`python reports/benchmarks/layer_additivity/ablate_kind_corner.py RAW.json [RAW2.json ...]`, RAW being runs under
reports/benchmarks/energy_transfer_data/ (h100_raw14.json, ...)."""

import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, "benchmarks")
import energy_transfer as et
from energy_transfer_collect import plan_formats

from advisor.energy.prediction import ModelProfileCostModel
from advisor.energy.profiling import REFERENCE_SHAPES
from advisor.plan import Plan

for f in sys.argv[1:]:
    d = json.loads(Path(f).read_text())
    for name, v in d["shapes"].items():
        shape = REFERENCE_SHAPES[name].shape(v["num_layers"])
        plans = {k: Plan(x) for k, x in plan_formats(v["num_layers"]).items()}
        old = copy.deepcopy(v["profile"])
        for ph in ("decode", "prefill"):
            old[ph].pop("mlp_fp8", None)
        for label, prof in (("with corner", v["profile"]), ("without", old)):
            m = ModelProfileCostModel(prof, shape)
            errs = {
                (r["plan"], r["phase"], r["batch"]): et.predict(m, plans[r["plan"]], r) / r["measured_j_per_token"] - 1
                for r in v["rows"]
            }

            def mx(keep, errs=errs):
                return 100 * max(abs(e) for k, e in errs.items() if keep(k))

            mean = 100 * sum(abs(e) for e in errs.values()) / len(errs)
            print(
                f"{f.split('/')[-1]:16s} {name:13s} {label:12s} all {mx(lambda k: True):.1f}%  "
                f"unprofiled mixed {mx(lambda k: k[0] in ('middle-fp8', 'attn+half-mlp-fp8')):.1f}%  "
                f"attn+half {mx(lambda k: k[0] == 'attn+half-mlp-fp8'):.1f}%  mean|e| {mean:.2f}%"
            )
