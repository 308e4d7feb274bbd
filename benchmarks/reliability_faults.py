"""Fault runs: two same-name searches started together, kill -9 of one `--workers` child, and a search
stopped by Ctrl-C, SIGTERM or kill -9 at chosen trials, then resumed.

    PYTHONPATH=. python benchmarks/reliability_faults.py            # from the repository root
    PYTHONPATH=. python benchmarks/reliability_faults.py --pairs 2 --kills 2 --code /other/checkout
    PYTHONPATH=. python benchmarks/reliability_faults.py --pairs 0 --kills 0 --report reports/reliability_interrupts

Writes reports/reliability_faults.json and .md (command, date, host, counts, every run).

* pairs: for each storage (SQLite by default, a journal file, PostgreSQL from tests/pg_server.py),
  two `advisor search` of one run started together, ``--pairs`` times. SQLite: the same --out and
  --name (the run folder's lock decides); journal and PostgreSQL: the same study in the same storage
  from two --out folders (the study's owner record decides). Expected: one exits 0, the other 2;
  the winner's recommendation and trial values equal a solo run's.
* kills: `advisor search --workers 3` (journal storage), one child killed with SIGKILL at each of
  ``--kills`` moments (while it loads, then inside a trial after 1, 6, 12 and 18 finished trials;
  more held-out tokens make trials long enough for the children to join in time).
  Expected: exit 0, the budget met, nothing RUNNING, no trial lost, the seconds it took to finish; killed while
  it loads (a rank of the node's stages, issue 58): exit 3 with one line naming it, no trial run, nothing kept.
* interrupts: `advisor search` of recipes/tiny.yaml (guided: baselines and knapsack proposals queued, 8 trials,
  trials about a second long) sent SIGINT or SIGTERM, and `--workers 2` killed with SIGKILL (the coordinator and
  its child together), 0.2 s after the line of trial 1, 3 or 7, then `--resume` (``--interrupts`` times
  each), and SIGINT after 13 of 40 trials, where TPE proposes scored plans again. Expected: SIGINT and SIGTERM exit
  130 with one line naming the resume (or 0 if the run ended first); the resume exits 0 with the budget met, each
  plan evaluated once (a plan proposed again is a repeat), no queued plan lost, nothing left RUNNING or WAITING.

``--code DIR`` runs another checkout's advisor (e.g. the code before a fix) with the same scenarios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import optuna
import yaml

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "reliability_faults"
CLI = [sys.executable, "-c", "from advisor.console import main; main()"]
PAIR_TRIALS = 4
KILL_TRIALS = 24
KILL_AFTER = (None, 1, 6, 12, 18)  # finished trials before the kill; None: while the child loads
# Longer trials for the kills (more held-out tokens): the children join while trials remain.
KILL_HELDOUT = {"heldout_samples": 32, "heldout_seq_len": 64}
INTERRUPT_TRIALS = 8
INTERRUPT_AFTER = (2, 4, 8)  # finished trials before the signal: after the lines of trials 1, 3 and 7
INTERRUPT_SIGNALS = ("SIGINT", "SIGTERM", "SIGKILL")  # SIGKILL: the process group of a `--workers 2` run
INTERRUPT_DELAY_S = 0.2  # into the next trial
INTERRUPT_HELDOUT = KILL_HELDOUT  # about a second a trial, more under load
SAMPLED = ("SIGINT", 13, 40)  # the sampler's turn: TPE after the queued plans proposes scored plans again


def code_commit(code: Path) -> str:
    """The checkout's commit, marked dirty where it holds changes not committed."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(code), *args], capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + (" with uncommitted changes" if git("status", "--porcelain") else "")


def recipe_file(tmp: Path, name: str = "tiny", **calibration: int) -> Path:
    data = yaml.safe_load((ROOT / "recipes" / "tiny.yaml").read_text())
    data["model"]["source"] = str((ROOT / data["model"]["source"]).resolve())
    data["calibration"].update(calibration)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def search(recipe: Path, out: Path, name: str, trials: int, code: Path, *extra: str, sampler: str = "random",
           own_group: bool = False) -> subprocess.Popen:
    """`advisor search` as a terminal starts it (SIGINT not ignored, even where this script runs in the
    background); ``own_group``: in a process group of its own, for a kill of it and its workers."""
    cmd = [*CLI, "search", "-r", str(recipe), "--out", str(out), "--name", name, "--trials", str(trials),
           "--sampler", sampler, *extra]
    env = {**os.environ, "PYTHONPATH": str(code)}
    return subprocess.Popen(cmd, cwd=code, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                            start_new_session=own_group)


