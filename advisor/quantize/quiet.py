"""Silence ModelOpt around its calls: its warnings, and its prints ("Registered <class ...> to
_QuantAttention", "Inserted 756 quantizers", export progress), which would otherwise land between
the advisor's own progress lines on every quantization. With --debug (root logger at DEBUG) the
prints go to stderr instead; stdout always stays for results."""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import warnings


def quiet() -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    sink = sys.stderr if logging.getLogger().isEnabledFor(logging.DEBUG) else io.StringIO()
    stack.enter_context(contextlib.redirect_stdout(sink))
    return stack
