"""reports/benchmarks/verify_time.{json,md}: where `advisor verify`'s time goes, per stage, from GPU rounds' files
(benchmarks/device/verify_time.sh copied back into reports/benchmarks/verify_time_data/, one folder a round: the
folder itself holds the first round, ``after/`` the second, ``roundN/`` the N-th, its heading in ``title.txt``):
each plan's kept serving (verify_served/*.json, else verify.json: its engine start, served KL and every metering,
timed inside the engine's process), the round's progress lines and vLLM's own log (engine start stages, with their
clock times), the run's predicted operating points beside the batches vLLM served, and where the round ran it,
meter_ab.json (the fast meter against the classic one on one engine); and the batch search's held-back rule replayed on
every kept serving.

    python benchmarks/device/verify_time_collect.py
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from advisor.deploy.vllm import start_seconds  # noqa: E402
from advisor.search.operating import BUSY_BELOW, HELD_BACK_DROP, MeasuredPoint  # noqa: E402

COMMAND = ("STEPS='B V' bash benchmarks/device/verify_time.sh (setsid, polled; STEPS='B V M' for round 2, "
           "STEPS='B V R' for rounds 3 and 4, STEPS='G B V R' for round 5, "
           "STEPS='B V R S' for round 6; round 7 on a two-GPU host: CUDA_VISIBLE_DEVICES=0 STEPS='B V R S' "
           "SPLANS=all-fp8 beside CUDA_VISIBLE_DEVICES=1 VT_OUT=/tmp/s44/out2 STEPS='q w Q', the 4B case; round 8: "
           "CUDA_VISIBLE_DEVICES=0 STEPS='B V P' taskset -c 0-15 beside CUDA_VISIBLE_DEVICES=1 VT_OUT=/tmp/s44/out2 "
           "STEPS='q Q S' SHAPES=llama-3.2-3b taskset -c 16-31; round 9, the 4B alone on one H200: "
           "VLLM_USE_AOT_COMPILE=0 STEPS='q Q S' SHAPES=llama-3.2-3b SPLANS=all-fp8; "
           "round 10, the 4B alone on one H200: "
           "STEPS='q Q S' SHAPES=mistral-7b-v0.3 SPLANS='all-bf16 all-fp8'; round 11, alone on one H200: "
           "STEPS='B V P R'), "
           "then python benchmarks/device/verify_time_collect.py")
SPARE_IMPORT = re.compile(r"the next engine's process has vLLM imported \((\d+) s, (\S+) UTC\)")


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


def kept_servings(data: Path) -> list[tuple[str, dict[str, Any]]]:
    """(plan id, what vLLM answered serving it): the run's kept servings (verify_served/*.json) where the round copied
    them, else rebuilt from verify.json (its timings per plan, and each operating point's search)."""
    kept = sorted((data / "verify_served").glob("*.json"))
    if kept:
        return [(path.stem, json.loads(path.read_text())["served"]) for path in kept]
    verify = json.loads((data / "verify.json").read_text())
    out = []
    for plan in verify["plans"]:
        flags = [(e["workload"], e) for e in plan["energy"]]
        flags += [(f"{o['workload']} at batch {o['batch']}", o) for o in plan["operating"]]
        unstable = {name: {"measurement": {"unstable": bool(row.get("vllm_unstable"))}} for name, row in flags}
        out.append((plan["plan_id"], {"timings_s": verify["timings_s"]["plans"][plan["role"]], "energy": unstable,
                                      "searches": {o["workload"]: o["vllm_search"] for o in plan["operating"]
                                                   if o.get("vllm_search")}}))
    return sorted(out)


def plan_rows(data: Path, summary: dict[str, Any]) -> list[dict[str, Any]]:
    predicted = {(p["plan_id"], p["workload"]): p for p in summary.get("operating_points") or []}
    rows = []
    for plan_id, served in kept_servings(data):
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
        rows.append({"plan_id": plan_id, "engine_start_s": t.get("engine_start_s"), "served_kl_s": t.get("served_kl_s"),
                     "served_kl_read": (served.get("served_kl") or {}).get("read", "lists"),
                     "meterings": meterings, "metering_s": sum(m["seconds"] for m in meterings),
                     "unstable": [n for n, r in served["energy"].items() if r["measurement"]["unstable"]],
                     "searches": searches, "host": served.get("host"),
                     "gpu_busy_pct": {n: r.get("gpu_busy_pct") for n, r in served["energy"].items()
                                      if r.get("gpu_busy_pct") is not None},
                     "starved_windows": {n: r["measurement"]["starved_windows"] for n, r in served["energy"].items()
                                         if r["measurement"].get("starved_windows")}})
    return rows


def collect(data: Path, name: str) -> dict[str, Any]:
    """One round's files (module docstring) as the report's record."""
    gpu, driver, limit = (data / "gpu.csv").read_text().splitlines()[1].split(", ")
    summary = json.loads((data / "summary_excerpt.json").read_text())
    verify = data / "verify.json"
    ab = data / "meter_ab.json"
    slow = data / "slow_path.json"
    sizing = data / "engine_sizing_ab.json"
    notes = data / "notes.json"
    return {"round": name, "data": str(data), "gpu": gpu, "driver": driver, "power_limit": limit,
            "vllm_version": (data / "vllm_version.txt").read_text().strip(),
            "date": json.loads(verify.read_text())["date"] if verify.is_file() else "2026-11-29",  # the first rounds
            "progress": (data / "progress").read_text().split(),
            "engine_starts": engine_starts((data / "v_verify.log").read_text()),
            "spare_imports": SPARE_IMPORT.findall((data / "v_verify.log").read_text()),
            "plans": plan_rows(data, summary),
            "verify_timings_s": json.loads(verify.read_text()).get("timings_s") if verify.is_file() else None,
            "meter_ab": json.loads(ab.read_text()) if ab.is_file() else None,
            "slow_path": json.loads(slow.read_text()) if slow.is_file() else None,
            "sizing_ab": json.loads(sizing.read_text()) if sizing.is_file() else None,
            "exports": {f.stem.removeprefix("export_"): json.loads(f.read_text()).get("timings_s")
                        for f in sorted(data.glob("*export_*.json"))},
            "notes": json.loads(notes.read_text()) if notes.is_file() else []}


def plans_ended(plans: list[dict[str, Any]]) -> list[tuple[str, datetime.datetime, float | None]]:
    """(plan, when its last metering ended, seconds since the plan before's ended) in the order they ended, for the
    plans whose meterings name their clock time (round 6 on)."""
    ends = []
    for p in plans:
        timed = [m for m in p["meterings"] if "began_utc" in m]
        if timed:
            last = max(datetime.datetime.strptime(m["began_utc"], "%H:%M:%S")
                       + datetime.timedelta(seconds=m["seconds"]) for m in timed)
            ends.append((p["plan_id"], last))
    ends.sort(key=lambda e: e[1])
    return [(plan, end, (end - ends[i - 1][1]).total_seconds() if i else None) for i, (plan, end) in enumerate(ends)]


def render_round(r: dict[str, Any]) -> list[str]:
    lines = [f"## {r['round']}", "", f"Files: `{r['data']}`. Progress: {' '.join(r['progress'])}.", ""]
    t = r.get("verify_timings_s")
    if t:
        exports = ", ".join(f"{k} {v:.0f} s" for k, v in t["export_s"].items())
        own = f"; the advisor's own models scored after it {t['own_models_s']:.0f} s" if "own_models_s" in t else ""
        lines += [f"verify took {t['total_s'] / 60:.1f} min: the model's load and tokens {t['load_s']:.0f} s; "
                  f"exports {exports}; serving {t['serving_s'] / 60:.1f} min{own}.", ""]
    for name, e in (r.get("exports") or {}).items():  # r_export_*: recheck's
        lines.append(f"- export `{name}`: " + ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v:.0f} s"
                                                         for k, v in (e or {}).items()))
    if r.get("exports"):
        lines.append("")
    lines += ["| plan | engine start s | served KL s (read from vLLM's) | meterings | metering s | windows at the 30 s "
              "ceiling |", "|---|---|---|---|---|---|"]
    for p in r["plans"]:
        lines.append(f"| `{p['plan_id']}` | {p['engine_start_s']:.0f} | {p['served_kl_s']:.0f} "
                     f"({p['served_kl_read']}) | {len(p['meterings'])} | {p['metering_s']:.0f} | "
                     f"{', '.join(p['unstable']) or 'none'} |")
    hosts = [(p["plan_id"], p["host"]) for p in r["plans"] if p.get("host")]  # recorded from round 5 on
    if hosts:
        lines += ["", "| plan | host CPU | cores | load before, after | CPU stolen over the meterings | torch, CUDA |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| `{plan}` | {h['cpu']} | {h['cpus']} | {h['load_1m']}, {h.get('load_1m_after')} | "
                  f"{h.get('steal_pct')}% | {h.get('torch')}, {h.get('cuda')} |" for plan, h in hosts]
    busy = [(p["plan_id"], p["gpu_busy_pct"]) for p in r["plans"] if p.get("gpu_busy_pct")]
    if busy:
        lines += ["", "How busy the GPU was over each load (NVML utilization, mean %): "
                  + "; ".join(f"`{plan}` " + ", ".join(f"{n} {v:.0f}" for n, v in b.items()) for plan, b in busy)
                  + "."]
    began = [(p["plan_id"], p["meterings"]) for p in r["plans"] if any("began_utc" in m for m in p["meterings"])]
    if began:  # recorded from round 6 on, beside the spare engine process's import line in v_verify.log
        lines += ["", "Meterings began (UTC): " + "; ".join(
            f"`{plan}` " + ", ".join(f"{m['workload']} {m.get('began_utc', '?')}" for m in ms) for plan, ms in began)
            + "."]
    ended = plans_ended(r["plans"])
    if len(ended) > 1:  # issue 57's "a plan after the first": from the plan before's last metering to its own last
        lines += ["", "Each plan's last metering ended (UTC), after the plan before's (issue 57's 'a plan after the "
                  "first'): " + "; ".join(f"`{plan}` {end:%H:%M:%S}" + (f" (+{gap / 60:.2f} min)" if gap else "")
                                         for plan, end, gap in ended) + "."]
    if r.get("spare_imports"):
        lines += ["", "The next engine's process had vLLM imported (its own line in v_verify.log): "
                  + ", ".join(f"{s} s, {t} UTC" for s, t in r["spare_imports"]) + "."]
    starved = [(p["plan_id"], p["starved_windows"]) for p in r["plans"] if p.get("starved_windows")]
    if starved:
        lines += ["", "Windows the meter left out as starved (a host stall): " + "; ".join(
            f"`{plan}` " + ", ".join(f"{n} {k}" for n, k in s.items()) for plan, s in starved) + "."]
    elif began:  # the rule ran from round 6 on
        lines += ["", "Windows the meter left out as starved (a host stall): none."]
    held = {plan: p["held_s"] for plan, p in (t or {}).get("plans", {}).items() if "held_s" in p}
    if held:  # the early all-BF16 engine (round 6 on): how long it waited, ready, for the exports
        lines += ["", "The engine started during the exports waited for them, ready: "
                  + ", ".join(f"`{plan}` {s:.0f} s" for plan, s in held.items()) + "."]
    lines += ["", "vLLM's engine starts (its own log):", "", "| engine | first line (UTC) | weights s | Dynamo s | "
              "torch.compile s | CUDA graphs s | kernel warm-up s | engine init s |",
              "|---|---|---|---|---|---|---|---|"]
    for i, e in enumerate(r["engine_starts"], 1):
        s = e["stages_s"]
        stages = ("weights_s", "dynamo_s", "compile_s", "graph_capture_s", "kernel_warmup_s", "engine_init_s")
        lines.append(f"| {i} | {e['first_line']} | "
                     + " | ".join(f"{s[k]:.0f}" if k in s else "" for k in stages) + " |")
    lines += ["", "The operating batch as vLLM served it, beside the prediction:", "",
              "| plan | objective | predicted batch | predicted TPOT ms | served TPOT ms there | TPOT error | "
              "predicted J/token | served J/token there | J/token error | largest met | meterings | search |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in r["plans"]:
        for s in p["searches"]:
            pt, st = s["predicted_tpot_ms"], s["served_tpot_ms_at_predicted"]
            pj, sj = s["predicted_j_per_token"], s["served_j_per_token_at_predicted"]
            lines.append(f"| `{p['plan_id']}` | {s['objective']} | {s['predicted_batch']} | {pt:.2f} | {st:.2f} | "
                         f"{100 * (pt - st) / st:+.1f}% | {pj:.4g} | {sj:.4g} | {100 * (pj - sj) / sj:+.1f}% | "
                         f"{s['largest_batch_met']} | {s['meterings']} | {s['search']} |")
    if r.get("meter_ab"):
        lines += render_meter_ab(r["meter_ab"])
    if r.get("sizing_ab"):
        lines += render_sizing_ab(r["sizing_ab"])
    if r.get("slow_path"):
        lines += render_slow_path(r["slow_path"])
    if r["notes"]:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in r["notes"]]
    return lines + [""]


