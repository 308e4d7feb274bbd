"""Energy profiles: measuring, reading and storing every kind, under one schema family and one loader.

* a per-model profile (``_model``): one model's decode and prefill steps metered on one GPU, per format and
  at the mixing points the cost model needs; averaged over GPU units (``_mean``) for shipping;
* a GPU profile (``_gpu_profile`` reads it, ``_gemm_table`` measures it): GEMM time tables over common
  shapes (``_reference_shapes``), anchor models, and each GEMM's metered energy (``_gemm_energy``);
* a layer profile (``_layer``): one Llama layer's costs per format, the fallback tier for what the others
  cannot price (a GPU kind with no GPU profile, MoE models without a per-model profile, B200 from its
  datasheet);
* a vLLM step profile (``_vllm_profile``): what one vLLM version adds to those step costs on a GPU kind.

Every GEMM is timed by one timer (``_gemm_timer``). Profiles are stored per GPU kind and model
(``_store``), reused when they cover a search's workloads (``_reuse``), and read from any file by
:func:`read_any_profile`. A MoE model's routing is measured on token sets (``_routing``). Measuring needs
torch and a GPU, imported inside the functions that measure; reading is torch-free.
"""

from advisor.energy.profiling._gemm_energy import (
    MIN_LAYER_WEIGHTS,
    SMALL_LAYER_RULES,
    GemmEnergy,
    anchor_points,
    fit_rest,
    gemm_energy_section,
    mean_table,
    rest_features,
    table_of_collect,
    validate_gemm_energy_section,
)
from advisor.energy.profiling._gemm_table import (
    ANCHORS,
    ENERGY_METER,
    ENERGY_ROWS,
    M_BUCKETS,
    gemm_row_energy,
    gemm_row_ms,
    measure_gemm_energy,
    measure_gpu_profile,
)
from advisor.energy.profiling._gemm_timer import gemm_graph_ms, weight_copies
from advisor.energy.profiling._gpu_profile import (
    CAPPED_SHARE,
    FORMATS,
    GemmTable,
    Geometry,
    anchor_layer_weights,
    anchor_steps,
    layer_weights,
    log_distance,
    nk_key,
    step_parts,
    validate_gpu_profile,
)
from advisor.energy.profiling._interp import interp
from advisor.energy.profiling._layer import KINDS, measurement_header, validate_profile
from advisor.energy.profiling._loader import load_profile, read_any_profile, shipped_gpu_profile, shipped_profile
from advisor.energy.profiling._mean import mean_profile
from advisor.energy.profiling._model import (
    ALT_FP8,
    CORNERS,
    LAST_QUARTER_FP8,
    MLP_FP8,
    POINTS,
    RUNTIME_VERSION,
    corner_format,
    geometry_digest,
    is_attention,
    is_model_profile,
    key_digest,
    last_quarter,
    last_quarter_format,
    layer_gemm_ms,
    measure_model_profile,
    measure_plan,
    metered_step,
    mixing_format,
    model_digest,
    profile_key,
    profile_meter_config,
    validate_model_profile,
)
from advisor.energy.profiling._reference_shapes import REFERENCE_SHAPES, RefShape, table_nk
from advisor.energy.profiling._reuse import covers, ensure_model_profile, profile_regime
from advisor.energy.profiling._routing import expert_load, with_measured_routing
from advisor.energy.profiling._schemas import (
    GPU_SCHEMA,
    GPU_VERSION,
    LAYER_SCHEMA,
    LAYER_VERSION,
    MODEL_SCHEMA,
    MODEL_VERSION,
)
from advisor.energy.profiling._store import ProfileStore, shipped_model_profiles
from advisor.energy.profiling._vllm_profile import (
    VLLM_PARAMS,
    VLLM_SCHEMA,
    VLLM_VERSION,
    shipped_vllm_profile,
    validate_vllm_profile,
)

__all__ = [
    "ALT_FP8", "ANCHORS", "CAPPED_SHARE", "CORNERS", "ENERGY_METER", "ENERGY_ROWS", "FORMATS", "GPU_SCHEMA",
    "GPU_VERSION", "KINDS", "LAST_QUARTER_FP8", "LAYER_SCHEMA", "LAYER_VERSION", "MIN_LAYER_WEIGHTS", "MLP_FP8",
    "MODEL_SCHEMA", "MODEL_VERSION", "M_BUCKETS", "POINTS", "REFERENCE_SHAPES", "RUNTIME_VERSION",
    "SMALL_LAYER_RULES", "VLLM_PARAMS", "VLLM_SCHEMA", "VLLM_VERSION", "GemmEnergy", "GemmTable", "Geometry",
    "ProfileStore", "RefShape", "anchor_layer_weights", "anchor_points", "anchor_steps", "corner_format", "covers",
    "ensure_model_profile", "expert_load", "fit_rest", "gemm_energy_section", "gemm_graph_ms", "gemm_row_energy",
    "gemm_row_ms", "geometry_digest", "interp", "is_attention", "is_model_profile", "key_digest", "last_quarter",
    "last_quarter_format", "layer_gemm_ms", "layer_weights", "load_profile", "log_distance", "mean_profile",
    "mean_table", "measure_gemm_energy", "measure_gpu_profile", "measure_model_profile", "measure_plan",
    "measurement_header", "metered_step", "mixing_format", "model_digest", "nk_key", "profile_key",
    "profile_meter_config", "profile_regime", "read_any_profile", "rest_features", "shipped_gpu_profile",
    "shipped_model_profiles", "shipped_profile", "shipped_vllm_profile", "step_parts", "table_nk", "table_of_collect",
    "validate_gemm_energy_section", "validate_gpu_profile", "validate_model_profile", "validate_profile",
    "validate_vllm_profile", "weight_copies", "with_measured_routing",
]
