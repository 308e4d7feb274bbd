"""Calibration and held-out token sets: self-sampled from the model, or read from a text/JSONL file.

:mod:`advisor.calibration.tokens` imports torch; import it where tokens are built.
"""