def render_meter_ab(ab: dict[str, Any]) -> list[str]:
    """The fast meter against the classic one, alternating fast, classic, fast at each batch on one engine."""
    lines = ["", f"The fast meter against the classic one (`benchmarks/device/meter_ab.py`, one engine: "
             f"`{Path(ab['checkpoint']).name}`, options {json.dumps(ab['llm_options'])}; fast, classic, fast at "
             "each batch):", "",
             "| batch | meter | s | J/token | tokens/s | TPOT p50 ms | windows taken | cv | unstable | classic vs the "
             "fasts' mean |", "|---|---|---|---|---|---|---|---|---|---|"]
    for b in sorted({row["batch"] for row in ab["rows"]}):
        rows = [row for row in ab["rows"] if row["batch"] == b]
        fasts = [row["j_per_token"] for row in rows if row["meter"] == "fast"]
        for row in rows:
            vs = (f"{100 * (row['j_per_token'] / (sum(fasts) / len(fasts)) - 1):+.1f}%"
                  if row["meter"] == "classic" and fasts else "")
            lines.append(f"| {b} | {row['meter']} | {row['seconds']:.1f} | {row['j_per_token']:.5f} | "
                         f"{row['tokens_per_s']:.0f} | {row['tpot_ms_p50']:.2f} | {row['windows_taken']} | "
                         f"{row['cv']:.4f} | {'yes' if row['unstable'] else 'no'} | {vs} |")
    return lines


