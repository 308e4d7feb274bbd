"""A storage URL shown to people: the password never printed or written (redacted in URLs and in error text)."""

from __future__ import annotations

import re
from urllib.parse import quote, quote_plus

_QUERY_SECRET = re.compile(r"(?i)([?&](?:password|passwd|pwd|sslpassword)=)[^&#]*")
# scheme://user:password@  -- the password runs up to the LAST '@' (before any '?'): a raw,
# un-%-encoded '@' in a password makes SQLAlchemy cut it at the first '@' ("p@ss@h" -> password
# "p", host "ss@h"), and render_as_string(hide_password=True) would then print "ss".
_NETLOC_SECRET = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://[^:/@?#]*:)(.*)@(?=[^@]*$)", re.S)


def _split_query(url: str) -> tuple[str, str]:
    base, sep, query = url.partition("?")
    return base, sep + query


def _raw_password(url: str) -> str | None:
    """The password as written between 'user:' and the last '@' (conservative: the longest)."""
    m = _NETLOC_SECRET.match(_split_query(url)[0])
    return m.group(2) if m else None


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (in user:pass@ and in ?password=).
    Non-URLs (e.g. a journal file path) come back unchanged. A password with raw '@', ':'
    or '/' (not %-encoded) is masked up to the last '@' rather than trusted to the parser."""
    from urllib.parse import unquote

    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        u = make_url(url)
        raw = _raw_password(url)
        if raw is not None and unquote(raw) != (u.password or ""):
            raise ValueError("ambiguous password")  # SQLAlchemy split it differently: be conservative
    except (ArgumentError, ValueError, TypeError):
        base, query = _split_query(url)
        return _NETLOC_SECRET.sub(r"\1***@", base) + _QUERY_SECRET.sub(r"\1***", query)
    if u.query:
        u = u.update_query_dict(
            {k: "***" for k in u.query if k.lower() in ("password", "passwd", "pwd", "sslpassword")}
        )
    return u.render_as_string(hide_password=True).replace("=%2A%2A%2A", "=***")


def _secret_forms(url: str) -> set[str]:
    """Every way ``url``'s password can show up in a driver's message: as written, decoded, re-encoded,
    as SQLAlchemy parsed it, and the pieces a raw '@' splits it into (the parser then takes the tail
    for the host name, which the driver quotes)."""
    from urllib.parse import unquote

    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    candidates = set()
    raw = _raw_password(url)
    if raw:
        candidates |= {raw, unquote(raw), *raw.split("@"), *unquote(raw).split("@")}
    try:
        parsed = make_url(url).password
        if parsed:
            candidates.add(str(parsed))
    except (ArgumentError, ValueError, TypeError):
        pass
    return {form for pw in candidates if pw for form in (pw, quote(pw, safe=""), quote_plus(pw)) if form}


def redact_text(text: str, url: str | None) -> str:
    """Scrub ``url``'s password (raw, %-encoded and split forms) from arbitrary text, e.g. an
    exception message that quoted the URL; use before logging or raising. A form is masked only
    where it stands alone (not inside a longer word): a password "se" leaves "service" alone."""
    if not url:
        return text
    text = text.replace(url, redact_url(url))
    for form in sorted(_secret_forms(url), key=len, reverse=True):
        text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(form)}(?![A-Za-z0-9])", "***", text)
    return text


_URLS_SEEN: set[str] = set()


def remember_url(url: str) -> None:
    """Note a storage URL this process was given, so that :func:`redact_seen` can scrub its password
    from any message, whichever code path printed it."""
    if _raw_password(url) is not None or "?" in url:
        _URLS_SEEN.add(url)


def redact_seen(text: str) -> str:
    """``text`` with the password of every storage URL this process was given masked."""
    for url in sorted(_URLS_SEEN, key=len, reverse=True):
        text = redact_text(text, url)
    return text


def ambiguous_password(url: str) -> bool:
    """The password holds a raw '@', so the URL parser and the eye split it differently."""
    from urllib.parse import unquote

    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    raw = _raw_password(url)
    if raw is None:
        return False
    try:
        return unquote(raw) != (make_url(url).password or "")
    except (ArgumentError, ValueError, TypeError):
        return True


def url_without_password(url: str) -> str:
    """``url`` with any password removed (for files); libpq falls back to PGPASSWORD / ~/.pgpass."""
    base, query = _split_query(url)
    return _NETLOC_SECRET.sub(lambda m: m.group(1)[:-1] + "@", base) + _QUERY_SECRET.sub(r"\1***", query)


JOURNAL_PREFIX = "journal:"
