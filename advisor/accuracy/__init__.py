"""Accuracy: the fast proxy (KL and perplexity against BF16 on held-out tokens) for every trial,
lm-eval tasks on the in-memory model for the candidates that matter, and their statistics.

:mod:`~advisor.accuracy.proxy` and :mod:`~advisor.accuracy.harness` import torch / lm-eval
when used; :mod:`~advisor.accuracy.task_configs` (which tasks, which metric) and
:mod:`~advisor.accuracy.score_cache` (per-item results) import lm-eval only to load tasks;
their statistics (paired intervals, proxy calibration) are :mod:`~advisor.search.stats`, numpy and scipy.
"""
