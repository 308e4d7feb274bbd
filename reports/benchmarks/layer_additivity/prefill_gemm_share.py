"""Offline check behind reports/benchmarks/layer_additivity.md (notes): prefill mixed-plan energy shared by each
group's GEMM-time saving instead of its weights, on every stored run (no GPU). Run from the repository root:
`python reports/benchmarks/layer_additivity/prefill_gemm_share.py`."""

import glob
import json
import sys
from pathlib import Path

sys.path.insert(0, "benchmarks")
import energy_transfer as et  # noqa: E402
from energy_transfer_collect import plan_formats  # noqa: E402

from advisor.energy import prediction as mc  # noqa: E402
from advisor.energy.profiling import REFERENCE_SHAPES  # noqa: E402
from advisor.formats import Format  # noqa: E402
from advisor.plan import Plan  # noqa: E402


class GemmShare(mc.ModelProfileCostModel):
    def _read_weights(self, phase, group, x, profile_routing=False):
        if "lengths" in phase:  # prefill: the group's GEMM-time saving as its "weight"
            k = self.kinds[group.name]
            return max(1e-9, self._layer_gemm(phase, Format.BF16, k, x) - self._layer_gemm(phase, Format.FP8, k, x))
        return super()._read_weights(phase, group, x, profile_routing)


for f in sorted(glob.glob("reports/benchmarks/energy_transfer_data/h*_raw*.json")):
    if f.endswith(("h100_raw.json", "h200_raw.json", "h100_raw2.json")):
        continue
    d = json.loads(Path(f).read_text())
    for name, v in d["shapes"].items():
        shape = REFERENCE_SHAPES[name].shape(v["num_layers"])
        plans = {k: Plan(x) for k, x in plan_formats(v["num_layers"]).items()}
        out = []
        for cls in (mc.ModelProfileCostModel, GemmShare):
            m = cls(v["profile"], shape)
            errs = [(r["phase"], et.predict(m, plans[r["plan"]], r) / r["measured_j_per_token"] - 1) for r in v["rows"]]
            out.append((max(abs(e) for _, e in errs), max(abs(e) for p, e in errs if p == "prefill")))
        print(f"{f.split('/')[-1]:16s} {name:14s} weights: max {100 * out[0][0]:.1f}% prefill {100 * out[0][1]:.1f}%"
              f"   gemm-share: max {100 * out[1][0]:.1f}% prefill {100 * out[1][1]:.1f}%")
