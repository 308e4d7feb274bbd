"""Re-check a stored recommendation on a new model version (the CI question).

``summary.json`` of an ``advisor search`` run holds the recommended plan, the recipe
(accuracy budget, workloads, target, calibration) and the numbers measured then.
:func:`advisor.workflows.recheck.run_recheck` loads the new model, scores the stored plan and the BF16 baseline
the same way the search did (proxy KL/perplexity on held-out tokens sampled from the
new model, energy from the same estimator, and the recipe's lm-eval tasks when the
harness is importable), and checks them against the stored thresholds:

* proxy KL(BF16 || plan) <= ``accuracy.max_kl`` (and the perplexity cap, if set);
* the largest lm-eval drop vs BF16 over the tasks <= ``benchmark.max_drop`` (when tasks are set;
  a loss on one task is not averaged away by a gain on another);
* the plan's J/token <= BF16's on every workload (never recommend a plan that costs
  more energy than BF16);
* with ``--engine``, on every workload that states a latency objective: the plan metered at its operating batch
  from the run (the largest that met the objective as the run's ``advisor verify`` served it, else as the search
  measured it, else the predicted one) still meets it as measured; a batch proven so may read up to
  :data:`REPEAT_TOLERANCE` over the objective (two meterings of one batch differ by that much).

With ``--engine`` the two plans' energy is metered on the GPU here through that engine (the search's
measured tier), the predicted numbers kept beside.

Verdict: ``pass`` or ``regression`` (the CLI exits 0 or 1; a missing GPU or package exits 3, any other
error 2).
``research=True`` adds a short search seeded with the old plan and its one-group
neighbours, and reports the best plan found on the new model.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from advisor.errors import InputError
from advisor.formats import Format
from advisor.plan import Plan
from advisor.report.schema import load_summary, plan_ids_listed
from advisor.search.frontier import percent_less

log = logging.getLogger(__name__)

WORST_DROP = "lm-eval drop vs BF16 (worst task)"



# ---------------------------------------------------------------- reading a summary


def read_summary(path: Path | str) -> dict[str, Any]:
    """A validated summary.json (current schema version, with a recommendation) as plain data."""
    summary = load_summary(path)
    if summary.recommendation is None:
        raise InputError(f"{path} holds no recommendation (the run finished no trial), so there is nothing to "
                         "re-check; finish the search first (`advisor search --resume`)")
    return summary.model_dump(mode="json")


def stored_plan(summary: dict[str, Any], plan_id: str | None, path: Path | str) -> tuple[Plan, dict[str, Any]]:
    """The recommended plan (or ``plan_id``) and its stored record (the reader, :func:`load_summary`, has made sure
    the recommendation is one of the trials)."""
    target = plan_id or summary["recommendation"].get("plan_id")
    record = next((r for r in summary["trials"] if r.get("plan_id") == target), None)
    if record is None:
        known = plan_ids_listed(r["plan_id"] for r in summary["trials"])
        raise InputError(f"--plan: no plan {target!r} in {path}; known: {known}")
    try:
        plan = Plan({k: Format(v) for k, v in record["formats"].items()}, Format(record.get("kv_cache", "bf16")))
    except (KeyError, ValueError, AttributeError) as exc:
        raise InputError(f"{path}: plan {target!r} has no valid formats ({exc})") from None
    if plan.id != target:
        raise InputError(f"{path}: plan id {target} does not match its formats ({plan.id}); the file was edited")
    return plan, record


def summary_recipe(summary: dict[str, Any], model: str | None = None, recipe_path: Path | None = None) -> Any:
    """The run's recipe (or ``recipe_path``), with ``model`` as the model source if given.

    Precedence: --model > --recipe > the recipe stored in summary.json.
    """
    from advisor.recipe.schema import load_recipe, validate_recipe

    if recipe_path is not None:
        recipe = load_recipe(recipe_path, {"model.source": model})
    else:
        data = json.loads(json.dumps(summary["recipe"]))
        if model is not None:
            data["model"] = {"source": model}
        recipe = validate_recipe(data, "recipe stored in summary.json")
    return recipe


# ---------------------------------------------------------------- result


@dataclass
class Check:
    name: str
    value: float
    threshold: float
    ok: bool
    detail: str = ""


@dataclass
class RecheckResult:
    verdict: str  # "pass" or "regression"
    checks: list[Check]
    plan_id: str
    plan_label: str
    model: dict[str, Any]
    stored: dict[str, Any]
    new: dict[str, Any]
    labels: dict[str, Any]
    benchmark: dict[str, Any]
    research: dict[str, Any] | None = None
    timings_s: dict[str, float] = field(default_factory=dict)
    generated: str = ""

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "exit_code": self.exit_code}


# ---------------------------------------------------------------- the re-check


def _energy_by_workload(ev: Any) -> dict[str, float]:
    return {e.workload: e.j_per_token for e in ev.energy}


def score_benchmark(ctx: Any, plan: Plan, bf16: Plan, out_dir: Path) -> dict[str, Any]:
    spec = ctx.recipe.benchmark
    if not spec.tasks:
        return {"status": "not run: the recipe sets no lm-eval tasks"}
    try:
        from advisor.accuracy import harness
    except ImportError as exc:
        return {"status": f"not run: advisor.accuracy.harness is not importable ({exc})"}
    scores = {}
    for label, p in (("bf16", bf16), ("plan", plan)):
        res = harness.score_plan(
            ctx.assemble(p), ctx.loaded.tokenizer, p.id, ctx.fingerprint, spec.tasks, limit=spec.limit,
            seed=spec.seed, data_dir=spec.data_dir, cache_dir=out_dir / "benchmark-cache",
        )
        scores[label] = {t: s.to_dict(with_items=False) for t, s in res.items()}
    tasks = sorted(scores["plan"])
    sign = {t: 1.0 if scores["plan"][t]["higher_is_better"] else -1.0 for t in tasks}
    drops = {t: sign[t] * (scores["bf16"][t]["value"] - scores["plan"][t]["value"]) for t in tasks}
    worst = max(tasks, key=lambda t: drops[t])
    return {"status": "measured (lm-eval)", "tasks": tasks, "scores": scores, "drops": drops,
            "worst_task": worst, "worst_drop": drops[worst], "max_drop": spec.max_drop}


def recheck_checks(recipe: Any, ev: Any, ev_bf16: Any, bench: dict[str, Any]) -> list[Check]:
    budget = recipe.accuracy
    out = [Check("proxy KL vs BF16 (nats/token)", ev.kl, budget.max_kl, ev.kl <= budget.max_kl)]
    if budget.max_ppl_increase_pct is not None:
        inc = 100.0 * (ev.ppl / ev.ppl_bf16 - 1.0)
        out.append(Check("perplexity increase vs BF16 (%)", inc, budget.max_ppl_increase_pct,
                         inc <= budget.max_ppl_increase_pct))
    if "worst_drop" in bench:
        out.append(Check(WORST_DROP, bench["worst_drop"], bench["max_drop"], bench["worst_drop"] <= bench["max_drop"],
                         f"worst of {', '.join(bench['tasks'])}: {bench['worst_task']}"))
    plan_e, bf16_e = _energy_by_workload(ev), _energy_by_workload(ev_bf16)
    for w, e in plan_e.items():
        out.append(Check(f"J/token '{w}' (must not exceed BF16)", e, bf16_e[w], e <= bf16_e[w],
                         f"{percent_less(e, bf16_e[w])} less than BF16" if bf16_e[w] > 0 else ""))
    return out


# Two meterings of one plan at one batch, on one H200 minutes apart (verify's engine, then recheck's), read TPOT
# up to 3.9% apart (2026-11-29, reports/benchmarks/verify_time.md, round 4). A batch already proven to meet the
# objective is not failed for less than this: on the same layer shape the weights do not move the time.
REPEAT_TOLERANCE = 0.05


def operating_batches(summary: dict[str, Any], plan_id: str, served: dict[str, Any] | None = None
                      ) -> dict[str, tuple[int, str, dict[str, Any]]]:
    """Workload -> (the plan's operating batch under that workload's objective, where the batch comes from, the
    stored point as measured): the largest batch that met the objective as the run's ``advisor verify`` served it
    (``served``: its verify.json, where it stands for this engine and GPU), else as the search measured it, else the
    predicted batch (where the prediction says it meets at all)."""
    out = {}
    for p in summary.get("operating_points") or []:
        if p.get("plan_id") != plan_id:
            continue
        m = p.get("measured") or {}
        if m.get("meets") and not m.get("not_measured"):
            out[p["workload"]] = (int(m["batch"]), "measured", m)
        elif p.get("meets"):
            out[p["workload"]] = (int(p["batch"]), "predicted", {})
    plan = next((p for p in (served or {}).get("plans") or [] if p.get("plan_id") == plan_id), None)
    for row in (plan or {}).get("operating") or []:
        s = row.get("vllm_search") or {}
        if s.get("meets") and not s.get("not_measured") and s.get("batch"):
            out[row["workload"]] = (int(s["batch"]), "served in verify", s)
    return out


def objective_checks(workload: Any, point: Any, origin: str, stored: dict[str, Any]) -> tuple[list[Check], list[str]]:
    """One check per term ``workload``'s objective states, on ``point`` (the plan metered at its operating batch),
    and a note for each term the engine does not time. A batch the run proved to meet (``origin`` not
    "predicted") may read up to :data:`REPEAT_TOLERANCE` over the objective."""
    checks, untimed = [], []
    proven = origin != "predicted"
    for term, limit, got in (("TPOT", workload.tpot_ms, point.tpot_ms), ("TTFT", workload.ttft_ms, point.ttft_ms)):
        if limit is None:
            continue
        if got is None:
            untimed.append(f"{term} on '{workload.name}' is not timed by this engine: its objective was not checked")
            continue
        before = stored.get(f"{term.lower()}_ms")
        detail = f"stored run: {before:.3g} ms at this batch" if before is not None else ""
        threshold = limit * (1.0 + REPEAT_TOLERANCE) if proven else limit
        if proven and got > limit:
            detail += (f"{'; ' if detail else ''}over the objective ({limit:g} ms) by {100 * (got / limit - 1):.1f}%: "
                       f"two meterings of one batch differ by up to {100 * REPEAT_TOLERANCE:.0f}%")
        checks.append(Check(f"{term} {workload.quantile} '{workload.name}' at batch {point.batch} ({origin} operating "
                            "batch), as measured (ms)", got, threshold, got <= threshold, detail))
    return checks, untimed


def stored_numbers(summary: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    bf16_trial = summary.get("baselines", {}).get("all-bf16")
    bf16 = next((r for r in summary["trials"] if r.get("trial") == bf16_trial), None)
    return {
        "model": summary.get("model"),
        "kl": record.get("kl"), "ppl": record.get("ppl"),
        "energy_j_per_token": {e["workload"]: e["j_per_token"] for e in record.get("energy", [])},
        "bf16_energy_j_per_token": {e["workload"]: e["j_per_token"] for e in (bf16 or {}).get("energy", [])},
        "benchmark_drop": max((t["drop"] for t in (record.get("acceptance") or {}).get("tasks", [])),
                              default=None),
        "accuracy_budget": summary["accuracy_budget"],
        "generated": summary.get("generated"),
    }


def neighbours(plan: Plan, formats: list[Format]) -> list[Plan]:
    """Plans that differ from ``plan`` in one group's format, in group order."""
    out = []
    for g, f in plan.formats.items():
        for other in formats:
            if other != f:
                out.append(Plan({**plan.formats, g: other}, plan.kv_cache))
    return out


