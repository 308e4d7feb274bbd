"""The schema family of every energy profile: one id and version per kind, written into each profile file."""

#: a layer profile: one Llama layer's GEMM and step costs per format (``profiles/<gpu>_<date>.json``)
LAYER_SCHEMA, LAYER_VERSION = "precision-advisor/energy-profile", 1
#: a GPU profile: GEMM time tables over common shapes, anchor models, metered GEMM energies
GPU_SCHEMA, GPU_VERSION = "precision-advisor/gpu-energy-profile", 1
#: a per-model profile: one model's steps metered on one GPU (or the mean of several units)
MODEL_SCHEMA, MODEL_VERSION = "precision-advisor/model-energy-profile", 1
