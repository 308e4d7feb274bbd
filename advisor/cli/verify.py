"""The `advisor verify` command (registered in cli/__init__.py): serve a run's plans in vLLM and compare.

Exit codes: 0 every group served as planned, 1 a group served in another format (named on the
Error line; verify.md says more), 2 bad input (a run folder of another version included), 3 no
vLLM or no GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from advisor.cli.common import err, handle_errors, out, print_error
from advisor.engines import engines_that, listed

VERIFIERS = engines_that(lambda e: e.verifies)  # the engines `advisor verify` serves through


@handle_errors
def verify(
    run_dir: Annotated[Path, typer.Argument(help="Run directory written by `advisor search`.")],
    engine: Annotated[str, typer.Option(help=f"Serving engine to verify in: {listed(VERIFIERS)}.")] = VERIFIERS[0],
    plan: Annotated[list[str] | None, typer.Option(
        "--plan", help="Also this plan id (repeatable); the recommendation and all-BF16 always.")] = None,
    lambada: Annotated[Path | None, typer.Option(
        help="LAMBADA JSONL ({\"text\": ...}) whose first items are scored through vLLM and the advisor.")] = None,
    lambada_items: Annotated[int, typer.Option(min=1, help="How many LAMBADA items.")] = 200,
    energy: Annotated[bool, typer.Option(help="Also meter J/token per workload in vLLM.")] = True,
    gpus: Annotated[int | None, typer.Option(min=1, help="GPUs of this node each plan is served over (tensor "
                                             "parallelism, all metered; default: the run's, else the fewest that "
                                             "hold it).")] = None,
    workers: Annotated[int, typer.Option(min=1, help="Plans served at once, each engine on GPUs of its own "
                                         "(workers x --gpus GPUs of this node).")] = 1,
    quick: Annotated[bool, typer.Option(help="The recommendation and all-BF16 only, at the stated workloads and "
                                        "objectives, the served KL on fewer held-out positions, no larger batch "
                                        "after a predicted one that meets: minutes, for CI.")]
    = False,
) -> None:
    """Serve the run's recommendation and BF16 in vLLM (GPU): the decision, formats, KL, items and J/token as
    served. Run again after a cut-off, it serves only the plans not yet served (RUN_DIR/verify_served keeps each)."""
    from advisor.deploy.verification import num, over_budget, served_decision, shown_role
    from advisor.workflows.verify import verify_run

    with err.status("verifying") as status:
        def step(message: str) -> None:  # a line each too: a log of a long run on a GPU machine keeps them
            status.update(message)
            err.print(message, highlight=False, markup=False, soft_wrap=True)

        result = verify_run(run_dir, engine=engine, plan_ids=plan or (), lambada=lambada, lambada_count=lambada_items,
                            energy=energy, status=step, gpus=gpus, workers=workers, quick=quick)
    over = [r.plan_id for r in over_budget(result)]
    for r in result.plans:
        a = r.accuracy
        served = "served as planned" if r.formats_match is True else f"{len(r.formats_match)} groups differ"
        out.print(f"{shown_role(r.role, r.plan_id)} {r.plan_id}: {served}; served KL "
                  f"{num(a.served_kl)} (advisor {num(a.advisor_kl)}, proxy {num(r.proxy_kl)})"
                  + (f", over max_kl {result.max_kl:g} as served" if r.plan_id in over else ""), highlight=False)
        for e in r.energy:
            out.print(f"  {e.workload}: vLLM {e.vllm_j_per_token:.4g} J/token, built-in "
                      f"{num(e.runtime_j_per_token)}, predicted {num(e.predicted_j_per_token)}", highlight=False)
        for o in r.operating:
            v = o.vllm
            meets = {True: "meets the objective", False: "misses the objective", None: "TPOT/TTFT not timed"}
            out.print(f"  {o.workload} at its operating batch {o.batch}: vLLM {num(v.j_per_token)} J/token"
                      + (f", TPOT {v.tpot_ms:.3g} ms" if v.tpot_ms is not None else "") + f" ({meets[v.meets]}), "
                      f"predicted {num(o.predicted.j_per_token)}", highlight=False)
    for line in served_decision(result):
        if line.startswith("- "):
            out.print("as served, " + line[2:].replace("**", ""), highlight=False, markup=False)
    out.print(f"took {result.timings_s['total_s'] / 60:.1f} min; written: {Path(run_dir) / 'verify.md'}, "
              "verify.json, and a section of report.md", highlight=False)
    if not result.verified:
        bad = "; ".join(f"{r.plan_id}: " + ", ".join(f"{g} {why}" for g, why in r.formats_match.items())
                        for r in result.plans if r.formats_match is not True)
        print_error(f"vLLM served layer groups otherwise than planned ({bad}); see verify.md")
        raise typer.Exit(1)
