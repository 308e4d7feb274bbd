"""`advisor verify RUN_DIR --engine vllm`, top to bottom: the recommendation and all-BF16 (and any
``--plan``) exported if not yet, each served by vLLM in a process of its own, and three things
compared with the search's own numbers:

1. formats as served: per layer group, the format of the quantization method vLLM built for it;
2. accuracy as served: KL(advisor's BF16 reference || vLLM) over the whole vocabulary on the run's held-out
   tokens (:mod:`advisor.deploy.vllm._served_kl`), beside the same KL of the advisor's own model of the plan
   (the exported checkpoint, de-quantized) and the proxy KL the search scored; LAMBADA-style items
   (context, last word) scored greedily from vLLM's log-probabilities beside the advisor's model on
   the same items;
3. energy as served: vLLM J/token per workload beside the run's built-in measurement and prediction, and,
   for a workload with a latency objective, each plan served at its own operating batch (J/token, tokens/s,
   TPOT/TTFT where the serving rows time them) beside the predicted point and whether the objective is met;
   where it is missed in vLLM, smaller batches in the same engine until the largest that meets
   (:mod:`advisor.search.measured._batch_search`).

Written as ``verify.json`` / ``verify.md`` in the run folder and a section of ``report.md``; each plan's
serving is kept as it finishes (:mod:`advisor.deploy.verification._served_store`), so a verify cut off resumes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any

from advisor.deploy import serving_gpus
from advisor.deploy.engine_slots import engine_slots
from advisor.deploy.serving_gpus import serving_gpus_for
from advisor.deploy.verification import shown_role
from advisor.deploy.vllm import (
    MAX_ENTRIES,
    STEADY_LOAD_METER,
    ServeJob,
    logprobs_per_sequence,
    processes_ahead,
    run_in_child,
    served_formats,
    within_budget,
    write_reference,
)
from advisor.energy.meter import MeterConfig
from advisor.energy.prediction import predicted_for_gpus
from advisor.errors import InputError, SetupError
from advisor.estimate import EnergyEstimate
from advisor.formats import GPU, Format
from advisor.plan import Plan
from advisor.report.verify_record import ServedEnergy, ServedOperatingPoint, VerifiedPlan, VerifyResult
from advisor.search.operating import from_timed, objective_name
from advisor.workflows.verify_accuracy import (
    OwnModelScore,
    accuracy_as_served,
    lambada_items,
    own_model_scorer,
    read_lambada,
    score_own_model,
)
from advisor.workflows.verify_early import EarlyEngines
from advisor.workflows.verify_serving import Serving, engine_options, operating_workloads, serve_plans

EXPORT_HEADROOM_BYTES = 4 * 2**30  # calibration and proxy batches, CUDA context
REFERENCE_FILE = "verify_reference.pt"  # the reference's log-probabilities, for the engines' processes; deleted after
QUICK_KL_ENTRIES = MAX_ENTRIES // 8  # --quick: the served KL on fewer held-out positions (a smaller reference file)


def operating_as_served(summary: dict[str, Any], plan: Plan, served: dict[str, Any], label: str
                        ) -> list[ServedOperatingPoint]:
    """Per operating point of ``plan``: the run's predicted point (and the built-in runtime's, where the search
    measured it) beside vLLM's at the same batch, with the objective met as served."""
    points = {(p["workload"], p["batch"]): p for p in summary.get("operating_points") or []
              if p["plan_id"] == plan.id}
    rows = []
    for w in operating_workloads(summary, plan):
        row = served.get("energy", {}).get(w.name)
        if row is None:
            continue
        p = points[(objective_name(w), w.batch_size)]
        predicted = {k: p[k] for k in ("batch", "meets", "bound", "tpot_ms", "ttft_ms", "j_per_token",
                                       "tokens_per_s", "source")}
        rows.append(ServedOperatingPoint.model_validate({
            "workload": objective_name(w), "batch": w.batch_size, "predicted": predicted,
            "runtime": _metered_at(p.get("measured"), w.batch_size), "vllm": from_timed(plan, w, row, label).to_dict(),
            "vllm_unstable": row["measurement"]["unstable"], "batch_full": row["batch_full"],
            "vllm_search": served.get("searches", {}).get(objective_name(w))}))
    return rows


