"""Fit a GPU kind's vLLM step profile (advisor/energy/profiles/vllm/<gpu>.json) on vLLM-served measurements, and
report each row against the fitted vLLM step model and against the built-in runtime's prediction.

The engine terms (advisor/energy/prediction/_vllm_step.py: host ms a step, us a sequence, the launches of a
PIECEWISE and an eager pass per layer, scales on the device's time and its energy over idle, the steps a new request
waits) are fitted by least squares on log(predicted / measured) of tokens/s, J/token, TPOT p50 and TTFT p50 over
the rows served as the advisor serves today. Rows whose FP8 layers ran vLLM's CUTLASS kernel (before the export
chose cuBLASLt on Hopper) are checks, never fitted. With few rows of a GPU kind, ``--free`` fits only some terms
and ``--carry-from`` takes the others from another kind's profile (host time is the CPU's, not the GPU's).

    python benchmarks/engine_true/vllm_step_fit.py --gpu h100 --manifest benchmarks/engine_true/h100_inputs.json
    python benchmarks/engine_true/vllm_step_fit.py --gpu h200 --manifest benchmarks/engine_true/h200_inputs.json \
        --free device_time_scale device_energy_scale --carry-from advisor/energy/profiles/vllm/h100.json
    # more measurements: --input RUN/verify.json --recipe RUN_RECIPE.yaml, --input SWEEP.json --gpu-name \
    #   "NVIDIA H200" --driver D (benchmarks/device/engine_true_sweep.py's file; repeatable), or another --manifest
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "device"), str(HERE.parents[1])]
os.environ.setdefault("ADVISOR_PROFILE_DIR", tempfile.mkdtemp())  # the shipped profiles only, never a user's

from _report import command_line, dump_json  # noqa: E402
from served_rows import ServedRow, read_input, read_manifest, shape_of  # noqa: E402
from step_fit_report import OBSERVED, markdown, objectives_markdown, summary  # noqa: E402

from advisor.energy.prediction import (  # noqa: E402
    EngineTerms,
    VllmServedModel,
    VllmServing,
    make_predicted_model,
    vllm_device,
)
from advisor.energy.profiling import REFERENCE_SHAPES, VLLM_SCHEMA, VLLM_VERSION, validate_vllm_profile  # noqa: E402
from advisor.formats import GPU, GPU_SPECS, Format  # noqa: E402
from advisor.plan import Plan  # noqa: E402
from advisor.recipe.schema import Workload  # noqa: E402
from advisor.search.operating import steady_state  # noqa: E402

BOUNDS = {"host_ms": (0.0, 5.0), "per_seq_us": (0.0, 50.0), "piecewise_us_per_layer": (0.0, 300.0),
          "eager_us_per_layer": (0.0, 3000.0), "device_time_scale": (0.5, 2.5), "device_energy_scale": (0.5, 2.5),
          "admission_steps": (0.0, 3.0), "gap_power_w": (0.0, 700.0)}
START = {"host_ms": 0.4, "per_seq_us": 1.0, "piecewise_us_per_layer": 10.0, "eager_us_per_layer": 100.0,
         "device_time_scale": 1.0, "device_energy_scale": 1.0, "admission_steps": 1.0, "gap_power_w": 100.0}


class Rows:
    """The fitted model of each (shape, GPU kind) and each row's plan, workload and engine."""

    def __init__(self, rows: list[ServedRow], gap_power_w: float, moe_kernels: dict[str, Any] | None = None) -> None:
        self.rows = rows
        self._models: dict[tuple[str, str], tuple[Any, VllmServedModel]] = {}
        self.gap_power_w = gap_power_w
        self.moe_kernels = moe_kernels  # vLLM's fused MoE measured (a profile's moe_kernels): a MoE's experts from it

    def models(self, row: ServedRow) -> tuple[Any, VllmServedModel]:
        key = (row.shape, row.gpu_kind)
        if key not in self._models:
            shape, config = shape_of(row.shape)
            builtin = make_predicted_model(shape, GPU(row.gpu_kind), model_config=config)
            profile = {"params": {**START, "gap_power_w": self.gap_power_w}, "vllm_version": row.vllm_version,
                       "gpu": row.gpu, "driver": row.driver, "date": row.date}
            device = vllm_device(builtin, shape, GPU(row.gpu_kind), self.moe_kernels)
            self._models[key] = (builtin, VllmServedModel(device, shape, GPU(row.gpu_kind), profile))
        return self._models[key]

    @staticmethod
    def serving(row: ServedRow) -> VllmServing:
        return VllmServing(row.max_num_seqs, row.max_num_batched_tokens, row.max_capture_size,
                           tuple(row.capture_sizes) if row.capture_sizes else None)

    @staticmethod
    def plan(row: ServedRow, names: list[str]) -> Plan:
        if row.formats:
            return Plan({n: Format(f) for n, f in row.formats.items()})
        if row.plan == "mixed":
            return Plan({n: Format.BF16 if int(n.split(".")[1]) < 8 else Format.FP8 for n in names})
        return Plan.uniform(names, Format(row.plan.removeprefix("all-")))

    def predict(self, row: ServedRow, terms: EngineTerms | None) -> dict[str, float]:
        """The row's steady state: vLLM's step model with ``terms``, or the built-in runtime's (None)."""
        builtin, served = self.models(row)
        plan = self.plan(row, [g.name for g in served.shape.groups])
        w = Workload(name="row", batch_size=row.batch, input_tokens=row.input_tokens,
                     output_tokens=row.output_tokens)
        if terms is None:
            s = steady_state(builtin, plan, w, row.batch)
        else:
            s = served.with_terms(terms).served_state(plan, w, row.batch, serving=self.serving(row))
        busy = {} if s.busy_share is None else {"gpu_busy_pct": 100 * s.busy_share}  # prompt steps included
        return {"tokens_per_s": s.tokens_per_s, "j_per_token": s.j_per_token, "tpot_ms": s.tpot_ms,
                "ttft_ms": s.ttft_ms, **busy}


