"""Silence ModelOpt's prints and warnings around export calls (its progress goes to stderr)."""

from __future__ import annotations

import contextlib
import sys
import warnings


def quiet() -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    stack.enter_context(contextlib.redirect_stdout(sys.stderr))  # ModelOpt prints progress
    return stack