def render_slow_path(ab: dict[str, Any]) -> list[str]:
    """The slow path beside verify's fast one (meter_ab.py --around): per objective, the largest batch that met by the
    classic meter among verify's found batch and the graph sizes either side, and the J/token at the found batch."""
    slow = ab["slow_path"]
    rows = {row["batch"]: row for row in ab["rows"] if row["meter"] == "classic"}
    lines = ["", f"The slow path beside verify's (`benchmarks/device/meter_ab.py --around`, `{slow['plan_id']}` "
             f"({slow['role']}), the classic meter, an engine sized as verify's: max_num_seqs "
             f"{slow['options']['max_num_seqs']}; {ab['date']}):", "",
             "| objective | verify's batch (fast) | its TPOT ms, J/token | classic TPOT ms at the batches metered | "
             "largest met (classic) | J/token at verify's batch (classic) | J/token, classic vs fast |",
             "|---|---|---|---|---|---|---|"]
    for name, o in slow["objectives"].items():
        met = [b for b in o["batches"] if b in rows and rows[b]["tpot_ms_p50"] <= o["tpot_ms"]]
        fast, at = o["fast"], rows.get(o["found"])
        tpots = ", ".join(f"{b}: {rows[b]['tpot_ms_p50']:.2f}" for b in o["batches"] if b in rows)
        slow_j, vs = (f"{at['j_per_token']:.5f}", f"{100 * (at['j_per_token'] / fast['j_per_token'] - 1):+.1f}%") \
            if at else ("-", "-")
        lines.append(f"| {name} (TPOT {o['tpot_ms']:g} ms) | {o['found']} | {fast['tpot_ms']:.2f}, "
                     f"{fast['j_per_token']:.5f} | {tpots} | {max(met) if met else 'none'} | {slow_j} | {vs} |")
    return lines