def outcome(summary_path: Path) -> dict[str, Any] | None:
    try:
        s = json.loads(summary_path.read_text())
    except (OSError, ValueError):
        return None
    return {"recommendation": (s.get("recommendation") or {}).get("plan_id"),
            "trials": [[t["plan_id"], round(t["kl"], 9), [round(e["j_per_token"], 12) for e in t["energy"]]]
                       for t in sorted(s["trials"], key=lambda t: t["trial"])]}


def error_line(stderr: str) -> str:
    return next((line for line in stderr.splitlines() if line.startswith("Error:")), "")


def storages(kind: str, tmp: Path, pg: Any) -> tuple[str | None, bool]:
    """(storage URL, one folder for both runs)."""
    if kind == "sqlite":
        return None, True
    if kind == "journal":
        return f"journal:{tmp / 'study.journal'}", False
    return pg.create_database(f"faults_{tmp.name}"), False


def solo_run(kind: str, recipe: Path, base: Path, code: Path, pg: Any) -> dict[str, Any]:
    solo_dir = base / kind / "solo"
    solo_dir.mkdir(parents=True)
    url, _ = storages(kind, solo_dir, pg)
    proc = search(recipe, solo_dir / "runs", "solo", PAIR_TRIALS, code, *(["--storage", url] if url else []))
    _, err = proc.communicate()
    solo = outcome(solo_dir / "runs" / "solo" / "summary.json")
    assert proc.returncode == 0 and solo, err
    return solo


def pair_run(kind: str, i: int, solo: dict[str, Any], recipe: Path, base: Path, code: Path, pg: Any) -> dict[str, Any]:
    tmp = base / kind / f"pair{i}"
    tmp.mkdir(parents=True)
    url, same_folder = storages(kind, tmp, pg)
    outs = [tmp / "runs"] * 2 if same_folder else [tmp / "a", tmp / "b"]
    t0 = time.monotonic()
    procs = [search(recipe, o, "pair", PAIR_TRIALS, code, *(["--storage", url] if url else [])) for o in outs]
    results = [p.communicate() for p in procs]
    codes = [p.returncode for p in procs]
    winner = [o for o, c in zip(outs, codes, strict=True) if c == 0]
    got = outcome(winner[0] / "pair" / "summary.json") if len(winner) == 1 else None
    row = {"exit_codes": codes, "seconds": round(time.monotonic() - t0, 1),
           "loser_error": next((error_line(e) for (_, e), c in zip(results, codes, strict=True) if c), ""),
           "winner_equals_solo": got == solo}
    print(f"{kind} pair {i}: {row}", flush=True)
    return row


def pair_summary(kind: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = sum(sorted(r["exit_codes"]) == [0, 2] and r["winner_equals_solo"] for r in runs)
    return {"storage": kind, "pairs": len(runs), "one_ran_other_exit_2_and_equal_to_solo": ok, "runs": runs}


def study_states(url: str) -> dict[str, Any]:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(url.removeprefix("journal:")))
    study = optuna.load_study(study_name="kill", storage=storage)
    return {"trials": study.get_trials(deepcopy=False)}


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def kill_run(after: int | None, recipe: Path, base: Path, code: Path, timeout_s: float) -> dict[str, Any]:
    out = base / f"kill-{after}"
    url = f"journal:{out / 'runs' / 'kill' / 'study.journal'}"
    parent = search(recipe, out / "runs", "kill", KILL_TRIALS, code, "--workers", "3")
    victim, t_kill, moment = None, None, ""
    end = time.monotonic() + timeout_s
    while victim is None and time.monotonic() < end and parent.poll() is None:
        time.sleep(0.1)
        kids = children(parent.pid)
        if len(kids) < 2:
            continue
        if after is None:
            victim, moment = kids[0], "while loading (before its first trial)"
            break
        try:
            trials = study_states(url)["trials"]
        except (KeyError, OSError, ValueError):
            continue
        done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
        running = [t.user_attrs.get("worker", {}).get("pid") for t in trials
                   if t.state == optuna.trial.TrialState.RUNNING]
        inside = [pid for pid in running if pid in kids]
        if done >= after and inside:
            victim, moment = inside[0], f"inside a trial, after {done} finished trials"
    if victim is not None:
        os.kill(victim, signal.SIGKILL)
        t_kill = time.monotonic()
    try:
        _, err = parent.communicate(timeout=timeout_s)  # counted from the kill
        hung = False
    except subprocess.TimeoutExpired:
        parent.kill()
        _, err = parent.communicate()
        hung = True
    try:
        trials = study_states(url)["trials"]
    except KeyError:  # no study: a run that ended before its first trial discards the empty study it made
        trials = []
    states = [t.state for t in trials]
    complete = states.count(optuna.trial.TrialState.COMPLETE)
    row = {"moment": moment or "no kill (the run ended first)", "exit_code": None if hung else parent.returncode,
           "study_kept": bool(trials),
           "hung": hung, "seconds_to_finish_after_kill": None if t_kill is None or hung else
           round(time.monotonic() - t_kill, 1),
           "complete": complete, "running": states.count(optuna.trial.TrialState.RUNNING),
           "failed": states.count(optuna.trial.TrialState.FAIL),
           "retried": sum("failed_trial" in t.system_attrs for t in trials),
           "budget_met": complete == KILL_TRIALS, "lost": KILL_TRIALS - complete,
           "warning": next((line for line in err.splitlines() if "warning: worker" in line), error_line(err))}
    print(f"kill {moment}: {row}", flush=True)
    return row


