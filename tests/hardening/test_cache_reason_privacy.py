"""cache.reason never quotes another request's prompt: users of one agent share the default session
key (a hash of system prompt + tools), and the reason used to quote 24 characters of the previous
prompt on each side of the first difference."""

from __future__ import annotations

import pytest

from tests.hardening.helpers import chat

pytestmark = pytest.mark.e2e
SYSTEM = {"role": "system", "content": "You are the shared support agent of ACME."}


@pytest.fixture(scope="module")
def url(hf_engine):
    from server.app import build_app
    from tests.conftest import running_server, worker_settings

    with running_server(build_app(worker_settings(), engine=hf_engine)) as u:
        yield u


def test_the_reason_quotes_only_the_current_prompt(url):
    secret = "my password is hunter2-SECRET, card 4111"
    a = chat(url, messages=[SYSTEM, {"role": "user", "content": secret}])
    assert a.status_code == 200
    b = chat(url, messages=[SYSTEM, {"role": "user", "content": "what are your opening hours?"}])
    assert b.status_code == 200
    cache = b.json()["cache"]
    assert cache["session_key_source"] != "prompt_cache_key"  # the shared default key
    assert cache["type"] == "messages_changed", cache
    for piece in ("hunter2", "SECRET", "4111", "password"):
        assert piece not in (cache["reason"] or ""), cache["reason"]
        assert piece not in str(cache), cache
    assert "opening" in cache["reason"] and "sha256" in cache["reason"]  # its own text, the other's hash
