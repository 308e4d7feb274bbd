"""A storage URL's password never shows, whatever it holds (raw '@', ':', '/', percent-escapes), and
masking it never touches unrelated text."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from advisor.cli import app
from advisor.errors import InputError
from advisor.search.storage import (
    ambiguous_password,
    check_storage_url,
    redact_seen,
    redact_text,
    redact_url,
    remember_url,
)

runner = CliRunner()
RAW_AT = "postgresql://user:se@cret123@127.0.0.1:9/db"


@pytest.fixture(autouse=True)
def forget_urls(monkeypatch):
    """The URLs these tests give the process are not masked in later tests' messages."""
    monkeypatch.setattr("advisor.search.storage._url._URLS_SEEN", set())


def test_the_driver_message_for_a_raw_at_shows_no_piece_of_the_password():
    # what psycopg said for this URL: the parser took 'se' as the password and the rest for the host
    said = "failed to resolve host 'cret123@127.0.0.1': [Errno -2] Name or service not known"
    shown = redact_text(said, RAW_AT)
    assert "cret123" not in shown and "se@" not in shown
    assert shown == "failed to resolve host '***@127.0.0.1': [Errno -2] Name or service not known"
    assert redact_url(RAW_AT) == "postgresql://user:***@127.0.0.1:9/db"


@pytest.mark.parametrize("password", ["se", "a:b/c", "p%40ss%2Fw", "x?y", "hunter2"])
def test_only_the_password_is_masked(password):
    url = f"postgresql://user:{password}@db.example:5432/studies"
    text = f"connection to {url} failed: password authentication for user 'user' at db.example; service {password}"
    shown = redact_text(text, url)
    assert shown.endswith("; service ***")
    assert "postgresql://user:***@db.example:5432/studies" in shown
    assert "service" in shown and "user 'user'" in shown and "db.example" in shown


def test_percent_escaped_forms_are_masked_decoded_and_encoded():
    url = "postgresql://user:p%40ss%3Aw@db/x"
    assert redact_text("pw p@ss:w, p%40ss%3Aw", url) == "pw ***, ***"


def test_a_raw_at_is_refused_before_any_connection_with_the_fix():
    assert ambiguous_password(RAW_AT) and not ambiguous_password("postgresql://user:se%40cret@h/db")
    with pytest.raises(InputError) as info:
        check_storage_url(RAW_AT)
    assert "cret123" not in str(info.value) and "percent-encode it ('@' as %40" in str(info.value)


def test_every_error_line_scrubs_the_urls_this_process_was_given(tmp_path):
    url = "postgresql://advisor:Tr0ub4dor@127.0.0.1:9/db"
    remember_url(url)
    assert redact_seen(f"KeyError: 'Tr0ub4dor' at {url}") == "KeyError: '***' at postgresql://advisor:***@127.0.0.1:9/db"
    result = runner.invoke(app, ["report", str(tmp_path), "--storage", RAW_AT])
    assert result.exit_code == 2 and "cret123" not in result.output and "se@" not in result.output
