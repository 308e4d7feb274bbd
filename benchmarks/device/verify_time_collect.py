"""reports/benchmarks/verify_time.{json,md}: where `advisor verify`'s time goes, per stage, from a GPU round's files
(benchmarks/device/verify_time.sh copied back into reports/benchmarks/verify_time_data/): each plan's kept serving
(verify_served/*.json: its engine start, served KL and every metering, timed inside the engine's process), the
round's progress lines and vLLM's own log (engine start stages, with their clock times), and the run's predicted
operating points beside the batches vLLM served.

    python benchmarks/device/verify_time_collect.py --notes reports/benchmarks/verify_time_data/notes.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from advisor.deploy.vllm import start_seconds  # noqa: E402

COMMAND = ("STEPS='B V' bash benchmarks/device/verify_time.sh (setsid, polled), then "
           "python benchmarks/device/verify_time_collect.py")


def engine_starts(log: str) -> list[dict[str, Any]]:
    """vLLM's start lines per engine process (its pid), in the order they started."""
    by_pid: dict[str, list[str]] = {}
    for line in log.splitlines():
        found = re.match(r"\(EngineCore pid=(\d+)\) INFO (\S+ \S+)", line)
        if found:
            by_pid.setdefault(found.group(1), []).append(line)
    out = []
    for pid, lines in by_pid.items():
        stages = start_seconds("\n".join(lines))
        clock = [re.search(r"INFO \S+ (\S+)", x).group(1) for x in lines]  # type: ignore[union-attr]
        out.append({"pid": int(pid), "first_line": clock[0], "stages_s": stages})
    return out


def plan_rows(data: Path, summary: dict[str, Any]) -> list[dict[str, Any]]:
    predicted = {(p["plan_id"], p["workload"]): p for p in summary.get("operating_points") or []}
    rows = []
    for path in sorted((data / "verify_served").glob("*.json")):
        kept = json.loads(path.read_text())
        served, plan_id = kept["served"], path.stem
        t = served.get("timings_s") or {}
        meterings = t.get("meterings") or []
        searches = []
        for name, s in (served.get("searches") or {}).items():
            p = predicted.get((plan_id, name), {})
            first = s["trail"][0]
            searches.append({"objective": name, "predicted_batch": p.get("batch"),
                             "predicted_tpot_ms": p.get("tpot_ms"), "predicted_j_per_token": p.get("j_per_token"),
                             "served_tpot_ms_at_predicted": first["tpot_ms"],
                             "served_j_per_token_at_predicted": first["j_per_token"],
                             "largest_batch_met": s["batch"] if s.get("meets") else None,
                             "meterings": len(s["trail"]), "search": s["search"]})
        rows.append({"plan_id": plan_id, "served_at": kept.get("served_at"),
                     "engine_start_s": t.get("engine_start_s"), "served_kl_s": t.get("served_kl_s"),
                     "meterings": meterings, "metering_s": sum(m["seconds"] for m in meterings),
                     "unstable": [n for n, r in served["energy"].items() if r["measurement"]["unstable"]],
                     "searches": searches})
    return rows


def render(result: dict[str, Any]) -> str:
    lines = [f"# `advisor verify`'s time, per stage ({result['gpu']}, {result['date']})", "",
             f"GPU {result['gpu']}, driver {result['driver']}, power limit {result['power_limit']}, vLLM "
             f"{result['vllm_version']}. Command: `{result['command']}`. A random-weight Llama-3.1-8B; three TPOT "
             "objectives (8, 12, 20 ms; 512 in / 256 out) whose batch_size gives the fixed batches 16 and 64; "
             "`advisor verify RUN --engine vllm --plan <all-FP8>`: all-BF16, all-FP8 and the recommendation.", "",
             "## Per plan", "",
             "| plan | engine start s | served KL s | meterings | metering s | windows at the 30 s ceiling |",
             "|---|---|---|---|---|---|"]
    for r in result["plans"]:
        lines.append(f"| `{r['plan_id']}` | {r['engine_start_s']:.0f} | {r['served_kl_s']:.0f} | "
                     f"{len(r['meterings'])} | {r['metering_s']:.0f} | {', '.join(r['unstable']) or 'none'} |")
    lines += ["", "## vLLM's engine starts (its own log)", "", "| engine | first line (UTC) | weights s | Dynamo s | "
              "torch.compile s | CUDA graphs s | engine init s |", "|---|---|---|---|---|---|---|"]
    for i, e in enumerate(result["engine_starts"], 1):
        s = e["stages_s"]
        lines.append(f"| {i} | {e['first_line']} | {s.get('weights_s', '')} | {s.get('dynamo_s', '')} | "
                     f"{s.get('compile_s', '')} | {s.get('graph_capture_s', '')} | {s.get('engine_init_s', '')} |")
    lines += ["", "## The operating batch as vLLM served it, beside the prediction", "",
              "| plan | objective | predicted batch | predicted TPOT ms | served TPOT ms there | largest met | "
              "meterings | search |", "|---|---|---|---|---|---|---|---|"]
    for r in result["plans"]:
        for s in r["searches"]:
            lines.append(f"| `{r['plan_id']}` | {s['objective']} | {s['predicted_batch']} | "
                         f"{s['predicted_tpot_ms']:.2f} | {s['served_tpot_ms_at_predicted']:.2f} | "
                         f"{s['largest_batch_met']} | {s['meterings']} | {s['search']} |")
    lines += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="reports/benchmarks/verify_time_data")
    ap.add_argument("--out", default="reports/benchmarks/verify_time")
    ap.add_argument("--notes", help="a JSON list of notes for the report")
    args = ap.parse_args()
    data = Path(args.data)
    name, driver, limit = (data / "gpu.csv").read_text().splitlines()[1].split(", ")
    summary = json.loads((data / "summary_excerpt.json").read_text())
    progress = (data / "progress").read_text().split()
    result = {"gpu": name, "driver": driver, "power_limit": limit, "vllm_version": (data / "vllm_version.txt")
              .read_text().strip(), "date": "2026-11-29", "command": COMMAND, "progress": progress,
              "engine_starts": engine_starts((data / "v_verify.log").read_text()),
              "plans": plan_rows(data, summary),
              "notes": json.loads(Path(args.notes).read_text()) if args.notes else []}
    Path(args.out + ".json").write_text(json.dumps(result, indent=2))
    Path(args.out + ".md").write_text(render(result))


if __name__ == "__main__":
    main()
