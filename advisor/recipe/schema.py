"""Recipes: the one place that judges user input.

A recipe is a YAML file validated into :class:`Recipe`. Command-line flags override
recipe values, which override the defaults here. Every validation failure becomes
one :class:`InputError` naming the field and what is allowed.
"""

from __future__ import annotations

import collections.abc
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from advisor.engines import DEFAULT_ENGINE, ENGINE_TABLE, engine_names, engines_that, listed
from advisor.errors import InputError
from advisor.files import check_regular_file
from advisor.formats import GPU, GPU_SPECS, KV_CACHE_FORMATS, Format
from advisor.recipe.calibration_sets import is_set_source, set_spec_path
from advisor.recipe.strict import StrictSection

DEMO_MODEL = "demo:smollm2-135m"


#: GiB every GPU keeps free for the CUDA context, cuBLAS workspaces and allocator slack (the memory plan's)
RESERVED_GIB_PER_GPU = 2
NAME_MAX = 255  # a run's name is its folder's: at most 255 bytes on Linux file systems
MAX_CONCURRENCY = 1024  # requests in flight when a workload with an objective names no max_concurrency
SEED_MAX = 2**32 - 1  # numpy's and Optuna's samplers take seeds in [0, 2**32)
MAX_NODE_GPUS = 64  # GPUs of one node: what a plan spreads over, served or planned (`--dry-run --gpus`)


class ModelSpec(StrictSection):
    """Where the model comes from: a hub id, a local directory, a GGUF file, or the demo."""

    source: str = Field(DEMO_MODEL, description="hub id, local directory, .gguf file, or demo:smollm2-135m")
    gguf_file: str | None = Field(None, description="GGUF file name inside `source` (a directory or hub repo)")
    revision: str | None = Field(None, description="hub revision (branch, tag or commit) of `source`")

    @field_validator("source")
    @classmethod
    def _non_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must name a hub id, a local directory, a .gguf file or " + DEMO_MODEL)
        return v


class Workload(StrictSection):
    """A serving workload: concurrent requests and their input/output lengths."""

    name: str = Field("chat", description="how reports and `--workload` name it")
    batch_size: int = Field(16, ge=1, le=4096, description="concurrent sequences in decode")
    input_tokens: int = Field(512, ge=1, le=1_000_000, description="prompt tokens per request")
    output_tokens: int = Field(256, ge=1, le=1_000_000, description="generated tokens per request")
    tpot_ms: float | None = Field(None, gt=0, le=60_000, description="latency objective: time per output token "
                                  "(ms) at `percentile`; the report finds each plan's largest batch that meets it")
    ttft_ms: float | None = Field(None, gt=0, le=3_600_000, description="latency objective: time to first token "
                                  "(ms) at `percentile`")
    percentile: Literal["p50", "p90"] | None = Field(None, description="the percentile the objective holds at "
                                                     "(null: p50)")
    max_concurrency: int | None = Field(None, ge=1, le=65_536, description="the most requests the service keeps "
                                        f"in flight (an objective's batch never exceeds it; null: {MAX_CONCURRENCY})")

    @model_validator(mode="after")
    def _objective(self) -> Workload:
        if self.tpot_ms is None and self.ttft_ms is None and (self.percentile or self.max_concurrency):
            raise ValueError(f"workload {self.name!r} sets percentile or max_concurrency but states no objective; "
                             "add tpot_ms and/or ttft_ms")
        if self.tpot_ms is not None and self.ttft_ms is not None and self.ttft_ms < self.tpot_ms:
            raise ValueError(f"workload {self.name!r}: ttft_ms {self.ttft_ms:g} is below tpot_ms {self.tpot_ms:g}, "
                             "which no server can meet (the first token takes at least one step); raise ttft_ms")
        return self

    @property
    def has_objective(self) -> bool:
        return self.tpot_ms is not None or self.ttft_ms is not None

    @property
    def quantile(self) -> Literal["p50", "p90"]:
        return self.percentile or "p50"

    @property
    def concurrency_limit(self) -> int:
        return self.max_concurrency or MAX_CONCURRENCY


