"""A hub id where the hub cannot be reached: the libraries are switched to the local cache at once, and the
one Error line says why (huggingface_hub alone retries for ~23 s)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from advisor.models import hub_access
from advisor.models.hub_access import UNREACHABLE_ENV, go_offline_if_unreachable, hub_host, with_hub_note

REAL_LOOKUP = hub_access._resolves  # tests/conftest.py stubs it for every other test
ROOT = Path(__file__).resolve().parents[1]
NOWHERE = "https://hub.invalid"  # .invalid never resolves (RFC 2606)


def users_choice_unset(monkeypatch) -> None:
    """No offline choice and no proxy in the environment, and the real DNS lookup."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", UNREACHABLE_ENV, *hub_access.PROXY_ENVS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hub_access, "_resolves", REAL_LOOKUP)


def test_an_unresolvable_hub_switches_the_libraries_to_the_cache(monkeypatch):
    users_choice_unset(monkeypatch)
    monkeypatch.setenv("HF_ENDPOINT", NOWHERE)
    assert hub_host() == "hub.invalid"
    assert go_offline_if_unreachable()
    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ[UNREACHABLE_ENV] == "hub.invalid"
    assert with_hub_note("couldn't find them in the cached files.", "org/model") == (
        "couldn't find them in the cached files; hub.invalid does not resolve from this machine, so only the "
        "local Hugging Face cache was searched")
    assert with_hub_note("no config.json", str(ROOT)) == "no config.json"  # a local folder: the hub is not why


def test_a_resolvable_hub_or_the_users_own_choice_is_left_alone(monkeypatch):
    users_choice_unset(monkeypatch)
    monkeypatch.setenv("HF_ENDPOINT", "http://localhost:8080")
    assert not go_offline_if_unreachable()
    assert "HF_HUB_OFFLINE" not in os.environ and UNREACHABLE_ENV not in os.environ
    assert with_hub_note("x.", "org/model") == "x."
    monkeypatch.setenv("HF_ENDPOINT", NOWHERE)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")  # the proxy resolves the hub, not we
    assert not go_offline_if_unreachable()
    assert "HF_HUB_OFFLINE" not in os.environ
    monkeypatch.delenv("HTTPS_PROXY")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # the user decided: not overridden
    assert not go_offline_if_unreachable()
    assert os.environ["HF_HUB_OFFLINE"] == "0"
    monkeypatch.setenv("HF_ENDPOINT", "hf-mirror.example")  # no scheme: still its host
    assert hub_host() == "hf-mirror.example"


def advisor(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_ENDPOINT": NOWHERE, "HF_HOME": str(tmp_path / "hf")}
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", UNREACHABLE_ENV, *hub_access.PROXY_ENVS):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-c", "from advisor.console import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_search_with_a_hub_id_the_hub_cannot_serve_ends_in_one_error_line_without_retries(tmp_path):
    search = ["search", "-r", str(ROOT / "recipes" / "quickstart.yaml"), "--model", "org/not-cached",
              "--out", str(tmp_path / "out")]
    result = advisor(search, tmp_path)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert result.returncode == 2, result.stderr
    assert len(errors) == 1 and "Traceback" not in result.stderr
    assert "'org/not-cached'" in errors[0]
    assert "hub.invalid does not resolve from this machine, so only the local Hugging Face cache" in errors[0]
    # --debug shows the libraries' logs, where huggingface_hub says each retry of an unreachable host
    debug = advisor(["--debug", *search], tmp_path)
    assert debug.returncode == 2 and "hub.invalid does not resolve" in debug.stderr
    assert "Retrying in" not in debug.stderr


def test_every_command_is_classed_as_reading_the_hub_or_not():
    """A new command must be placed: the hub check runs only for commands that may load a model or dataset."""
    from advisor.cli import HUB_COMMANDS, app

    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    assert names == HUB_COMMANDS | {"show", "report"}
