"""Wiring for one run: model, token sets, calibrated formats, proxy and energy, from a recipe."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from advisor.calibration.tokens import TokenSets, batch_count, build_token_sets, forward_loop
from advisor.estimate import PredictedModel
from advisor.files import write_text_atomically
from advisor.formats import Format
from advisor.models.arithmetic import BF16, scoring_place, to_scoring_arithmetic
from advisor.models.loading import LoadedModel, load_model
from advisor.models.replicas import Ranks
from advisor.plan import Plan
from advisor.recipe.schema import Recipe
from advisor.search.measured import MeasuredTier
from advisor.search.study import Evaluation

if TYPE_CHECKING:  # torch, ModelOpt: imported when a run prepares, not when a command starts
    import torch

    from advisor.accuracy.proxy import ProxyEvaluator
    from advisor.quantize.bank import FormatBank
    from advisor.search.sensitivity import Sensitivity

log = logging.getLogger(__name__)

Status = Callable[[str], None]


def pick_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        from advisor.errors import SetupError

        raise SetupError("device 'cuda' was asked for but torch sees no CUDA GPU; use --device cpu")
    return requested


def model_fingerprint(loaded: LoadedModel, stored: str | None = None) -> str:
    """The loaded model's fingerprint, or the run's ``stored`` one where that is the same model's fingerprint of
    an older advisor (:func:`advisor.models.fingerprint.run_fingerprint`)."""
    from advisor.models.fingerprint import run_fingerprint, tensor_fingerprint

    return run_fingerprint(loaded.fingerprint or tensor_fingerprint(loaded.model), stored, loaded.model)


def tokens_key(recipe: Recipe, fingerprint: str) -> dict[str, Any]:
    """What token sets depend on: the calibration settings and the model's weights."""
    return json.loads(json.dumps({"calibration": recipe.calibration.model_dump(), "model": fingerprint}))


def load_or_build_tokens(
    recipe: Recipe, loaded: LoadedModel, run_dir: Path, fingerprint: str, store: bool = True
) -> TokenSets:
    """The run's token sets when they belong to this model and calibration settings, else new
    ones (stored when ``store``), so a resumed study scores on the same tokens."""
    path = run_dir / "tokens.pt"
    key_path = run_dir / "tokens.key.json"
    key = tokens_key(recipe, fingerprint)
    try:
        if path.is_file() and key_path.is_file() and json.loads(key_path.read_text()) == key:
            return TokenSets.load(path)
    except (OSError, ValueError) as e:  # unreadable or foreign files: build the same tokens again
        log.warning("%s: %s; building the token sets again", run_dir, e)
    tokens = build_token_sets(loaded.model, loaded.tokenizer, recipe.calibration)
    if store:
        tokens.save(path)
        write_text_atomically(key_path, json.dumps(key, indent=2))
    return tokens