def render_sizing_ab(ab: dict[str, Any]) -> list[str]:
    """One checkpoint in engines sized apart (benchmarks/device/engine_sizing_ab.py), each arm in order."""
    low = ab["arms"]["A"]["max_num_seqs"]
    lines = ["", f"One checkpoint in engines sized apart (`benchmarks/device/engine_sizing_ab.py`, "
             f"`{Path(ab['checkpoint']).name}`, {ab['gpu']}, {ab['date']}; the fast meter, one metering a batch):", "",
             f"| arm | max_num_seqs | decode graphs above {low} | engine start s | batch | TPOT p50 ms | J/token | "
             "tokens/s | unstable |", "|---|---|---|---|---|---|---|---|---|"]
    for run in ab["runs"]:
        arm = ab["arms"][run["arm"]]
        above = [g for g in arm["graphs"] if low < g < 512]
        head = f"| {run['arm']} | {arm['max_num_seqs']} | {', '.join(map(str, above)) or 'none'} | "
        if run.get("error"):
            lines.append(head + f"| {run['error']} | | | | |")
            continue
        for row in run["rows"]:
            unstable = "yes" if row["unstable"] else "no"
            lines.append(head + f"{run['engine_start_s']:.0f} | {row['batch']} | {row['tpot_ms_p50']:.2f} | "
                         f"{row['j_per_token']:.5f} | {row['tokens_per_s']:.0f} | {unstable} |")
    return lines


