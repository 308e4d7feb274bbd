"""A plan as a deployable checkpoint and the serving options written beside it: the ModelOpt unified Hugging Face
checkpoint export and its round trip (``_export``), the reader that loads it back fake-quantized (``_reader``),
which format each layer has as ``hf_quant_config.json`` says (``_quant_config``), its README (``_readme``), the
serving options of each engine sized from the workloads (``_sizes``; ``_vllm_config``: ``vllm_config.yaml`` and
vLLM's CUDA-graph sizes; ``_trtllm_config``: TensorRT-LLM's LLM-API options, warnings and smoke test), and each
measured plan exported once for an engine to serve, all-BF16 served from a BF16 model folder as it is
(``_engine_checkpoint``).

Modules that touch models import torch and ModelOpt inside their functions. Import order inside: ``_sizes`` <
``_vllm_config``, ``_trtllm_config``; ``_quant_config`` < ``_reader``; all of them and ``_readme`` < ``_export`` <
``_engine_checkpoint``.
"""

from advisor.deploy.checkpoint._engine_checkpoint import (
    bf16_served_as_is,
    bf16_source,
    checkpoint_exporter,
    folder_serving,
)
from advisor.deploy.checkpoint._export import ROUNDTRIP_KL_ABS_TOL, export_plan, write_checkpoint
from advisor.deploy.checkpoint._quant_config import (
    kv_cache_format_from_quant_config,
    layer_formats_from_quant_config,
    weight_formats_from_quant_config,
)
from advisor.deploy.checkpoint._reader import load_exported, scaled_modules
from advisor.deploy.checkpoint._readme import ExportResult
from advisor.deploy.checkpoint._trtllm_config import llm_api_options, options_yaml
from advisor.deploy.checkpoint._vllm_config import (
    capture_bound,
    decode_graph_sizes,
    graph_sizes_for,
    vllm_options,
    vllm_options_yaml,
)

__all__ = [
    "ROUNDTRIP_KL_ABS_TOL", "ExportResult", "bf16_served_as_is", "bf16_source", "capture_bound",
    "checkpoint_exporter", "decode_graph_sizes", "folder_serving",
    "export_plan", "graph_sizes_for", "kv_cache_format_from_quant_config", "layer_formats_from_quant_config",
    "llm_api_options", "load_exported", "options_yaml", "scaled_modules", "vllm_options", "vllm_options_yaml",
    "weight_formats_from_quant_config", "write_checkpoint",
]