@dataclass
class RunContext:
    """One prepared run: what every stage of `advisor search`, `advisor worker` and `advisor recheck` uses."""

    recipe: Recipe
    loaded: LoadedModel
    tokens: TokenSets
    bank: FormatBank  # every format calibrated once; assembles any plan's model
    proxy: ProxyEvaluator  # KL and perplexity against the BF16 reference on held-out tokens
    energy_model: PredictedModel  # the predicted tier, for every trial
    device: str
    fingerprint: str
    timings_s: dict[str, float] = field(default_factory=dict)
    trial_times_s: list[float] = field(default_factory=list)
    measured_model: MeasuredTier | None = None  # the measured tier, for the baselines and the front
    arithmetic: str = BF16  # what accuracy is computed in (models.arithmetic)
    ranks: Ranks = field(default_factory=Ranks)  # this process's place in a node (one process: alone)

    @property
    def scoring_place(self) -> str:
        """Where and in what accuracy is scored: a resumed study and its workers must score the same way."""
        return scoring_place(self.device, self.arithmetic)

    def worker(self) -> dict[str, object]:
        """This process as trials record it: host, pid and the UUID of the GPU it computes on."""
        from advisor.energy.meter import torch_device_uuid
        from advisor.search.storage import this_worker

        if self.device != "cuda":
            return this_worker(None)
        import torch

        return this_worker(torch_device_uuid(torch.cuda.current_device()))

    def assemble(self, plan: Plan) -> torch.nn.Module:
        return self.bank.assemble(plan)

    def sensitivity(self, on_step: Callable[[int, int], None] | None = None) -> Sensitivity:
        """Per-group damage and energy tables (cached in the run dir). On a node every rank calls this at once:
        rank 0 reads the cache, and else each rank scores every ``world``-th probe (``search.sensitivity``)."""
        from advisor.accuracy.proxy import ProxyEvaluator
        from advisor.models.groups import decoder_layers_path
        from advisor.search.sensitivity import first_changed_layer, load_cached, measure, store

        n = min(self.recipe.search.sensitivity_samples, self.tokens.heldout.shape[0])
        groups = self.loaded.shape.groups
        key = {"model": self.fingerprint, "calibration": self.recipe.calibration.model_dump(), "samples": n,
               "formats": [f.value for f in self.recipe.formats], "energy": self.energy_model.label,
               "workload": self.recipe.workloads[0].model_dump()}
        if len(self.recipe.kv_cache) > 1:  # only then, so caches written before it stay valid
            key["kv_cache"] = [f.value for f in self.recipe.kv_cache]
        if self.arithmetic != BF16:  # likewise
            key["arithmetic"] = self.arithmetic
        path, ranks = self.recipe.run_dir / "sensitivity.json", self.ranks
        cached = ranks.broadcast(load_cached(path, key) if ranks.rank == 0 else None)
        if cached is not None:
            return cached

        def damage_of(p: Plan) -> float:
            with ranks.busy("sensitivity"):
                return small.score(self.bank.assemble(p), reuse_layers=first_changed_layer(p)).kl

        # Each one-group plan reuses the reference outputs of the BF16 layers before its group.
        with ranks.busy("sensitivity"):
            small = ProxyEvaluator(self.bank.assemble(Plan.uniform(groups, Format.BF16)), self.tokens.heldout[:n],
                                   layers=decoder_layers_path(self.loaded.model))
        sens = measure(
            groups, self.recipe.formats, damage_of=damage_of,
            energy_of=lambda p: self.energy_model.estimate(p, self.recipe.workloads[0]).j_per_token,
            on_step=on_step, kv_cache=self.recipe.kv_cache, split=ranks if ranks.spread else None,
        )
        sens.tokens = int(self.tokens.heldout[:n].numel())
        if ranks.rank == 0:
            store(path, key, sens)
        return sens

    def evaluate(self, plan: Plan) -> Evaluation:
        t0 = time.perf_counter()
        if plan == Plan.uniform(self.loaded.shape.groups, Format.BF16):  # the proxy's own reference
            score = self.proxy.reference_score()
        else:
            score = self.proxy.score(self.bank.assemble(plan))
        energy = [self.energy_model.estimate(plan, w) for w in self.recipe.workloads]
        self.trial_times_s.append(time.perf_counter() - t0)
        return Evaluation(kl=score.kl, ppl=score.ppl, ppl_bf16=score.ppl_bf16, energy=energy)


def over_gpus(one_gpu: PredictedModel, shape: Any, target: Any, gpus: int, status: Status) -> PredictedModel:
    """The predicted tier for ``gpus`` GPUs (tensor parallel), or ``one_gpu`` where it cannot price the model."""
    from advisor.energy.prediction import predicted_for_gpus
    from advisor.errors import InputError

    try:
        return predicted_for_gpus(shape, target, gpus)
    except InputError as exc:
        status(f"energy: no prediction for {gpus} GPUs ({exc}); trials priced for one")
        return one_gpu


