"""The energy stages of a measured search on an 8B-shaped model on one GPU, timed.

What `advisor search --energy measured` does for energy on a GPU of the target kind, stage by
stage, on the Llama-3.1-8B shape (random weights): build the per-model profile (then reuse it),
price plans with it (the predicted tier every trial uses), and measure the baselines and a
mixed candidate with the full runtime under the project's default meter windows (the measured
tier the front gets). Accuracy stages (calibration, KL proxy, lm-eval) are not in it.

    python benchmarks/studies/energy_tiers_8b.py --out reports/benchmarks/energy_tiers_8b.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from advisor.energy.prediction import make_energy_tiers  # noqa: E402
from advisor.energy.profiling import (
    REFERENCE_SHAPES,  # noqa: E402
    ProfileStore,  # noqa: E402
)
from advisor.formats import GPU, Format  # noqa: E402
from advisor.plan import Plan  # noqa: E402
from advisor.recipe.schema import Workload  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--target", default="h100")
    args = ap.parse_args(argv)
    command = "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    shape = REFERENCE_SHAPES["Llama-3.1-8B"].shape()
    w = Workload(name="chat", batch_size=16, input_tokens=512, output_tokens=256)
    store = ProfileStore(tempfile.mkdtemp())
    stages: dict[str, float] = {}
    t = time.perf_counter()
    predicted, measured = make_energy_tiers("measured", shape, GPU(args.target), workloads=[w], store=store)
    stages["build per-model profile (incl. weights)"] = time.perf_counter() - t
    t = time.perf_counter()
    make_energy_tiers("measured", shape, GPU(args.target), workloads=[w], store=store)
    stages["reuse stored profile"] = time.perf_counter() - t
    names = [g.name for g in shape.groups]
    plans = {"bf16": Plan({n: Format.BF16 for n in names}), "fp8": Plan({n: Format.FP8 for n in names}),
             "mlp-fp8": Plan({n: Format.FP8 if n.endswith(("gate_up", "down")) else Format.BF16 for n in names})}
    t = time.perf_counter()
    pred = {k: predicted.estimate(p, w) for k, p in plans.items()}
    stages["predict 3 plans"] = time.perf_counter() - t
    rows = []
    for k, p in plans.items():
        t = time.perf_counter()
        m = measured.estimate(p, w)
        stages[f"measure {k} (prefill + decode, 5 s x 3 windows each)"] = time.perf_counter() - t
        rows.append({"plan": k, "measured_j_per_token": m.j_per_token, "predicted_j_per_token": pred[k].j_per_token,
                     "error": pred[k].j_per_token / m.j_per_token - 1, "measured_source": m.source,
                     "predicted_source": pred[k].source})
        print(rows[-1], flush=True)
    best_measured = min(rows, key=lambda r: r["measured_j_per_token"])["plan"]
    best_predicted = min(rows, key=lambda r: r["predicted_j_per_token"])["plan"]
    state = measured.inner.meter.counter.state()
    out = {"gpu": state.name, "gpu_uuid": state.uuid, "driver": state.driver, "power_limit_w": state.power_limit_w,
           "date": time.strftime("%Y-%m-%d"), "command": command, "workload": w.model_dump(), "stages_s": stages,
           "rows": rows, "lowest_energy_measured": best_measured, "lowest_energy_predicted": best_predicted,
           "confirmed": best_measured == best_predicted}
    args.out.write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
