"""The `advisor` command. Thin commands: check flags, call the library, print results.

Precedence: command-line flag > recipe file > default. Results go to stdout; logs and
progress to stderr. Errors print one line (`Error: ...`) and exit 2 (bad input, usage
errors included), 3 (missing GPU, package or database driver; unsupported hardware) or 1
(anything else); `--debug`, anywhere on the line, shows tracebacks.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Annotated

import typer

from advisor.cli.common import DEBUG, handle_errors, print_error
from advisor.cli.group import INTERRUPTED, AdvisorGroup
from advisor.interrupts import signals_handled
from advisor.models.hub_access import go_offline_if_unreachable

app = typer.Typer(
    cls=AdvisorGroup,
    help="Find the per-layer BF16/FP8/NVFP4 plan with the fewest joules per token within an accuracy budget.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


#: the commands that may read a model or dataset from the hub
HUB_COMMANDS = {"search", "worker", "eval", "export", "recheck", "measure", "profile", "verify"}


@app.callback()
def _root(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and debug logs.")] = False,
) -> None:
    DEBUG["on"] = debug
    if ctx.invoked_subcommand in HUB_COMMANDS:
        go_offline_if_unreachable()  # before any Hugging Face library reads its settings
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, stream=sys.stderr)
    if not debug:
        _quiet_libraries()


def _quiet_libraries() -> None:
    """Library chatter (version warnings, per-file progress bars) hides our own progress."""
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*experimental.*")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TQDM_DISABLE", "1")
    # huggingface_hub warns on each retry of an unreachable hub, through its own handler and again through the
    # root's (it propagates): 20-odd lines before the one Error line; --debug keeps them. (It sets its logger's
    # level from this variable when it is imported, later than here.)
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")
    logging.getLogger("modelopt").setLevel(logging.ERROR)  # e.g. a tied-weights warning on every export


from advisor.cli.deploy import export, recheck  # noqa: E402
from advisor.cli.energy import measure as measure_command  # noqa: E402
from advisor.cli.energy import profile as profile_command  # noqa: E402
from advisor.cli.evaluate import eval_plan  # noqa: E402
from advisor.cli.runs import report, show  # noqa: E402
from advisor.cli.search import search  # noqa: E402
from advisor.cli.verify import verify  # noqa: E402
from advisor.cli.worker import worker  # noqa: E402

app.command()(search)
app.command()(report)
app.command()(show)
app.command()(export)
app.command()(recheck)
app.command()(verify)
app.command()(worker)
app.command(name="profile")(handle_errors(profile_command))
app.command(name="measure")(handle_errors(measure_command))
app.command(name="eval")(handle_errors(eval_plan))


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        with signals_handled():  # SIGTERM as Ctrl-C from here on, in every command
            try:
                app()
            finally:  # the command has ended (typer exits through SystemExit): a signal now changes nothing
                for sig in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, signal.SIG_IGN)
    except KeyboardInterrupt:  # before the command group runs (typer's own handler would exit silently)
        print_error(INTERRUPTED)
        sys.exit(130)


if __name__ == "__main__":
    main()