def terms_of(params: dict[str, float]) -> EngineTerms:
    return EngineTerms(**{k: params[k] for k in (*EngineTerms.NAMES, "gap_power_w")})


def residuals(data: Rows, rows: list[ServedRow], params: dict[str, float]) -> list[float]:
    terms = terms_of(params)
    out = []
    for r in rows:
        pred = data.predict(r, terms)
        out += [math.log(pred[k] / getattr(r, k)) for k in OBSERVED if getattr(r, k)]
    return out


def fit(data: Rows, rows: list[ServedRow], free: list[str], fixed: dict[str, float]) -> dict[str, float]:
    from scipy.optimize import least_squares

    def params(x) -> dict[str, float]:
        return {**fixed, **dict(zip(free, x, strict=True))}

    x0 = [fixed.get(k, START[k]) for k in free]
    res = least_squares(lambda x: residuals(data, rows, params(x)), x0,
                        bounds=([BOUNDS[k][0] for k in free], [BOUNDS[k][1] for k in free]), diff_step=1e-3)
    return params(res.x)


def error_rows(data: Rows, rows: list[ServedRow], terms: EngineTerms) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        vllm, builtin = data.predict(r, terms), data.predict(r, None)
        busy = vllm.pop("gpu_busy_pct")  # what NVML's busy share of the load is checked against
        err = {k: 100 * (vllm[k] / getattr(r, k) - 1) for k in OBSERVED if getattr(r, k)}
        before = {k: 100 * (builtin[k] / getattr(r, k) - 1) for k in OBSERVED if getattr(r, k)}
        out.append({**r.to_dict(), "fitted": r.fittable, "predicted": vllm, "error_pct": err,
                    "builtin_predicted": builtin, "builtin_error_pct": before,
                    "gpu_busy_pct_predicted": busy})
    return out



def objective_rows(paths: list[str]) -> list[dict[str, Any]]:
    """The operating-batch searches of engine_true_sweep.py files among ``paths``: per shape, plan and objective, the
    batch this code's step model predicts (and the one predicted when it was served) against the largest batch any
    metering of that engine met the objective at, the sweep's fixed batches included (the error in % of that
    batch)."""
    from engine_true_sweep import predicted_batches

    out = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        for r in data.get("rows", []) if isinstance(data, dict) else []:
            now = predicted_batches(r["shape"], r["plan"], data["gpu_kind"]) if r.get("objectives") else {}
            for name, o in (r.get("objectives") or {}).items():
                ms = float(name.removeprefix("tpot"))
                fixed = [int(k[1:]) for k, b in (r.get("batches") or {}).items() if b["tpot_ms_p50"] <= ms]
                met = max([*([o["batch"]] if o.get("meets") else []), *fixed], default=None)
                out.append({"shape": r["shape"], "plan": r["plan"], "objective": name,
                            "predicted_batch": now[name], "predicted_when_served": o["predicted_batch"],
                            "largest_met": met,
                            "batch_error_pct": 100.0 * (now[name] - met) / met if met else None,
                            "search": o["search"], "source": path})
    return out


