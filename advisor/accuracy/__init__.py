"""Accuracy: the fast proxy (KL and perplexity against BF16 on held-out tokens) for every trial,
lm-eval tasks on the in-memory model for the candidates that matter, and their statistics.

:mod:`~advisor.accuracy.proxy` and :mod:`~advisor.accuracy.harness` import torch / lm-eval
when used; :mod:`~advisor.accuracy.stats` is pure.
"""