def interrupt_run(kind: str, after: int, recipe: Path, base: Path, code: Path, timeout_s: float,
                  trials: int = INTERRUPT_TRIALS) -> dict[str, Any]:
    from study_checks import scoring_record

    out = base / f"interrupt-{kind}-{after}-{time.monotonic_ns()}"
    workers = ["--workers", "2"] if kind == "SIGKILL" else []
    t0 = time.monotonic()
    proc = search(recipe, out, "int", trials, code, *workers, sampler="guided", own_group=bool(workers))
    seen, done = [], 0
    while done < after and (line := proc.stderr.readline()):
        seen.append(line)
        done += line.startswith("trial ") and " KL " in line
    if done >= after:
        time.sleep(INTERRUPT_DELAY_S)
        if workers:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.send_signal(getattr(signal, kind))
    try:
        err = "".join(seen) + proc.communicate(timeout=timeout_s)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        err = "".join(seen) + proc.communicate()[1]
    resumed = search(recipe, out, "int", trials, code, *workers, "--resume", sampler="guided")
    try:
        _, resume_err = resumed.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        resumed.kill()
        _, resume_err = resumed.communicate()
    url = f"journal:{out / 'int' / 'study.journal'}" if workers else f"sqlite:///{out / 'int' / 'study.db'}"
    try:
        record = scoring_record(optuna.load_study(study_name="int", storage=_storage(url)))
    except (KeyError, ValueError) as exc:
        record = {"error": repr(exc)}
    row = {"signal": kind, "workers": 2 if workers else 1, "trials": trials, "after_trials": after,
           "exit_code": proc.returncode,
           "line": error_line(err) or next((x for x in err.splitlines() if "Traceback" in x), ""),
           "resume_exit_code": resumed.returncode, "resume_error": error_line(resume_err), **record,
           "seconds": round(time.monotonic() - t0, 1)}
    print(f"interrupt {kind} after {after}: {row}", flush=True)
    return row


def _storage(url: str) -> Any:
    if url.startswith("journal:"):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        return JournalStorage(JournalFileBackend(url.removeprefix("journal:")))
    return url


