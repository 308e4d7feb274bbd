"""The report of benchmarks/device/vllm_served_steps.py's runs (no GPU, no vLLM): vLLM's steps as it served the
advisor's steady load, against the vLLM step model's price of each.

A step's time: the interval stamped at the completion of the step before it. With vLLM's asynchronous scheduling
the engine launches a step before it takes the previous one's output, so a completion is stamped once the next step
is under way; at batch 64, where one step in four admits a prompt, every long interval is stamped at the step
before a prompt's (14.7 ms median with the advisor's bound), and the one stamped at the prompt's own step is short
(8.2 ms, against 6.8 for steps of decodes alone).

What an uncaptured step costs is fitted over the measured step sequences two ways, each step priced by the shipped
step model without its launches (``eager_us_per_layer`` 0) times a device scale: the shipped form (the launches
added to every uncaptured step) and launches overlapped (the host launches an uncaptured step's kernels one by
one while the GPU runs them, at most one step ahead of the GPU: vLLM's queue of two steps).

    python benchmarks/engine_true/served_steps_report.py reports/benchmarks/vllm_served_steps_data/*.json \
        --report reports/benchmarks/vllm_served_steps_h200
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[1])]
os.environ.setdefault("ADVISOR_PROFILE_DIR", tempfile.mkdtemp())  # the shipped profiles only, never a user's

from _report import command_line, dump_json, md_table  # noqa: E402
from scipy.optimize import least_squares  # noqa: E402
from served_rows import shape_of  # noqa: E402

from advisor.energy.prediction import VllmServedModel, VllmServing, make_predicted_model  # noqa: E402
from advisor.energy.prediction._vllm_served import poisson_weights  # noqa: E402
from advisor.energy.prediction._vllm_step import Chunk  # noqa: E402
from advisor.energy.profiling import shipped_vllm_profile  # noqa: E402
from advisor.formats import GPU, Format  # noqa: E402
from advisor.plan import Plan  # noqa: E402
from advisor.recipe.schema import Workload  # noqa: E402

SHAPE = "Llama-3.1-8B"  # a run's shape where it names none (benchmarks/device/vllm_served_steps.py SHAPE)
K_LABELS = ("0", "1", "2", "3", "4+")  # prompts joining a step
ALL = "all shapes"  # the fit over every run's rows
QUEUE = 2  # steps vLLM 0.26's engine keeps in flight with asynchronous scheduling (EngineCore.batch_queue)


class Pricer:
    """The shipped vLLM step model of a run's shape on the H200, BF16: each step and each served steady state under
    a row's engine sizes; step prices cached (thousands of steps a row)."""

    def __init__(self, name: str = SHAPE) -> None:
        shape, config = shape_of(name)
        gpu = GPU("h200")
        builtin = make_predicted_model(shape, gpu, model_config=config)
        self.model = VllmServedModel(builtin, shape, gpu, shipped_vllm_profile(gpu))
        self.plan = Plan.uniform([g.name for g in shape.groups], Format.BF16)
        self.layers = shape.num_layers
        self.launch_ms = self.model.terms.eager_us_per_layer * self.layers / 1e3
        self._cache: dict[tuple, tuple[float, str]] = {}

    def step(self, serving: VllmServing, decodes: int, context: float, prompts: int, tokens: int, prompt_length: int
             ) -> tuple[float, str]:
        """(ms as the step model prices it, its graph) of one step: ``prompts`` chunks of ``prompt_length``-token
        prompts holding ``tokens``."""
        key = (serving, decodes, round(context, -1), prompts, tokens, prompt_length)
        if key not in self._cache:
            q, r = divmod(tokens, prompts) if prompts else (0, 0)
            chunks = [Chunk(q + (i < r), prompt_length) for i in range(prompts)]
            s = self.model.steps.step(self.plan, decodes, key[2], chunks, serving)
            self._cache[key] = (s.ms, s.graph)
        return self._cache[key]

    def served(self, row: dict[str, Any], serving: VllmServing, run: dict[str, Any]) -> Any:
        w = Workload(name="w", batch_size=row["batch"], input_tokens=run["input_tokens"],
                     output_tokens=run["output_tokens"])
        return self.model.served_state(self.plan, w, row["batch"], serving=serving)


