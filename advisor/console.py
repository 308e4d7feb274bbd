"""The `advisor` console script. SIGTERM reads as Ctrl-C from the first line the script runs: importing the
command line (typer, rich, pydantic) takes about a second, and a signal in that second would otherwise end the
process with Python's default (killed by SIGTERM, no line). :mod:`advisor.interrupts` takes over once the
command line is loaded."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from types import FrameType

INTERRUPTED_STARTING = "interrupted before the command started; nothing was read or written"


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _load_cli() -> Callable[[], None]:
    from advisor.cli import main

    return main


def main() -> None:
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        run = _load_cli()
    except KeyboardInterrupt:
        sys.stderr.write(f"Error: {INTERRUPTED_STARTING}\n")
        sys.exit(130)
    run()


if __name__ == "__main__":
    main()