def interrupts_markdown(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["", "## Ctrl-C, SIGTERM and kill -9, then `--resume` (guided sampler)", "",
             f"recipes/tiny.yaml ({INTERRUPT_TRIALS} trials: the baselines and knapsack proposals, all queued) with "
             f"trials about a second long; the signal comes {INTERRUPT_DELAY_S:g} s after the line of trial 1, 3 or 7 "
             "(after 2, 4 or 8 finished trials; 8: during the stages after the trials). SIGKILL: `--workers 2`, the "
             f"coordinator and its child killed together. Last row: {SAMPLED[2]} trials, so that TPE, after the "
             "queued plans, proposes plans already scored, before and after the resume. Its line says how many "
             "trials had finished when the signal was taken (the trial it landed in is queued again). Evaluated: "
             "complete trials that were not a repeat of a scored plan; queued lost: a queued plan the budget admitted "
             "that no trial finished.", "",
             "| signal | workers | trials | after trials | exit | its line | resume exit | complete | evaluated | "
             "distinct plans | scored twice | queued lost | failed | retried |", "|" + "---|" * 14]
    for r in rows:
        line = re.sub(r"\S*/advisor-faults-[^/\s]+", "$TMP", r["line"])  # this session's temporary folder
        lines.append(f"| {r['signal']} | {r['workers']} | {r.get('trials', INTERRUPT_TRIALS)} | {r['after_trials']} | "
                     f"{r['exit_code']} | {line} | "
                     f"{r['resume_exit_code']} {r['resume_error']} | {r.get('complete')} | {r.get('evaluated')} | "
                     f"{r.get('distinct')} | {len(r.get('scored_twice', []))} | {len(r.get('queued_lost', []))} | "
                     f"{r.get('failed')} | {r.get('retried')} |")
    return lines


def markdown(data: dict[str, Any]) -> str:
    """The sections this session ran (a section run 0 times is left out)."""
    lines = [f"# Fault runs ({data['date']})", "", f"Command: `{data['command']}`  ", f"Host: {data['host']} "
             f"({data['cpus']} CPUs, shared with other jobs: seconds are wall-clock under that load), code: "
             f"{data['code']}, {data['seconds']} s in all"]
    if data["pairs"]:
        lines += ["", "## Two same-name searches started together", "",
                  f"Tiny recipe, {PAIR_TRIALS} trials, random sampler. SQLite: the same --out and --name (the run "
                  "folder's lock decides); journal and PostgreSQL: one study from two --out folders (the study's owner "
                  "record decides). Winner = solo: same recommended plan id and the same trial plans and values.", "",
                  "| storage | pairs | exactly one ran, the other exit 2, winner = solo | exit codes | loser's error |",
                  "|---|---|---|---|---|"]
    for p in data["pairs"]:
        codes = ", ".join("/".join(map(str, r["exit_codes"])) for r in p["runs"])
        lines.append(f"| {p['storage']} | {p['pairs']} | {p['one_ran_other_exit_2_and_equal_to_solo']} | {codes} | "
                     f"{p['runs'][0]['loser_error'] if p['runs'] else ''} |")
    if data["kills"]:
        lines += ["", f"## kill -9 of one child of `--workers 3` ({KILL_TRIALS} trials, journal storage)", "",
                  "| moment | exit | its line | hung | s to finish after kill | complete | running | failed | retried "
                  "| lost |", "|---|---|---|---|---|---|---|---|---|---|"]
    for k in data["kills"]:
        lines.append(f"| {k['moment']} | {k['exit_code']} | {k.get('warning') or ''} | {k['hung']} | "
                     f"{k['seconds_to_finish_after_kill']} | {k['complete']} | {k['running']} | {k['failed']} | "
                     f"{k['retried']} | {k['lost']} |")
    if data.get("interrupts"):
        lines += interrupts_markdown(data["interrupts"])
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--kills", type=int, default=len(KILL_AFTER))
    parser.add_argument("--interrupts", type=int, default=1, help="runs of each signal at each moment")
    parser.add_argument("--storages", default="sqlite,journal,postgresql")
    parser.add_argument("--code", type=Path, default=ROOT, help="checkout whose advisor runs (default: this one)")
    parser.add_argument("--kill-timeout", type=float, default=300.0,
                        help="a run still going this long after the kill is 'hung'")
    parser.add_argument("--report", type=Path, default=REPORT, help="path without suffix of the .json/.md written")
    args = parser.parse_args()
    t0 = time.monotonic()
    kinds = [k for k in args.storages.split(",") if k] if args.pairs else []
    data = {"command": shlex.join([Path(sys.executable).name, *sys.argv]),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": socket.gethostname(),
            "cpus": os.cpu_count(), "platform": platform.platform(), "code": f"{args.code} ({code_commit(args.code)})",
            "seconds": 0, "pairs": [], "kills": [], "interrupts": []}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}

    def write() -> None:  # after every run: a cut-short session keeps what it measured
        data["seconds"] = round(time.monotonic() - t0)
        data["pairs"] = [pair_summary(k, runs[k]) for k in kinds]
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
        args.report.with_suffix(".md").write_text(markdown(data))

    with tempfile.TemporaryDirectory(prefix="advisor-faults-") as tmp:
        base = Path(tmp)
        recipe = recipe_file(base)
        slow = recipe_file(base, "tiny-slow-trials", **KILL_HELDOUT)
        for after in KILL_AFTER[:args.kills]:
            data["kills"].append(kill_run(after, slow, base, args.code, args.kill_timeout))
            write()
        sys.path.insert(0, str(ROOT / "tests"))
        interrupted = recipe_file(base, "tiny-interrupted", **INTERRUPT_HELDOUT)
        for _ in range(args.interrupts):
            for kind in INTERRUPT_SIGNALS:
                for after in INTERRUPT_AFTER:
                    data["interrupts"].append(interrupt_run(kind, after, interrupted, base, args.code,
                                                            args.kill_timeout))
                    write()
            kind, after, trials = SAMPLED
            data["interrupts"].append(interrupt_run(kind, after, interrupted, base, args.code, args.kill_timeout,
                                                    trials))
            write()
        from pg_server import running_postgres

        with running_postgres() if "postgresql" in kinds else contextlib.nullcontext() as pg:
            solos = {k: solo_run(k, recipe, base, args.code, pg) for k in kinds}
            for i in range(args.pairs):  # storages in turn
                for kind in kinds:
                    runs[kind].append(pair_run(kind, i, solos[kind], recipe, base, args.code, pg))
                    write()
    write()
    print(markdown(data))


if __name__ == "__main__":
    main()