def _metered_at(measured: dict[str, Any] | None, batch: int) -> dict[str, Any] | None:
    """The search's measured tier at ``batch`` (its trail holds every batch it metered), None where not metered."""
    if not measured:
        return None
    if measured.get("batch") == batch:
        return measured
    return next((t for t in measured.get("trail") or [] if t.get("batch") == batch), None)


def energy_as_served(record: dict[str, Any] | None, served: dict[str, Any],
                     over_gpus: Callable[[str], EnergyEstimate] | None = None) -> list[ServedEnergy]:
    """Per stated workload: vLLM's J/token beside the run's measured (built-in) and predicted numbers, each
    labelled (the operating points' rows are :func:`operating_as_served`'s). Served over several GPUs or on another
    kind than the run's target, ``over_gpus(workload name)`` is the prediction for what served (the run's own kept
    beside)."""
    record = record or {}
    measured = {e["workload"]: e for e in record.get("energy", []) if e.get("measured")}
    predicted = {e["workload"]: e for e in record.get("predicted_energy", []) or record.get("energy", [])
                 if not e.get("measured")}
    rows = []
    for name, row in served.get("energy", {}).items():
        if " at batch " in name:
            continue
        m, p = measured.get(name), predicted.get(name)
        rows.append({
            "workload": name, "vllm_j_per_token": row["j_per_token"], "vllm_unstable": row["measurement"]["unstable"],
            "batch_full": row["batch_full"], "vllm_tokens_per_s": row["tokens_per_s"],
            "runtime_j_per_token": m["j_per_token"] if m else None, "runtime_source": m["source"] if m else None,
            "predicted_j_per_token": p["j_per_token"] if p else None, "predicted_source": p["source"] if p else None,
            "gpu_busy_pct": row.get("gpu_busy_pct"), "other_gpus_busy_pct": row.get("other_gpus_busy_pct"),
            "vllm_starved_windows": row["measurement"].get("starved_windows") or 0,
        })
        if over_gpus is not None:
            tp = over_gpus(name)
            rows[-1].update(predicted_j_per_token=tp.j_per_token, predicted_source=tp.source,
                            predicted_run_j_per_token=p["j_per_token"] if p else None)
    return [ServedEnergy.model_validate(r) for r in rows]


def config_architectures(spec: Any) -> tuple[str, ...]:
    """The architectures the model's config.json lists, read without loading the model (what an engine's process
    started ahead looks up in vLLM's registry); none where no config.json can be read yet (a GGUF file; the load
    then says what is wrong)."""
    from advisor.models.config_fields import raw_config
    from advisor.models.loading import resolve_source

    try:
        where, gguf_file = resolve_source(spec)
    except InputError:
        return ()
    raw = None if gguf_file else raw_config(where, spec.revision)
    return tuple((raw or {}).get("architectures") or ())


def engines_to_start(summary: dict[str, Any], plans: dict[str, Plan]) -> int | None:
    """How many engines this verify starts, one a distinct plan, all-BF16 among them (the run's all-BF16 trial); None
    where the run names none (then no bound on the processes started ahead)."""
    trial = (summary.get("baselines") or {}).get("all-bf16")
    bf16 = next((t["plan_id"] for t in summary.get("trials") or [] if t.get("trial") == trial), None) \
        if trial is not None else None
    return None if bf16 is None else len({bf16, *(p.id for p in plans.values())})