def _num(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return str(x)
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def render_markdown(r: RecheckResult) -> str:
    """A pull-request comment."""
    head = "PASS" if r.passed else "REGRESSION"
    icon = ":white_check_mark:" if r.passed else ":x:"
    st = r.stored
    lines = [
        f"## {icon} precision-advisor re-check: {head}",
        "",
        f"Stored recommendation `{r.plan_id}` ({r.plan_label}), searched on `{(st.get('model') or {}).get('name')}` "
        f"(fingerprint `{(st.get('model') or {}).get('fingerprint')}`), re-scored on `{r.model['name']}` "
        f"(fingerprint `{r.model['fingerprint']}`"
        + (", same weights" if r.model["same_weights_as_stored"] else ", new weights") + ").",
        "",
        "| check | new model | threshold | stored run | result |",
        "|---|---|---|---|---|",
    ]
    stored_vals = {"proxy KL vs BF16 (nats/token)": st.get("kl"), WORST_DROP: st.get("benchmark_drop")}
    for c in r.checks:
        old = stored_vals.get(c.name)
        if old is None and c.name.startswith("J/token '"):
            w = c.name.split("'")[1]
            old = st["energy_j_per_token"].get(w)
        thr = f"<= {_num(c.threshold)}" + (" (BF16)" if c.name.startswith("J/token") else "")
        lines.append(f"| {c.name} | {_num(c.value)} | {thr} | {_num(old)} | "
                     f"{'ok' if c.ok else '**fails**'}{' - ' + c.detail if c.detail else ''} |")
    lines += [
        "",
        f"- Perplexity: plan {r.new['ppl']:.3f}, BF16 {r.new['ppl_bf16']:.3f} (new model).",
        f"- Accuracy: {r.labels['accuracy']}. Benchmark: {r.benchmark.get('status')}.",
        f"- Energy: {'; '.join(r.labels['energy'])}.",
        *(f"- Objective: {note}." for note in r.labels.get("objectives", [])),
    ]
    if "predicted" in r.new:
        pred = r.new["predicted"]
        lines.append(f"- Metered through `--engine {r.new['engine']}`; the predicted tier said: " + "; ".join(
            f"'{p['workload']}' plan {_num(p['j_per_token'])}, BF16 {_num(b['j_per_token'])} J/token"
            for p, b in zip(pred["energy"], pred["bf16_energy"], strict=False)) + ".")
    if r.research is not None:
        rs = r.research
        if "plan_id" in rs:
            same = "the stored plan is still the best found" if rs["same_as_stored"] else "a different plan"
            lines.append(f"- Re-search ({rs['trials']} trials around the old plan): `{rs['plan_id']}` "
                         f"({rs['label']}), KL {rs['kl']:.4g}; {same}. {rs['reason']}.")
        else:
            lines.append(f"- Re-search ({rs['trials']} trials): no recommendation.")
    if not r.passed:
        failed = ", ".join(c.name for c in r.checks if not c.ok)
        lines += ["", f"Failed: {failed}. Re-run `advisor search` on the new model (or `advisor recheck --research`)."]
    lines += ["", f"_Generated {r.generated} by `advisor recheck`._", ""]
    return "\n".join(lines)
