"""Time the README's quickstart end to end and keep what it produced.

Runs ``advisor search -r recipes/quickstart.yaml`` exactly as the README does (from the
repository root, ``../shared`` beside it), records the wall clock, the CPU time, the load
average before and after (the machine may be shared), and the per-stage times the run
itself stores in ``summary.json``; copies the report, plots, summary and stderr log.

Usage:  python benchmarks/quickstart_time.py --out reports/quickstart
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import dump_json  # noqa: E402

COMMAND = ["advisor", "search", "-r", "recipes/quickstart.yaml"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("reports/quickstart"))
    args = ap.parse_args()
    run_dir = Path("runs/quickstart")
    if run_dir.exists():
        sys.exit(f"Error: {run_dir} exists; move it away so the quickstart runs from scratch")
    args.out.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    with (args.out / "stderr.log").open("w") as err:
        proc = subprocess.run(COMMAND, stdout=subprocess.PIPE, stderr=err, text=True, check=False)
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_after = os.getloadavg()
    if proc.returncode != 0:
        sys.exit(f"Error: the quickstart exited {proc.returncode}; see {args.out / 'stderr.log'}")
    summary = json.loads((run_dir / "summary.json").read_text())
    timings = summary["timings_s"]
    stages = {k: round(v, 1) for k, v in timings.items()
              if k.endswith("_s") and k not in ("total_s", "mean_trial_s") and v >= 0.05}
    record = {
        "command": " ".join(COMMAND), "date": started, "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "wall_s": round(wall, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "stages_s": stages, "trials": timings.get("trials_run"), "run_total_s": round(timings["total_s"], 1),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip(),
        "recommendation": summary["recommendation"]["label"], "benchmark": summary.get("benchmark_status"),
    }
    dump_json(args.out / "time.json", record, indent=2, newline=True)
    for name in ("report.md", "summary.json", "front.png", "format_map.png", "operating_points.png"):
        if (run_dir / name).exists():
            shutil.copy(run_dir / name, args.out / name)
    (args.out / "stdout.txt").write_text(proc.stdout)
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