def held_back_replay(data: Path) -> dict[str, Any]:
    """The batch search's held-back rule (:meth:`MeasuredPoint.held_back_beside`) replayed on every kept serving
    below ``data``: each searched metering that missed, judged beside the rows its engine served (every workload of
    these runs is one load, 512 in / 256 out)."""
    out: dict[str, Any] = {"servings": 0, "searched": 0, "missed": 0, "missed_under_busy": 0, "held_back": []}
    for path in sorted(data.rglob("verify_served/*.json")):
        served = json.loads(path.read_text())["served"]
        rows = {name: MeasuredPoint(path.stem, name, e["fewest_inflight"], e["j_per_token"], e["tokens_per_s"],
                                    e.get("tpot_ms_p50"), e.get("ttft_ms_p50"), None, "", "",
                                    gpu_busy_pct=e.get("gpu_busy_pct"))
                for name, e in served.get("energy", {}).items() if e.get("fewest_inflight")}
        out["servings"] += 1
        for objective, search in (served.get("searches") or {}).items():
            for t in search.get("trail") or []:
                out["searched"] += 1
                point = rows.get(f"{objective} at batch {t['batch']}") or rows.get(objective)
                if t.get("meets") is not False or point is None or point.batch != t["batch"]:
                    continue
                out["missed"] += 1
                out["missed_under_busy"] += (point.gpu_busy_pct or 100.0) < BUSY_BELOW
                if point.held_back_beside(list(rows.values())):
                    out["held_back"].append({"serving": str(path.relative_to(data)), "objective": objective,
                                             "batch": point.batch, "gpu_busy_pct": point.gpu_busy_pct,
                                             "tokens_per_s": point.tokens_per_s})
    return out


def render_held_back(h: dict[str, Any]) -> list[str]:
    found = "; ".join(f"`{x['serving']}` {x['objective']} at batch {x['batch']} (GPU {x['gpu_busy_pct']:.0f}% busy, "
                      f"{x['tokens_per_s']:.0f} tokens/s)" for x in h["held_back"]) or "none"
    return [f"- **Meterings the host held back**, the batch search's rule (`MeasuredPoint.held_back_beside`: the GPU "
            f"under {BUSY_BELOW:.0f}% busy and {HELD_BACK_DROP:.0%} fewer tokens/s than a smaller batch of the same "
            f"engine) replayed on the {h['servings']} kept servings here: {h['searched']} searched meterings, "
            f"{h['missed']} misses, {h['missed_under_busy']} of them under {BUSY_BELOW:.0f}% busy; the rule would have "
            f"metered again: {found}.", ""]


def render(result: dict[str, Any]) -> str:
    first = result["rounds"][0]
    lines = [f"# `advisor verify`'s time, per stage ({first['gpu']}, {first['date']})", "",
             f"GPU {first['gpu']}, driver {first['driver']}, power limit {first['power_limit']}, vLLM "
             f"{first['vllm_version']}. Command: `{result['command']}`. A random-weight Llama-3.1-8B; three TPOT "
             "objectives (8, 12, 20 ms; 512 in / 256 out) whose batch_size gives the fixed batches 16 and 64; "
             "`advisor verify RUN --engine vllm --plan <all-FP8>`: all-BF16, all-FP8 and the recommendation (the last "
             "section: a random-weight Qwen3-4B, the same objectives).", ""]
    lines += [f"- {n}" for n in result["notes"]] + [""] + render_held_back(result["held_back"])
    for r in result["rounds"]:
        lines += render_round(r)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="reports/benchmarks/verify_time_data")
    ap.add_argument("--out", default="reports/benchmarks/verify_time")
    args = ap.parse_args()
    data = Path(args.data)
    rounds = [collect(data, "Round 1: before the window, log and search fixes (04:29 UTC)")]
    if (data / "after").is_dir():
        rounds.append(collect(data / "after", "Round 2: after them (10:30 UTC)"))
    for folder in sorted(data.glob("round[0-9]*"), key=lambda f: int(f.name[5:])):  # round3/, round4/, ...
        title = folder / "title.txt"
        rounds.append(collect(folder, f"Round {folder.name[5:]}: "
                                      + (title.read_text().strip() if title.is_file() else folder.name)))
    # issue 57's 4B-class case (verify_time.sh's steps q and Q), by round: qwen3_4b/ is round 7's
    for folder in sorted(data.glob("qwen3_4b*"), key=lambda f: int(f.name[len("qwen3_4b_round"):] or 7)):
        rounds.append(collect(folder, "The 4B-class case: " + (folder / "title.txt").read_text().strip()))
    notes = data / "summary_notes.json"
    result = {"command": COMMAND, "rounds": rounds,
              "notes": json.loads(notes.read_text()) if notes.is_file() else [], "held_back": held_back_replay(data)}
    Path(args.out + ".json").write_text(json.dumps(result, indent=2))
    Path(args.out + ".md").write_text(render(result))


if __name__ == "__main__":
    main()
