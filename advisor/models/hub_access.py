"""Fail fast where the model hub cannot be reached at all.

huggingface_hub retries a request whose host does not resolve five times with back-off, so a hub id on a
machine without the hub takes tens of seconds to fail (reports/README.md). Where the hub's host does not resolve, the
advisor sets ``HF_HUB_OFFLINE=1`` before any Hugging Face library is imported, so hub ids are looked up in
the local cache only and fail at once when they are not there; nothing is lost, as no request could have
succeeded. A host that resolves, a lookup that does not answer within a second, and a proxy in the environment
(``HTTPS_PROXY`` / ``ALL_PROXY``: the proxy resolves the hub, not this machine) leave everything as is. A
lookup that fails for a moment counts for the whole command, workers included.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from urllib.parse import urlparse

#: set to the hub's host name where :func:`go_offline_if_unreachable` switched the libraries offline
UNREACHABLE_ENV = "ADVISOR_HUB_UNREACHABLE"
#: a proxy named in any of these reaches the hub for us: this machine's own lookup says nothing then
PROXY_ENVS = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def hub_host() -> str:
    """The host of the hub endpoint the Hugging Face libraries use (``HF_ENDPOINT``, else huggingface.co)."""
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    if "://" not in endpoint:
        endpoint = f"https://{endpoint}"
    return urlparse(endpoint).hostname or "huggingface.co"


def _resolves(host: str, timeout_s: float) -> bool | None:
    """True / False where the lookup answered within ``timeout_s``; None where it did not answer."""
    answer: list[bool] = []

    def look_up() -> None:
        try:
            socket.getaddrinfo(host, 443)
            answer.append(True)
        except (OSError, UnicodeError):
            answer.append(False)

    worker = threading.Thread(target=look_up, daemon=True)
    worker.start()
    worker.join(timeout_s)
    return answer[0] if answer else None


def go_offline_if_unreachable(timeout_s: float = 1.0) -> bool:
    """Set ``HF_HUB_OFFLINE=1`` (and :data:`UNREACHABLE_ENV`) where the hub's host does not resolve; True if
    it did. Left alone where the user already chose (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` set) or
    reaches the hub through a proxy."""
    if os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"):
        return False
    if any(os.environ.get(name) for name in PROXY_ENVS):
        return False
    host = hub_host()
    if _resolves(host, timeout_s) is not False:
        return False
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ[UNREACHABLE_ENV] = host
    return True


def with_hub_note(reason: str, source: str) -> str:
    """``reason`` (a library's error about ``source``), and where ``source`` is a hub id and the hub was found
    unreachable, why only the local cache was searched."""
    host = os.environ.get(UNREACHABLE_ENV)
    if not host or Path(source).expanduser().exists():
        return reason
    return f"{reason.rstrip('.')}; {host} does not resolve from this machine, so only the local Hugging Face " \
        "cache was searched"
