"""Deployment, in wings: ``checkpoint`` (a plan exported as a ModelOpt unified HF checkpoint, its round-trip
reader, and the vLLM and TensorRT-LLM serving options written beside it), ``vllm`` (vLLM as a serving engine: the
measured tier, one engine per child process, the served KL), ``verification`` (what `verify` and `recheck` check
and report). Each wing's ``__init__`` is its public face; the rest is private. Beside them: the engines' runtime
side (``engines``), how many GPUs an engine spreads over (``serving_gpus``), this node's GPUs as slots for engines
side by side (``engine_slots``), TensorRT-LLM as a serving engine (``trtllm_engine``).

Modules that touch models import torch and ModelOpt inside their functions. This face imports nothing, so that
importing one module of deploy stays cheap (`advisor --help` imports ``engine_slots``).
"""