def write_report(stem: Path, first: ServedRow, date: str, command: str, profile: dict[str, Any],
                 errors: list[dict[str, Any]], extra: dict[str, Any] | None = None, tail: str = "") -> dict[str, Any]:
    """The rows' report (``stem``.json, ``stem``.md; ``tail`` ends the Markdown), with their RMS errors."""
    report = {"gpu": first.gpu, "driver": first.driver, "date": date, "command": command,
              "vllm_version": first.vllm_version, "profile": profile, "rms_pct": summary(errors, "error_pct"),
              "builtin_rms_pct": summary(errors, "builtin_error_pct"), "rows": errors, **(extra or {})}
    dump_json(stem.with_suffix(".json"), report)
    stem.with_suffix(".md").write_text(markdown(report) + tail)
    return report


def check(profile_path: str, rows: list[ServedRow], gap: float, report_stem: str, command: str,
          objectives: list[dict[str, Any]] | None = None, moe_kernels: dict[str, Any] | None = None) -> None:
    """Every row priced with a shipped profile's terms, none fitted (reported as checks); with ``objectives``
    (:func:`objective_rows`), the operating batches too; with ``moe_kernels``, that table of vLLM's fused MoE in
    place of the profile's."""
    profile = json.loads(Path(profile_path).read_text())
    if moe_kernels is not None:
        profile["moe_kernels"] = moe_kernels
    params = profile["params"]
    data = Rows(rows, params.get("gap_power_w", gap), profile.get("moe_kernels"))
    errors = [{**e, "fitted": False} for e in error_rows(data, rows, terms_of({**START, "gap_power_w": gap,
                                                                                **params}))]
    first = rows[0]
    table = profile.get("moe_kernels")
    moe = (f" A MoE's routed experts from vLLM {table['vllm_version']}'s fused MoE measured on {table['gpu']}, "
           f"{table['date']} ({table.get('source', 'moe_kernels')})." if table else "")
    checked = {**profile, "source": f"Checked, not fitted: {profile_path} ({profile['source']}) on {len(rows)} rows "
               f"from {', '.join(sorted({r.source for r in rows}))}.{moe}"}
    if table:  # the table's rows are in the profile (and its source files): the report names it
        checked["moe_kernels"] = {k: v for k, v in table.items() if k != "rows"} | {"rows": len(table["rows"])}
    report = write_report(Path(report_stem), first, max(r.date for r in rows), command, checked, errors,
                          {"checked": True, "objectives": objectives or []},
                          "".join(line + "\n" for line in objectives_markdown(objectives or [])))
    print(json.dumps({"checked": profile_path, "rms_pct": report["rms_pct"],
                      "builtin_rms_pct": report["builtin_rms_pct"]}, indent=1))


def moe_table(paths: list[str], gpu: str) -> dict[str, Any]:
    """vllm_moe_kernels.py outputs (one a run: each may hold other geometries) as a profile's ``moe_kernels``: their
    GPU, latest date, vLLM and commands, and each row's geometry, format, tokens, ms and J a layer. The files must
    agree on GPU and vLLM version; a geometry and format measured twice is taken from the later file."""
    keys = ("experts", "top_k", "hidden", "intermediate", "format", "tokens", "ms_per_layer", "j_per_layer")
    runs = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        name = data["gpu_smi"].split(",")[0].strip()
        if gpu.upper() not in name.upper():
            raise SystemExit(f"{path} was measured on {name}, not on an {gpu}")
        runs.append({"gpu": name, "date": data["date"], "vllm_version": data["vllm_version"],
                     "command": data["command"], "source": path,
                     "rows": [{k: r[k] for k in keys} for r in data["rows"]]})
    if len({(r["gpu"], r["vllm_version"]) for r in runs}) > 1:
        raise SystemExit(f"{', '.join(paths)} were measured on {sorted({r['gpu'] for r in runs})} with vLLM "
                         f"{sorted({r['vllm_version'] for r in runs})}: one of each, please")
    return functools.reduce(kept_with, runs)


