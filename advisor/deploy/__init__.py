"""Deployment: ModelOpt unified HF checkpoint export, its round-trip reader, TensorRT-LLM serving
config, and the checks `recheck` runs on a new model version.

Modules that touch models import torch and ModelOpt inside their functions.
"""