class CalibrationSpec(StrictSection):
    """Calibration and held-out token sets (never overlapping)."""

    source: str = Field(
        "self", description="'self' (text sampled from the BF16 model), a .txt/.jsonl path, chat:PATH.jsonl "
        "(chat messages rendered with the model's chat template; a .jsonl with a 'messages' field is detected), "
        "or set:NAME / set:PATH.yaml (a dataset read with `datasets`: a set under calibration/, e.g. "
        "set:cnn_dailymail, or your own spec; calibration/README.md)")
    num_samples: int = Field(16, ge=1, le=100_000, description="calibration sequences (quantizer ranges)")
    seq_len: int = Field(128, ge=8, le=32_768, description="tokens per calibration sequence")
    heldout_samples: int = Field(8, ge=1, le=100_000, description="held-out sequences the proxy KL is measured on")
    heldout_seq_len: int = Field(128, ge=8, le=32_768, description="tokens per held-out sequence")
    seed: int = Field(0, ge=0, le=SEED_MAX, description="seed of the sampling and of the split")

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        if is_set_source(v):
            try:
                set_spec_path(v)  # a name must be a shipped set; a spec file is read in pre-flight
            except InputError as exc:
                raise ValueError(str(exc).removeprefix("calibration.source: ")) from None
            return v
        path = v.removeprefix("chat:")
        if v != "self" and not path.endswith((".txt", ".jsonl", ".json")):
            raise ValueError("must be 'self', a path to a .txt or .jsonl file, chat:PATH.jsonl, or set:NAME")
        if v.startswith("chat:") and not path.endswith((".jsonl", ".json")):
            raise ValueError("chat: needs a .jsonl file of {\"messages\": [{\"role\", \"content\"}, ...]} rows")
        return v


class AccuracySpec(StrictSection):
    """The accuracy budget: a plan is feasible when its proxy damage is within it."""

    max_kl: float = Field(0.05, gt=0, description="mean per-token KL(BF16 || plan) in nats")
    max_ppl_increase_pct: float | None = Field(None, gt=0, description="optional cap on perplexity increase, %")


class BenchmarkSpec(StrictSection):
    """lm-eval tasks that judge the baselines and the lowest-energy candidates (multi-fidelity).

    A plan passes when, on every task, the upper confidence bound of its paired drop against
    BF16 is within ``max_drop``; items are scored in nested batches (``first_batch``,
    doubling, up to ``limit`` or the full set) only while a task is undecided.
    """

    tasks: list[str] = Field(default_factory=list, description="lm-eval task names, local tasks or task YAMLs")
    limit: int | None = Field(None, ge=1, description="most items per task (seeded order); None = full set")
    first_batch: int = Field(100, ge=1, description="items per task at the first look; doubled at each next look")
    seed: int = Field(1234, ge=0, le=SEED_MAX, description="seed of the items' order (the same items for every plan)")
    data_dir: str | None = Field(
        None, description="folder with lambada_openai.jsonl, piqa.jsonl, arc_easy.jsonl, gsm8k.jsonl")
    max_drop: float = Field(0.02, ge=0, le=1, description="allowed drop vs BF16 on each task (primary metric)")
    confidence: float = Field(0.95, gt=0.5, lt=1, description="confidence of the drop intervals, over all looks")
    max_candidates: int = Field(6, ge=1, description="candidates to judge at most (lowest energy first)")


class SearchSpec(StrictSection):
    """The Optuna study: its budget, sampler and trial heartbeat."""

    trials: int = Field(40, ge=1, le=1_000_000, description="total trials in the study, baselines included")
    timeout_s: float | None = Field(None, gt=0, description="stop starting trials after this many seconds")
    seed: int = Field(0, ge=0, le=SEED_MAX, description="the sampler's seed")
    sampler: Literal["guided", "tpe", "nsga2", "random"] = Field(
        "guided", description="guided: sensitivity + knapsack proposals, then TPE; or a plain Optuna sampler"
    )
    sensitivity_samples: int = Field(4, ge=1, description="held-out sequences used for per-group sensitivity")
    measured_candidates: int = Field(6, ge=0, description="front plans measured on the GPU after the search "
                                     "(energy: measured or auto), besides the baselines")
    heartbeat_s: int = Field(10, ge=1, le=3600, description="trial heartbeat (database storages); a trial "
                             "silent for 3 heartbeats is failed and retried")


class SiteSpec(StrictSection):
    """The serving site: a power budget per GPU and the request rate the payback is priced at."""

    power_cap_w: float | None = Field(None, gt=0, le=5000, description="power budget per GPU (W): operating points "
                                      "are also predicted within it (the advisor never sets a GPU's power limit)")
    requests_per_s: float = Field(10.0, gt=0, le=1e7, description="requests per second of the primary workload "
                                  "the search's energy is paid back at")