def prepare(
    recipe: Recipe,
    status: Status = lambda _msg: None,
    energy_model: PredictedModel | None = None,
    stored_fingerprint: str | None = None,
    ranks: Ranks | None = None,
) -> RunContext:
    """Load, sample tokens, calibrate each format once, and compute the BF16 reference. ``stored_fingerprint``:
    the model fingerprint of the run being continued or re-checked (an older advisor's is kept when it is this
    model's). ``ranks``: this process's place in a node (:mod:`advisor.workflows.node`), every rank calling this
    at once: each loads its replica; rank 0 builds the tokens and gives them to the others; the calibration
    batches, the bank's modules and the reference's batches are shared out (:mod:`advisor.models.replicas`)."""
    from advisor.accuracy.proxy import ProxyEvaluator
    from advisor.quantize.bank import FormatBank
    from advisor.quantize.modelopt_config import prepare_device

    run_dir = recipe.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    device = pick_device(recipe.device)
    prepare_device(device)
    timings: dict[str, float] = {}

    t = time.perf_counter()
    status(f"loading model {recipe.model.source} on {device}")
    from advisor.workflows.memory import cap_gpu_memory, load_device_map

    if device == "cuda":
        cap_gpu_memory(recipe.gpu_memory_gib)
    device_map = load_device_map(recipe, device)
    if device_map and (streamed := [k for k, v in device_map.items() if v == "cpu"]):
        status(f"{len(streamed)} modules stream from CPU memory as they run (the GPU memory is short"
               f"{f' of the {recipe.gpu_memory_gib:g} GiB cap' if recipe.gpu_memory_gib else ''}): {streamed[0]} ...")
        if recipe.calibration.source == "self":  # 6.5 min of a 14B's search capped at 24 GiB on an H100
            status("the tokens sampled from the model stream those layers once per token (minutes); a text file "
                   "as calibration.source skips the sampling")
    ranks = ranks or Ranks()
    with ranks.busy("load"):
        loaded = load_model(recipe.model, device, device_map=device_map)
    timings["load_s"] = time.perf_counter() - t
    t = time.perf_counter()
    fingerprint = model_fingerprint(loaded, stored_fingerprint)  # of the BF16 weights, before any float32 copy
    timings["fingerprint_s"] = time.perf_counter() - t  # beyond the hashing done while the shards were read
    arithmetic, why = to_scoring_arithmetic(loaded.model, device)
    if arithmetic != BF16:
        status(f"scoring in {arithmetic}: {why}")

    t = time.perf_counter()
    check_same_replicas(ranks, fingerprint, scoring_place(device, arithmetic))  # on a node: every replica loaded
    timings["load_s"] += time.perf_counter() - t
    t = time.perf_counter()
    status("building calibration and held-out tokens")
    ranks.stage = "tokens"
    if ranks.rank == 0:
        with ranks.busy("tokens"):
            tokens = load_or_build_tokens(recipe, loaded, run_dir, fingerprint)
    tokens = ranks.broadcast(tokens if ranks.rank == 0 else None)  # rank 0's, sampled alone (distributed.md)
    timings["tokens_s"] = time.perf_counter() - t

    if loaded.shape.is_moe:  # the energy models price the experts a batch touches under this routing
        from advisor.energy.profiling import with_measured_routing

        status("measuring the MoE routing on the calibration tokens")
        t = time.perf_counter()
        loaded.shape = with_measured_routing(loaded.model, loaded.shape, tokens.calibration)
        timings["routing_s"] = time.perf_counter() - t

    t = time.perf_counter()
    bank = FormatBank(
        loaded.model, loaded.shape.groups, recipe.formats, calibration_loop(tokens, ranks),
        on_format=lambda f: status(f"calibrating {f.value} (once for every trial)"), kv_cache=recipe.kv_cache,
        ranks=ranks,
    )
    timings["calibration_s"] = bank.seconds["calibration"]  # ModelOpt's calibration, every format
    timings["bank_s"] = time.perf_counter() - t - bank.seconds["calibration"]  # folding, packing, copies
    if bank.pack_stats.patched:
        log.debug("%d folded values decode otherwise from their codes: held beside them", bank.pack_stats.patched)
    if bank.pack_stats.kept_bf16:  # exact either way; only the bank's memory is larger than planned
        log.warning("%d folded weights stay BF16 in the bank, not packed as codes (e.g. %s)",
                    len(bank.pack_stats.kept_bf16), ", ".join(bank.pack_stats.kept_bf16[:3]))

    t = time.perf_counter()
    status("scoring the BF16 reference on held-out tokens")
    proxy = ProxyEvaluator(bank.assemble(Plan.uniform(loaded.shape.groups, Format.BF16)), tokens.heldout, ranks=ranks)
    timings["reference_s"] = time.perf_counter() - t

    measured_model = None
    t = time.perf_counter()
    if energy_model is None:
        from advisor.energy.prediction import make_energy_tiers

        tiers = {"predicted": "predicted only", "measured": "predicted for every trial, measured for the front",
                 "auto": "predicted for every trial, measured for the front if this GPU is the target"}
        status(f"choosing the energy models (energy: {recipe.energy}: {tiers.get(recipe.energy, recipe.energy)})")
        profile = Path(recipe.energy_profile) if recipe.energy_profile else None
        from advisor.deploy.engines import measured_tier

        engine = None
        if (tier := measured_tier(recipe.engine)) is not None:

            def engine():
                return tier(recipe, loaded, tokens)
        energy_model, measured_model = make_energy_tiers(recipe.energy, loaded.shape, recipe.target, profile, engine,
                                                         model_config=loaded.model.config,
                                                         workloads=recipe.workloads)
        if measured_model is not None and measured_model.gpus > 1:  # served over N GPUs: every trial priced for N
            energy_model = over_gpus(energy_model, loaded.shape, recipe.target, measured_model.gpus, status)
        from advisor.energy.prediction import as_served
        from advisor.workflows.run_settings import priced_engine

        energy_model = as_served(energy_model, loaded.shape, recipe.target, priced_engine(recipe))
        status(f"energy source: {energy_model.label}" + (" (the front measured with NVML)" if measured_model else ""))
        timings["energy_models_s"] = time.perf_counter() - t  # a per-model profile built here takes minutes
    return RunContext(recipe, loaded, tokens, bank, proxy, energy_model, device, fingerprint, timings,
                      measured_model=measured_model, arithmetic=arithmetic, ranks=ranks)


def calibration_loop(tokens: TokenSets, ranks: Ranks) -> Callable[[torch.nn.Module], None]:
    """ModelOpt's calibration loop over the calibration tokens; on a node, over this rank's batches."""
    if not ranks.spread:
        return forward_loop(tokens.calibration)
    return forward_loop(tokens.calibration, batches=ranks.indices(batch_count(tokens.calibration)))


def check_same_replicas(ranks: Ranks, fingerprint: str, place: str) -> None:
    """Every rank of a node must hold the same weights and score the same way on the same kind of GPU, or their
    shares would not add up to one process's numbers; each rank raises the same error, so none waits for another."""
    if not ranks.spread:
        return
    if place.startswith("cuda"):
        import torch

        place = f"{place} on {torch.cuda.get_device_name()}"
    seen = ranks.gather((fingerprint, place))
    odd = [f"rank {r}: {p}, weights {f[:12]}" for r, (f, p) in enumerate(seen) if (f, p) != seen[0]]
    if odd:
        from advisor.errors import SetupError

        raise SetupError(f"the node's processes differ from rank 0 ({seen[0][1]}, weights {seen[0][0][:12]}): "
                         f"{'; '.join(odd)}; run --workers on GPUs of one kind, with one model path")