def timed_steps(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Each step with its own time: the interval stamped at the step before it (module docstring)."""
    cols = row["steps_columns"]
    stamped = [dict(zip(cols, v, strict=True)) for v in row["steps"]]
    return [{**cur, "ms": prev["ms"]} for prev, cur in zip(stamped, stamped[1:], strict=False)]


def admissions(steps: list[dict[str, Any]], lam: float) -> dict[str, list[float]]:
    """Shares of steps admitting k = 0 .. 4+ prompts: measured, Poisson of mean ``lam`` (the step model's), and
    regular (every step ``floor(lam)`` or ``ceil(lam)``, mean ``lam``)."""
    n = len(steps)
    measured = [sum(1 for s in steps if min(int(s["prompts"]), 4) == k) / n for k in range(5)]
    weights = poisson_weights(lam)
    pois = [weights[k] if k < len(weights) else 0.0 for k in range(4)]
    lo, f = math.floor(lam), lam - math.floor(lam)
    regular = [(1 - f) * (k == lo) + f * (k == lo + 1) for k in range(5)]
    return {"measured": measured, "poisson": [*pois, 1 - sum(pois)], "regular": regular}


def overlapped(seq: list[tuple[float, bool]], launch_ms: float) -> float:
    """Mean step time of ``seq`` ((device ms, uncaptured) a step) when the host launches an uncaptured step's kernels
    as the GPU runs them (``launch_ms`` a step), at most :data:`QUEUE` - 1 step ahead of the GPU; a captured step is
    one launch. The first fifth is the pipeline filling."""
    launched = [0.0] * len(seq)
    done = [0.0] * len(seq)
    for n, (device, eager) in enumerate(seq):
        start = max(launched[n - 1] if n else 0.0, done[n - QUEUE] if n >= QUEUE else 0.0)
        prev = done[n - 1] if n else 0.0
        if eager:
            launched[n] = start + launch_ms
            done[n] = max(prev + device, launched[n])
        else:
            launched[n] = start
            done[n] = max(prev, start) + device
    k = len(seq) // 5
    return (done[-1] - done[k]) / (len(seq) - 1 - k)


def eager_fits(sequences: list[tuple[float, list[tuple[float, bool]], int]]) -> dict[str, Any]:
    """Both forms (module docstring) fitted over ``sequences`` ((measured mean ms, the steps' (ms less launches,
    uncaptured), decoder layers)): device scale and launch ms a layer, least squares on the log ratio of the mean
    step."""
    forms = {"added": lambda seq, s, u, n: statistics.fmean(s * d + (u * n if e else 0.0) for d, e in seq),
             "overlapped": lambda seq, s, u, n: overlapped([(s * d, e) for d, e in seq], u * n)}
    out = {}
    for name, mean in forms.items():
        def residuals(x: Any, mean: Any = mean) -> list[float]:
            return [math.log(mean(seq, x[0], x[1], n) / measured) for measured, seq, n in sequences]

        # the overlapped form is flat in u wherever no launch outruns the GPU: start from a grid of launch times
        fits = [least_squares(residuals, [1.0, u0], bounds=([0.5, 0.0], [2.0, 3.0]), diff_step=1e-3)
                for u0 in (0.1, 0.5, 0.9, 1.3)]
        best = min(fits, key=lambda r: float(sum(r.fun ** 2)))
        out[name] = {"device_scale": float(best.x[0]), "launch_ms_per_layer": float(best.x[1]),
                     "rms_pct": 100 * math.sqrt(float(sum(best.fun ** 2)) / len(best.fun)),
                     "error_pct": [100 * (math.exp(e) - 1) for e in best.fun]}
    return out


def analyse(paths: list[str]) -> dict[str, Any]:
    pricers: dict[str, Pricer] = {}
    rows, errors, sequences = [], [], []
    for path in paths:
        run = json.loads(Path(path).read_text())
        shape = run.get("shape", SHAPE)
        pricer = pricers.setdefault(shape, Pricer(shape))
        for row in run["rows"]:
            if "error" in row:
                errors.append({"source": path, "batch": row["batch"], "bound": row["bound"],
                               "error": row["error"].strip().splitlines()[-1][:200] if row["error"].strip() else ""})
                continue
            serving = VllmServing(row["batch"], run["budget"], None, tuple(row["capture_sizes"]))
            steps = timed_steps(row)
            priced = [pricer.step(serving, int(s["decodes"]), float(s["context"]), int(s["prompts"]),
                                  int(s["prompt_tokens"]), run["input_tokens"]) for s in steps]
            for s, (ms, graph) in zip(steps, priced, strict=True):
                s.update(pred=ms, graph=graph, k=K_LABELS[min(int(s["prompts"]), 4)])
            mean = statistics.fmean(s["ms"] for s in steps)
            sequences.append((shape, (mean, [(s["pred"] - (pricer.launch_ms if s["graph"] == "eager" else 0.0),
                                              s["graph"] == "eager") for s in steps], pricer.layers)))
            served = pricer.served(row, serving, run)
            rows.append({
                "source": path, "shape": shape, "gpu": run["gpu"], "driver": run["driver"], "date": run["date"],
                "vllm_version": run["vllm_version"],
                "batch": row["batch"], "bound": row["bound"], "spread": row.get("spread", 0.0),
                "max_capture_size": row["max_capture_size"], "steps": len(steps),
                "measured": {"tokens_per_s": row["tokens_per_s"], "j_per_token": row["j_per_token"],
                             "mean_step_ms": mean},
                "predicted": {"tokens_per_s": served.tokens_per_s, "j_per_token": served.j_per_token,
                              "mean_step_ms": row["batch"] / served.tokens_per_s * 1e3,
                              "steps_as_measured_ms": statistics.fmean(s["pred"] for s in steps)},
                "admissions": admissions(steps, row["batch"] / run["output_tokens"]),
                "groups": groups(steps)})
    fits = {ALL: eager_fits([seq for _, seq in sequences])}
    shapes = list(dict.fromkeys(shape for shape, _ in sequences))
    if len(shapes) > 1:  # shapes may disagree on the form: each fitted alone too
        fits |= {shape: eager_fits([seq for name, seq in sequences if name == shape]) for shape in shapes}
    for group, by_form in fits.items():
        members = [r for r in rows if group in (ALL, r["shape"])]
        for k, r in enumerate(members):
            r.setdefault("eager_fit_error_pct", {})[group] = {name: f["error_pct"][k] for name, f in by_form.items()}
    return {"rows": rows, "errors": errors,
            "eager_fits": {group: {k: {x: v for x, v in f.items() if x != "error_pct"} for k, f in by_form.items()}
                           for group, by_form in fits.items()}}


def groups(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Steps by (k, graph): how many, measured and predicted median ms."""
    out = []
    for k in K_LABELS:
        for graph in ("full", "piecewise", "eager"):
            g = [s for s in steps if s["k"] == k and s["graph"] == graph]
            if g:
                out.append({"k": k, "graph": graph, "steps": len(g),
                            "measured_ms_p50": statistics.median(s["ms"] for s in g),
                            "predicted_ms_p50": statistics.median(s["pred"] for s in g)})
    return out


def _pct(a: float, b: float) -> str:
    return f"{100 * (a / b - 1):+.1f}"


def _load(r: dict[str, Any]) -> str:
    return f"spread ±{100 * r['spread']:.0f}%" if r["spread"] else "fixed"


def markdown(d: dict[str, Any]) -> str:
    rows, fits = d["rows"], d["eager_fits"]
    first = rows[0]
    lines = [f"# vLLM's steps as it served the advisor's steady load: {first['gpu']}", "",
             f"GPU: {first['gpu']}. Driver: {first['driver']}. Dates: "
             f"{', '.join(sorted({r['date'][:16] for r in rows}))} UTC. vLLM: "
             f"{', '.join(sorted({r['vllm_version'] for r in rows}))}.", "",
             f"Command: `{d['command']}` (measured by `benchmarks/device/vllm_served_steps.py`, the command in each "
             "source file)", "", *[" ".join(p.split()) + "\n" for p in (__doc__ or "").split("\n\n")[1:3]],
             "Loads: B requests of 512 random tokens in flight, 256 out ('fixed': all 256, the advisor's own load, "
             "as `advisor verify` meters; 'spread': later requests 128-384, mean 256). Bounds: `advisor` (graphs "
             "up to the decodes and one prompt: the advisor's serving), `wide` (and four), `default` (vLLM's, "
             "min(2 B, 512): every step a prompt joins runs without a graph). Predicted: the shipped step model "
             "(Poisson admissions).", "", "## Served steady states", ""]
    lines += md_table(["shape", "batch", "load", "bound", "tok/s", "predicted", "err %", "J/token", "predicted",
                       "err %", "mean step ms", "predicted", "err %", "these steps priced, ms"],
                      [[r["shape"], str(r["batch"]), _load(r), r["bound"],
                        *[c for k, fmt in (("tokens_per_s", ".0f"), ("j_per_token", ".4f"), ("mean_step_ms", ".2f"))
                          for c in (format(r["measured"][k], fmt), format(r["predicted"][k], fmt),
                                    _pct(r["predicted"][k], r["measured"][k]))],
                        f"{r['predicted']['steps_as_measured_ms']:.2f}"] for r in rows], "lrll" + "r" * 10)
    within: dict[str, list[bool]] = {}
    for r in rows:
        within.setdefault(r["bound"], []).append(abs(r["predicted"]["tokens_per_s"] / r["measured"]["tokens_per_s"]
                                                     - 1) <= 0.08)
    lines += ["", "The shipped model's tokens/s within 8% of what vLLM served, by bound: "
              + "; ".join(f"{bound} {sum(v)} of {len(v)}" for bound, v in within.items()) + "."]
    lines += ["", "## Prompts admitted a step: measured against Poisson and regular", "",
              "Share of steps admitting k prompts (k = 0, 1, 2, 3, 4+).", ""]
    lines += md_table(["shape", "batch", "load", "bound", "measured", "Poisson (the step model)", "regular"],
                      [[r["shape"], str(r["batch"]), _load(r), r["bound"],
                        *[" / ".join(f"{x:.2f}" for x in r["admissions"][k]) for k in ("measured", "poisson",
                                                                                         "regular")]]
                       for r in rows], "lrll")
    lines += ["", "## What an uncaptured step costs", "",
              f"Fitted over the measured step sequences (module docstring): every row together and, where the runs "
              f"are of several shapes, each shape's rows alone; the shipped form prices the launches at "
              f"{d['shipped_launch_us_per_layer']:.0f} us a layer.", ""]
    lines += md_table(["rows of", "form", "device scale", "launches, us a layer", "RMS %"],
                      [[group, name, f"{f['device_scale']:.3f}", f"{1e3 * f['launch_ms_per_layer']:.0f}",
                        f"{f['rms_pct']:.1f}"] for group, by_form in fits.items() for name, f in by_form.items()],
                      "llrrr")
    per_shape = len(fits) > 1
    names = list(fits[ALL])
    lines += ["", "Each row's mean step, fitted form against measured (%), fitted over "
              f"{'its shape' if per_shape else 'every row'}:", ""]
    lines += md_table(["shape", "batch", "load", "bound", *names],
                      [[r["shape"], str(r["batch"]), _load(r), r["bound"],
                        *[f"{r['eager_fit_error_pct'][r['shape'] if per_shape else ALL][n]:+.1f}" for n in names]]
                       for r in rows], "lrll" + "r" * len(names))
    lines += ["", "## Steps by what they ran", "",
              "Median ms of each row's steps by prompts joining (k) and graph. A row's mean step is exact (its "
              "intervals add up to its window); a single step's time is only as good as the attribution above, and "
              "where a step runs longer than the host's lead, its time spills into the next interval (the steps of "
              "two or more prompts under spread lengths, timed here below a step of one).", ""]
    lines += md_table(["shape", "batch", "load", "bound", "k", "graph", "steps", "measured", "predicted"],
                      [[r["shape"], str(r["batch"]), _load(r), r["bound"], g["k"], g["graph"], str(g["steps"]),
                        f"{g['measured_ms_p50']:.2f}", f"{g['predicted_ms_p50']:.2f}"]
                       for r in rows for g in r["groups"]], "lrllllrrr")
    if d["errors"]:
        lines += ["", "## Runs that failed (left out)", "",
                  *[f"- batch {e['batch']}, {e['bound']} ({e['source']}): {e['error']}" for e in d["errors"]]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("runs", nargs="+", help="benchmarks/device/vllm_served_steps.py --out files")
    a.add_argument("--report", type=Path, default=Path("reports/benchmarks/vllm_served_steps_h200"))
    args = a.parse_args(argv)
    shipped = shipped_vllm_profile(GPU("h200"))["params"]["eager_us_per_layer"]
    d = {"command": command_line(argv), "sources": args.runs, "shipped_launch_us_per_layer": shipped,
         **analyse(args.runs)}
    args.report.parent.mkdir(parents=True, exist_ok=True)
    dump_json(args.report.with_suffix(".json"), d, newline=True)
    args.report.with_suffix(".md").write_text(markdown(d))


if __name__ == "__main__":
    main()