def _geometry(row: dict[str, Any]) -> tuple:
    """A kernel table row's geometry and format (its tokens aside)."""
    return row["experts"], row["top_k"], row["hidden"], row["intermediate"], row["format"]


def kept_with(earlier: dict[str, Any] | None, table: dict[str, Any]) -> dict[str, Any]:
    """``table`` with the geometries and formats of ``earlier`` (a table of the same GPU and vLLM) it does not
    measure: a run of some geometries adds to the table, it does not drop the others."""
    if not earlier or (earlier["gpu"], earlier["vllm_version"]) != (table["gpu"], table["vllm_version"]):
        return table
    new = {_geometry(r) for r in table["rows"]}
    kept = [r for r in earlier["rows"] if _geometry(r) not in new]
    if not kept:
        return table
    return {**table, "date": max(earlier["date"], table["date"]), "rows": kept + table["rows"],
            "command": f"{earlier['command']}; {table['command']}", "source": f"{earlier['source']}, {table['source']}"}


def terms_origin(carried: dict[str, Any], path: str) -> dict[str, Any]:
    """Where the terms a fit carries from ``carried`` (the profile at ``path``) were fitted: that profile's own
    ``terms_from`` where it carried them too (a profile carrying from itself keeps the first fit's), else its
    ``fitted_on`` and ``command``."""
    return carried.get("terms_from") or {"profile": path, "fitted_on": carried.get("fitted_on"),
                                          "command": carried.get("command")}


