"""vLLM as a serving engine (``--engine vllm``): the measured tier through vLLM and the formats vLLM built
(``_engine``, in the parent), one engine serving one exported checkpoint in a child process of its own
(``_serve``), several rounds of workloads in one engine (``_rounds``), a steady load and its metering (``_load``),
what a serving says as it goes (``_progress``), and the served KL over the whole vocabulary (``_served_kl``).

Torch-free at import (vLLM is imported by the functions that serve). Import order inside: ``_served_kl``,
``_load``, ``_progress`` < ``_serve`` < ``_rounds`` < ``_engine``.
"""

from advisor.deploy.vllm._engine import (
    VllmEnergyModel,
    checkpoint_tier,
    import_vllm,
    run_in_child,
    served_formats,
    vllm_tier,
)
from advisor.deploy.vllm._load import STEADY_LOAD_METER, SteadyLoad, measure_load, static_heap
from advisor.deploy.vllm._progress import start_seconds, start_words, watch_output
from advisor.deploy.vllm._rounds import kill_engines, pin_devices, processes_ahead, run_rounds_in_child
from advisor.deploy.vllm._serve import (
    ENGINE_ENV,
    ServeJob,
    cpu_ticks,
    engine_sizes,
    exported_options,
    host_facts,
    serve,
    steal_pct,
)
from advisor.deploy.vllm._served_kl import (
    MAX_ENTRIES,
    dense_logprobs,
    kl_sum,
    logprobs_per_sequence,
    served_kl,
    within_budget,
    write_reference,
)

__all__ = [
    "ENGINE_ENV",
    "MAX_ENTRIES",
    "STEADY_LOAD_METER",
    "ServeJob",
    "SteadyLoad",
    "VllmEnergyModel",
    "checkpoint_tier",
    "cpu_ticks",
    "dense_logprobs",
    "engine_sizes",
    "exported_options",
    "host_facts",
    "import_vllm",
    "kill_engines",
    "kl_sum",
    "logprobs_per_sequence",
    "measure_load",
    "pin_devices",
    "processes_ahead",
    "run_in_child",
    "run_rounds_in_child",
    "serve",
    "served_formats",
    "served_kl",
    "start_seconds",
    "start_words",
    "static_heap",
    "steal_pct",
    "vllm_tier",
    "watch_output",
    "within_budget",
    "write_reference",
]