def exports_device(model: Any) -> str:
    """Where verify exports the plans: the GPU where the model, its quantized copy, the fake-quantized weights and the
    reloaded checkpoint fit at once (:func:`~advisor.deploy.checkpoint._export.export_plan`), else the CPU."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    free, _ = torch.cuda.mem_get_info(0)
    return "cuda" if _bf16_bytes(model) + export_working_set(model, "cuda") <= free else "cpu"


def export_working_set(model: Any, export_device: str) -> int:
    """What exporting the plans on ``export_device`` needs on the GPU beyond the model it holds already: its quantized
    copy, the fake-quantized weights and the reloaded checkpoint (:func:`exports_device`'s sum), none on the CPU."""
    return 3 * _bf16_bytes(model) + EXPORT_HEADROOM_BYTES if export_device == "cuda" else 0


def _bf16_bytes(model: Any) -> int:
    return 2 * sum(p.numel() for p in model.parameters())


def free_gpu_memory() -> str:
    """What is free on ``cuda:0`` once this process has handed back what it no longer uses, and what it holds."""
    import torch

    if not torch.cuda.is_available():
        return "no GPU"
    free, total = serving_gpus.free_gpu_bytes(), serving_gpus.total_gpu_bytes()
    held = torch.cuda.memory_allocated(0)
    return f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free on cuda:0, {held / 2**30:.1f} GiB held by this process"


def export_plans(plans: dict[str, Plan], checkpoint_for: Callable[[Plan], Path], as_is: Path | None, device: str,
                 seconds: dict[str, float], status: Callable[[str], None],
                 on_exported: Callable[[str, Plan, Path], None] | None = None) -> dict[str, Path]:
    """Each role's plan exported where not yet (on ``device``; all-BF16 served from ``as_is`` where the model's
    folder serves it), its seconds into ``seconds``, ``on_exported`` told as each is written; the folder each role
    is served from."""
    from advisor.deploy.checkpoint import folder_serving

    paths: dict[str, Path] = {}
    for role, plan in plans.items():
        if (served_from := folder_serving(plan, as_is)) is not None:
            status(f"plan {plan.id} ({shown_role(role, plan.id)}): served from {served_from} as it is (its weights "
                   "are BF16 already): nothing to export")
        else:
            status(f"exporting plan {plan.id} ({shown_role(role, plan.id)}) if not exported, on the {device}")
        t = time.perf_counter()
        paths[role] = checkpoint_for(plan)
        seconds[role] = time.perf_counter() - t
        if on_exported is not None:
            on_exported(role, plan, paths[role])
    return paths


def own_model(loaded: Any, path: Path, as_is: Path | None, plan: Plan, device: str) -> Any:
    """The advisor's own model of ``plan``'s export at ``path`` on ``device``, in eval mode: the loaded model itself
    where the plan is all-BF16 served from the model's folder, else the export read back."""
    from advisor.deploy.checkpoint import folder_serving, load_exported

    if folder_serving(plan, as_is) is not None:
        return loaded.model.to(device).eval()
    return load_exported(path, device=device, dtype=next(loaded.model.parameters()).dtype).eval()


def verify_run(run_dir: Path, engine: str = "vllm", plan_ids: Sequence[str] = (), lambada: Path | None = None,
               lambada_count: int = 200, energy: bool = True, meter: MeterConfig | None = None,
               runner: Callable[[ServeJob], dict[str, Any]] | None = None,
               rounds_runner: Callable[[ServeJob, Any], dict[str, Any]] | None = None,
               status: Callable[[str], None] = lambda _m: None, gpus: int | None = None, workers: int = 1,
               quick: bool = False) -> VerifyResult:
    """Serve the run's plans through ``engine`` (each in a process of its own unless ``runner``, or for a plan whose
    objectives are searched ``rounds_runner``, says otherwise) over ``gpus`` GPUs
    (:mod:`advisor.deploy.serving_gpus`; the run's recipe's when None), ``workers`` plans at once on GPUs of their
    own (:mod:`advisor.workflows.verify_serving`), and write verify.json / verify.md / report.md's section. ``quick``:
    the recommendation and all-BF16 only, the served KL on fewer positions (:data:`QUICK_KL_ENTRIES`)."""
    from advisor.deploy.checkpoint import bf16_served_as_is, checkpoint_exporter
    from advisor.deploy.verification import (
        read_summary,
        render_verify,
        served_operating_summary,
        stored_plan,
        summary_recipe,
        write_report_section,
    )
    from advisor.deploy.vllm import import_vllm
    from advisor.energy.prediction import gpu_here
    from advisor.engines import ENGINE_TABLE, engines_that, listed
    from advisor.engines import engine as engine_entry
    from advisor.models.arithmetic import to_scoring_arithmetic
    from advisor.models.loading import load_model
    from advisor.report.plots import plot_operating_points
    from advisor.workflows.context import model_fingerprint
    from advisor.workflows.export import run_tokens

    run_dir = Path(run_dir)
    started = time.perf_counter()
    if quick and plan_ids:
        raise InputError("--quick serves the recommendation and all-BF16 only; drop --plan, or --quick to serve "
                         f"{', '.join(plan_ids)} too")
    if not run_dir.is_dir():
        raise InputError(f"RUN_DIR {run_dir} is not a directory; give the folder `advisor search` wrote")
    summary = read_summary(run_dir / "summary.json")
    if engine not in ENGINE_TABLE or not engine_entry(engine).verifies:
        raise InputError(f"--engine: got {engine!r}; `advisor verify` serves through "
                         f"{listed(engines_that(lambda e: e.verifies), '--engine ')} only")
    plans: dict[str, Plan] = {}  # the inputs judged before what the machine lacks (exit 2 before 3)
    rec, _ = stored_plan(summary, None, run_dir / "summary.json")
    plans["recommendation"] = rec
    for pid in plan_ids:
        plans[pid], _ = stored_plan(summary, pid, run_dir / "summary.json")
    lambada_docs = read_lambada(lambada, lambada_count) if lambada else []
    vllm = import_vllm()
    kind, here = gpu_here()
    kind = GPU(kind) if kind is not None else None
    if here is None:
        raise SetupError("`advisor verify` serves the plans on the GPU here and NVML sees none; run it on an "
                         "NVIDIA GPU machine with vLLM installed")

    recipe = summary_recipe(summary)
    recipe = recipe.model_copy(update={"out": run_dir.parent, "name": run_dir.name})
    # the first engine's process imports vLLM while this one loads, exports and scores; each next one while one serves
    ahead = processes_ahead(config_architectures(recipe.model), jobs=engines_to_start(summary, plans)) \
        if runner is None and rounds_runner is None and workers <= 1 else nullcontext()
    with ahead:
        status(f"loading model {recipe.model.source}")
        loaded = load_model(recipe.model, "cpu")
        roles: dict[str, Plan] = {}  # one serving per plan: a role that names a plan already there joins its name
        for role, plan in {"bf16": Plan.uniform(loaded.shape.groups, Format.BF16), **plans}.items():
            same = next((r for r, p in roles.items() if p.id == plan.id), None)
            roles[f"{same}+{role}" if same else role] = roles.pop(same) if same else plan
        plans = roles
        fingerprint = model_fingerprint(loaded, (summary.get("model") or {}).get("fingerprint"))
        export_device = exports_device(loaded.model)
        if export_device == "cuda":  # in BF16, as a search on the GPU scored; minutes faster than the CPU
            loaded.model.to("cuda")
        else:
            to_scoring_arithmetic(loaded.model, "cpu")
        tokens = run_tokens(run_dir, recipe, loaded, fingerprint)
        members = {g.name: g.members for g in loaded.shape.groups}
        heldout = [tuple(int(t) for t in row) for row in tokens.heldout]
        items = lambada_items(lambada_docs, loaded.tokenizer)
        vocab = int(loaded.model.config.get_text_config().vocab_size)
        records = {r["plan_id"]: r for r in summary["trials"]}
        n_gpus = serving_gpus_for(gpus if gpus is not None else recipe.gpus, loaded.shape, recipe.workloads)
        if workers > 1:  # before any export: each engine needs GPUs of its own
            engine_slots(workers, n_gpus, serving_gpus.visible_gpus()[0])
        timings: dict[str, Any] = {"load_s": time.perf_counter() - started, "export_s": {}}
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        # vLLM answers every token's log-probability: bounded
        scored = within_budget(heldout, vocab, QUICK_KL_ENTRIES if quick else MAX_ENTRIES)
        status(f"scoring the BF16 reference on {len(scored)} of the {len(heldout)} held-out sequences")
        reference = logprobs_per_sequence(loaded.model.to(device).eval(), scored)
        if export_device != device:
            loaded.model.to(export_device)
        own: dict[str, OwnModelScore] = {}  # the advisor's own models, scored as their exports reload them
        checkpoint_for = checkpoint_exporter(recipe, loaded, tokens, on_reloaded=own_model_scorer(
            reference, scored, items, own) if export_device == device else None)

        as_is = bf16_served_as_is(recipe)
        reference_file = write_reference(run_dir / REFERENCE_FILE, reference)
        version = getattr(vllm, "__version__", "unknown")
        # prefill=False: verify reports J/token, tokens/s, TPOT and TTFT per workload, never prefill J per input token,
        # and a prefill metering would double every workload's time on the GPU
        base = ServeJob(checkpoint="", vocab_size=vocab, sequences=tuple(scored),
                        reference_logprobs=str(reference_file), items=tuple(items),
                        meter=asdict(meter or STEADY_LOAD_METER), tensor_parallel_size=n_gpus, prefill=False)
        serving = Serving(run_dir, summary, base, energy, version, here, runner or run_in_child,
                          rounds_runner, status, step_up=not quick)
        # the engines start while the plans export, where they fit beside them (verify_early's docstring)
        early = EarlyEngines(serving, loaded.shape, export_working_set(loaded.model, export_device), list(plans)) \
            if energy and runner is None and rounds_runner is None and workers <= 1 and n_gpus == 1 else None
        try:
            if early is not None:
                early.start_bf16(plans, as_is)
            paths = export_plans(plans, checkpoint_for, as_is, export_device, timings["export_s"], status,
                                 on_exported=early.start if early is not None else None)
            if device == "cuda":  # the engines' processes need the GPU's memory, the cached blocks too
                loaded.model.to("cpu")
                status(f"GPU memory for the engines: {free_gpu_memory()}")
            if early is not None:
                early.ready()
            t = time.perf_counter()
            served = serve_plans(plans, paths, serving, workers, early=early.started if early is not None else {})
            timings["serving_s"] = time.perf_counter() - t
        except BaseException:  # a failed export, or a stop (Ctrl-C): the early engines are killed, not left waiting
            if early is not None:
                early.stop()
            raise
        finally:
            reference_file.unlink(missing_ok=True)

    t = time.perf_counter()
    for role, plan in plans.items():  # the advisor's own models not scored as their exports reloaded them
        if plan.id not in own:
            status(f"scoring the advisor's own model of {plan.id} on the same tokens")
            own[plan.id] = score_own_model(reference, own_model(loaded, paths[role], as_is, plan, device), scored,
                                           items)
    timings["own_models_s"] = time.perf_counter() - t
    where = f"{n_gpus}x {here}, tp={n_gpus}" if n_gpus > 1 else here
    # the run priced its plans for its target on one GPU; served on another kind or over several, the energy rows'
    # prediction is re-priced for what served them (the run's own kept beside)
    other_kind = kind is not None and kind != recipe.target
    tp_model = predicted_for_gpus(loaded.shape, kind if other_kind else recipe.target, n_gpus) \
        if n_gpus > 1 or other_kind else None
    stated = {w.name: w for w in recipe.workloads}

    def over_gpus(plan: Plan) -> Callable[[str], EnergyEstimate] | None:
        return None if tp_model is None else (lambda name: tp_model.estimate(plan, stated[name]))

    rows = []
    for role, plan in plans.items():
        when = (served[role].get("served_at") or time.strftime("%Y-%m-%d"))[:10]  # a read-back serving: its day
        served_label = f"measured (vLLM {version}, {where}, {when})"
        formats, differ = served_formats(served[role].get("served", {}), plan, members)
        record = records.get(plan.id)
        rows.append(VerifiedPlan(
            role=role, plan_id=plan.id, label=plan.label(), checkpoint=str(paths[role]),
            formats_match=differ or True, served_formats=formats, proxy_kl=record.get("kl") if record else None,
            acceptance=record.get("acceptance") if record else None,
            accuracy=accuracy_as_served(reference, own[plan.id], served[role], len(scored), len(items), len(heldout)),
            energy=energy_as_served(record, served[role], over_gpus(plan)),
            operating=operating_as_served(summary, plan, served[role], served_label),
            vllm_options=engine_options(served[role]), vllm_load_s=served[role].get("load_s"),
            read_back_from=served[role].get("read_back_from"), devices=served[role].get("devices") or [],
        ))
    result = VerifyResult(
        run=summary["run"], engine="vllm", vllm_version=getattr(vllm, "__version__", "unknown"), gpu=here,
        gpus=n_gpus, date=time.strftime("%Y-%m-%d"), plans=rows, target=recipe.target.value,
        gpu_kind=kind.value if kind is not None else None,
        lambada={"file": str(lambada), "items": len(items)} if lambada else None,
        verified=all(r.formats_match is True for r in rows), max_kl=recipe.accuracy.max_kl, quick=quick,
        timings_s={**timings, "total_s": time.perf_counter() - started,
                   "plans": {r: served[r].get("timings_s") for r in plans}},
    )
    drawn = served_operating_summary(summary, result)
    if drawn is not None:
        plot_operating_points(drawn, run_dir / "verify_operating_points.png", near_objective=True)
        result.operating_plot = "verify_operating_points.png"
    result.write(run_dir / "verify.json")
    text = render_verify(result)
    (run_dir / "verify.md").write_text(text)
    write_report_section(run_dir / "report.md", text)
    return result