class Recipe(StrictSection):
    """Everything a search needs. See recipes/quickstart.yaml for a documented example."""

    name: str = Field("run", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=NAME_MAX,
                      description="the study's and run folder's name (at most 255 "
                      "characters)")
    model: ModelSpec = ModelSpec()
    formats: list[Format] = Field(description="allowed formats; default: all the target runs natively")
    kv_cache: list[Format] = Field(default_factory=lambda: [Format.BF16],
                                   description="KV-cache formats to search: [bf16] (default) or [bf16, fp8]")
    target: GPU = Field(GPU.H100, description="the GPU the plan will be served on")
    workloads: list[Workload] = Field(default_factory=lambda: [Workload()], min_length=1)
    calibration: CalibrationSpec = CalibrationSpec()
    accuracy: AccuracySpec = AccuracySpec()
    benchmark: BenchmarkSpec = BenchmarkSpec()
    search: SearchSpec = SearchSpec()
    site: SiteSpec = SiteSpec()
    storage: str | None = Field(None, description="Optuna storage URL; default: sqlite file in the output dir")
    out: Path = Field(Path("runs"), description="folder the run folder `OUT/NAME/` is made in")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where accuracy is scored (auto: cuda if "
                                                   "torch sees one; a CPU without BF16 matrix instructions computes "
                                                   "the BF16 weights in float32)")
    energy: Literal["auto", "predicted", "measured"] = Field(
        "auto", description="measured: NVML on a GPU of the target kind (~40 s per plan and workload); "
        "predicted: this model's per-model profile for the target, else a shipped one of its layer geometry, the "
        "target's GPU profile, else the datasheet roofline; auto: measured when possible"
    )
    energy_profile: str | None = Field(None, description="a profile JSON from `advisor profile` to predict with")
    gpu_memory_gib: float | None = Field(None, gt=0, le=4096, description="cap on each GPU's memory the search uses "
                                         "(GiB; above the 2 GiB each GPU keeps free): layers beyond it stream from "
                                         "CPU memory (slower; same numbers)")
    engine: str = Field(  # judged against advisor.engines' table when validated (a test may add an engine)
        DEFAULT_ENGINE, json_schema_extra={"enum": list(engine_names())},
        description="what runs the plans the measured tier measures: "
        + listed([f"{e.name} ({e.runs})" for e in ENGINE_TABLE.values()]))
    gpus: int | None = Field(None, ge=1, le=MAX_NODE_GPUS, description="GPUs of this node one vLLM engine spreads a "
                             "served plan over (tensor parallelism, engine vllm; unset: the fewest that hold it)")

    @field_validator("gpu_memory_gib")
    @classmethod
    def _gpu_memory(cls, v: float | None) -> float | None:
        if v is not None and v <= RESERVED_GIB_PER_GPU:
            raise ValueError(f"every GPU keeps {RESERVED_GIB_PER_GPU} GiB free (CUDA context, workspaces), so a cap "
                             f"of {v:g} GiB leaves nothing for the model; give more than {RESERVED_GIB_PER_GPU} GiB")
        return v

    @field_validator("storage")
    @classmethod
    def _storage(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("an empty URL names no database; give one like sqlite:///runs/study.db, or leave "
                             "storage out (the run's own RUN_DIR/study.db)")
        return v

    @field_validator("engine")
    @classmethod
    def _engine(cls, v: str) -> str:
        if v not in ENGINE_TABLE:
            raise ValueError(f"allowed: {', '.join(engine_names())}")
        return v

    @field_validator("formats")
    @classmethod
    def _formats(cls, v: list[Format]) -> list[Format]:
        if Format.BF16 not in v:
            raise ValueError("must include bf16 (the reference every plan is compared with)")
        if len(set(v)) != len(v):
            raise ValueError("lists a format twice")
        return v

    @field_validator("kv_cache")
    @classmethod
    def _kv_cache(cls, v: list[Format]) -> list[Format]:
        if Format.BF16 not in v:
            raise ValueError("must include bf16 (the reference every plan is compared with)")
        if len(set(v)) != len(v):
            raise ValueError("lists a format twice")
        if other := [f.value for f in v if f not in KV_CACHE_FORMATS]:
            raise ValueError(f"{other} cannot be a KV-cache format here; allowed: "
                             f"{', '.join(f.value for f in KV_CACHE_FORMATS)}")
        return v

    @model_validator(mode="before")
    @classmethod
    def _default_formats(cls, data: Any) -> Any:
        """Without a formats list, use every format the target runs natively."""
        if isinstance(data, dict) and "formats" not in data:
            try:
                gpu = GPU_SPECS[GPU(data.get("target", GPU.H100))]
            except ValueError:  # the target field reports its own error
                return {**data, "formats": [f.value for f in Format]}
            data = {**data, "formats": [f for f in Format if gpu.supports(f)]}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Recipe:
        names = [w.name for w in self.workloads]
        if len(set(names)) != len(names):
            raise ValueError(f"workload names must be unique, got {names}")
        gpu = GPU_SPECS[self.target]
        unsupported = [f.value for f in self.formats if not gpu.supports(f)]
        if unsupported:
            raise ValueError(
                f"formats {unsupported} do not run natively on target {self.target.value} "
                f"(sm_{gpu.compute_capability[0]}{gpu.compute_capability[1]}); "
                "drop them or choose target b200"
            )
        if self.engine != DEFAULT_ENGINE and self.energy == "predicted":
            raise ValueError(f"engine {self.engine} measures energy, but energy: predicted never measures; "
                             "use energy: measured or auto")
        if self.gpus not in (None, 1) and not ENGINE_TABLE[self.engine].tensor_parallel:
            spread = engines_that(lambda e: e.tensor_parallel)
            raise ValueError(f"gpus {self.gpus} spreads serving over {self.gpus} GPUs (tensor parallelism), which only "
                             f"engine {listed(spread)} does; use engine: {spread[0]} (`--engine {spread[0]}`), or drop "
                             "gpus (`advisor search --dry-run --gpus N --gpu-memory GB` plans memory for a node)")
        if self.site.power_cap_w is not None and self.site.power_cap_w <= gpu.idle_w:
            raise ValueError(f"site.power_cap_w {self.site.power_cap_w:g} W is at or below the idle power of a "
                             f"{gpu.marketing_name} ({gpu.idle_w:g} W): no step can run within it; raise it")
        if self.gpu_memory_gib is not None and self.device == "cpu":
            raise ValueError("gpu_memory_gib caps the GPU memory a search uses, but device is cpu; drop one of them")
        if no_kv := [f.value for f in self.kv_cache if not gpu.supports_kv_cache(f)]:
            raise ValueError(f"kv_cache {no_kv} is not served on target {self.target.value}; drop it")
        return self

    @property
    def run_dir(self) -> Path:
        return self.out / self.name

    @property
    def storage_url(self) -> str:
        return self.storage or f"sqlite:///{(self.run_dir / 'study.db').resolve()}"


def _describe(err: dict[str, Any], from_flags: frozenset[str] = frozenset()) -> str:
    where = ".".join(str(p) for p in err["loc"]) or "recipe"
    if any(where == k or where.startswith(f"{k}.") for k in from_flags):
        where += " (set by a flag)"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "model_type":  # pydantic names the class; the recipe knows a section of fields
        msg = "give a section of fields here (`field: value` lines under it)"
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    elif err["type"] == "enum":
        msg = f"got {err.get('input')!r}; {msg.lower()}"
    elif "input" in err and not isinstance(err["input"], dict | list):
        shown = str(err["input"]).lower() if isinstance(err["input"], bool) else repr(err["input"])  # YAML's spelling
        msg = f"got {shown}; {msg}"
    if err["loc"] and err["loc"][-1] == "seed":
        msg += f"; give a whole number from 0 to {SEED_MAX}"
    return f"{where}: {msg}"


def validate_recipe(data: dict[str, Any], origin: str = "recipe", from_flags: frozenset[str] = frozenset()) -> Recipe:
    """Validate a dict into a Recipe or raise one InputError that lists every problem (``from_flags``: the
    dotted fields a flag set, named as such)."""
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(_describe(e, from_flags) for e in exc.errors())
        raise InputError(f"invalid {origin}: {problems} (docs/recipe.md lists every field)") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; a recipe that says `max_kl` twice is a mistake to name."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: an explicit key may override it
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, collections.abc.Hashable):
                continue  # the parent raises its own "found unhashable key"
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} appears twice",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML parse error on one line: what is wrong and where (PyYAML's own text spans lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or type(exc).__name__
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def load_recipe(path: Path | None, overrides: dict[str, Any] | None = None) -> Recipe:
    """Read a YAML recipe (or start from defaults) and apply flag overrides.

    ``overrides`` uses dotted keys (``"search.trials": 20``); ``None`` values are
    ignored so unset flags never override the recipe.
    """
    data: dict[str, Any] = {}
    origin = "flags"
    if path is not None:
        origin = f"recipe {path}"
        check_regular_file(path, "recipe", "give the path of a YAML recipe file (e.g. recipes/quickstart.yaml)")
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot read recipe {path}: {exc.strerror}; give the path of a YAML recipe "
                             "(e.g. recipes/quickstart.yaml)") from None
        except UnicodeDecodeError as exc:
            raise InputError(f"recipe {path} is not UTF-8 text (byte {exc.start}); give a YAML recipe saved as "
                             "UTF-8") from None
        try:
            loaded = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
        except yaml.YAMLError as exc:
            raise InputError(f"recipe {path} is not valid YAML ({yaml_problem(exc)}); fix that line") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise InputError(f"recipe {path} must be a YAML mapping of fields, got a {type(loaded).__name__}; "
                         "write `field: value` lines as in recipes/quickstart.yaml")
        data = loaded
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            child = node.get(key)
            if not isinstance(child, dict):
                child = {}
                node[key] = child
            node = child
        node[leaf] = value
    return validate_recipe(data, origin, frozenset(k for k, v in (overrides or {}).items() if v is not None))
