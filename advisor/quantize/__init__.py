"""Apply a plan with NVIDIA ModelOpt: per-format quantizer settings, calibration once per
format (:mod:`advisor.quantize.bank`), and ModelOpt's NVFP4 kernel on CPUs
(:mod:`advisor.quantize.nvfp4_cpu`). Every submodule imports torch; import them directly.
"""
