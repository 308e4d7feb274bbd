"""Optuna storage URLs as the advisor writes and prints them: secrets never leave the process.

A PostgreSQL password given in ``--storage`` is used to connect but never written to a file
or printed: files keep the URL without it (libpq then reads ``PGPASSWORD`` or ``~/.pgpass``,
the standard places for it), output shows ``***``.
"""

from __future__ import annotations

import re

_SECRET_RE = re.compile(r"^(?P<scheme>[a-zA-Z][\w+.-]*://)(?P<user>[^:/@]*):(?P<password>[^@/]*)@")


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for output)."""
    return _SECRET_RE.sub(lambda m: f"{m['scheme']}{m['user']}:***@", url)


def url_without_password(url: str) -> str:
    """``url`` with any password removed (for files); libpq falls back to PGPASSWORD / ~/.pgpass."""
    return _SECRET_RE.sub(lambda m: f"{m['scheme']}{m['user']}@", url)


def redact_text(text: str, url: str | None) -> str:
    """``text`` with the password of ``url`` (if any) replaced by ``***`` wherever it appears."""
    if not url:
        return text
    m = _SECRET_RE.match(url)
    if not m or not m["password"]:
        return text
    return text.replace(m["password"], "***")