def main(argv: list[str] | None = None) -> None:
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--gpu", required=True, choices=[g.value for g in GPU])
    a.add_argument("--manifest", action="append", default=[], help="a JSON list of inputs (served_rows.py)")
    a.add_argument("--input", action="append", default=[], help="a measurement JSON (eightb, verify.json, rows); "
                   "FILE:KEY for a section of one")
    a.add_argument("--recipe", help="the recipe of --input verify.json runs (their workloads)")
    a.add_argument("--gpu-name", help="the GPU of --input engine_true_sweep.py files (they do not name it)")
    a.add_argument("--driver", default="unknown", help="its driver")
    a.add_argument("--free", nargs="+", default=list(EngineTerms.NAMES), choices=[*EngineTerms.NAMES, "gap_power_w"])
    a.add_argument("--carry-from", help="a vLLM step profile whose terms the ones not --free are taken from")
    a.add_argument("--gap-power-w", type=float, help="the GPU's draw while it waits for the host (default: the "
                   "idle power the shipped per-model profile of the Llama-3.1-8B shape metered, else the datasheet)")
    a.add_argument("--profile-out", default=None, help="default advisor/energy/profiles/vllm/<gpu>.json")
    a.add_argument("--report", default=None, help="default reports/benchmarks/vllm_step_fit_<gpu> (.json, .md)")
    a.add_argument("--check", metavar="PROFILE", help="fit nothing: price every row with this vLLM step profile's "
                   "terms (rows it was not fitted on: an out-of-sample check) and write only --report")
    a.add_argument("--moe-kernels", metavar="JSON", nargs="+",
                   help="benchmarks/device/vllm_moe_kernels.py's outputs (one a run; a geometry measured twice is "
                   "taken from the later file): vLLM's fused MoE of this GPU kind, kept in the profile (a MoE's "
                   "routed experts are priced from it); without it a fit keeps the table the profile at "
                   "--profile-out has; with it and no inputs, the table is written into that profile and nothing "
                   "is fitted")
    args = a.parse_args(argv)
    moe_kernels = moe_table(args.moe_kernels, args.gpu) if args.moe_kernels else None
    out = Path(args.profile_out or f"advisor/energy/profiles/vllm/{args.gpu}.json")
    if moe_kernels is not None and not (args.manifest or args.input or args.check):
        moe_kernels = kept_with(json.loads(out.read_text()).get("moe_kernels"), moe_kernels)
        profile = validate_vllm_profile({**json.loads(out.read_text()), "moe_kernels": moe_kernels}, str(out))
        dump_json(out, profile, indent=1, newline=True)
        print(json.dumps({"profile": str(out), "moe_kernels": len(moe_kernels["rows"])}))
        return
    if args.check and not args.report:
        raise SystemExit("--check writes a report of its own: give --report")

    rows = [r for m in args.manifest for r in read_manifest(m)]
    for spec in args.input:
        path, _, key = spec.partition(":")
        data = json.loads(Path(path).read_text())
        over: dict[str, Any] = {}
        if isinstance(data, dict) and "plans" in data and args.recipe:
            over = {"recipe": args.recipe}
        elif isinstance(data, dict) and "rows" in data and "vllm" not in data:
            if not args.gpu_name and not data.get("gpu"):
                raise SystemExit(f"{path} names no GPU: give --gpu-name (and --driver)")
            over = {"gpu": args.gpu_name or data["gpu"], "driver": args.driver}
        rows += read_input(path, key=key or None, **over)
    rows = [r for r in rows if r.gpu_kind == args.gpu]
    if not rows:
        raise SystemExit(f"no rows of {args.gpu} in the inputs")
    gap = args.gap_power_w
    if gap is None:
        builtin = make_predicted_model(REFERENCE_SHAPES["Llama-3.1-8B"].shape(), GPU(args.gpu))
        gap = float(getattr(getattr(builtin, "primary", builtin), "idle_w", GPU_SPECS[GPU(args.gpu)].idle_w))
    carried_profile = json.loads(Path(args.carry_from).read_text()) if args.carry_from else {}
    carried = carried_profile.get("params", {})
    fixed = {**START, **{k: v for k, v in carried.items() if k in START}, "gap_power_w": gap}
    if args.check:
        inputs = [spec.partition(":")[0] for spec in args.input] + [
            entry["path"] for m in args.manifest for entry in json.loads(Path(m).read_text())]
        check(args.check, rows, gap, args.report, command_line(argv), objective_rows(inputs), moe_kernels)
        return
    if moe_kernels is None and out.is_file():
        moe_kernels = json.loads(out.read_text()).get("moe_kernels")
    data = Rows(rows, gap, moe_kernels)
    fitted_rows = [r for r in rows if r.fittable]
    params = fit(data, fitted_rows, args.free, fixed)
    errors = error_rows(data, rows, terms_of(params))
    first = fitted_rows[0]
    not_fitted = [k for k in EngineTerms.NAMES if k not in args.free]
    source = (f"Fitted on {len(fitted_rows)} rows served as the advisor serves (random-weight shapes: "
              f"{', '.join(sorted({r.shape for r in fitted_rows}))}; "
              f"{len(rows) - len(fitted_rows)} more rows with vLLM's CUTLASS FP8 kernel as checks) from "
              f"{', '.join(sorted({r.source for r in rows}))}; gap power {gap:.1f} W.")
    origin = terms_origin(carried_profile, args.carry_from) if args.carry_from and not_fitted else None
    if not_fitted:
        source += f" Not fitted here: {', '.join(not_fitted)}, from {args.carry_from or 'the starting values'}" + (
            f" (fitted {origin['fitted_on']}: `{origin['command']}`)." if origin else ".")
    command = command_line(argv)
    profile = {"schema": VLLM_SCHEMA, "version": VLLM_VERSION, "vllm_version": first.vllm_version, "gpu": first.gpu,
               "gpu_kind": args.gpu, "driver": first.driver,
               "date": max(r.date for r in fitted_rows), "fitted_on": datetime.date.today().isoformat(),
               "source": source, "command": command, "params": {k: round(v, 6) for k, v in params.items()},
               "free": args.free, **({"terms_from": origin} if origin else {}),
               **({"moe_kernels": moe_kernels} if moe_kernels else {})}
    out.parent.mkdir(parents=True, exist_ok=True)
    dump_json(out, profile, indent=1, newline=True)
    report = write_report(Path(args.report or f"reports/benchmarks/vllm_step_fit_{args.gpu}"), first,
                          profile["date"], command, profile, errors)
    print(json.dumps({"profile": str(out), "params": profile["params"], "rms_pct": report["rms_pct"],
                      "builtin_rms_pct": report["builtin_rms_pct"]}, indent=1))


if __name__ == "__main__":
    main()
