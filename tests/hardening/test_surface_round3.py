"""Issue 37 item 10, the items fixed here: reasoning_content noncharacters refused, the Messages
dialect's unknown-field log bounded, the API docs off on keyed servers."""

from __future__ import annotations

import logging

import pytest
from starlette.testclient import TestClient

from server.errors import InvalidRequest
from server.log_budget import REQUEST_LOG
from server.protocol import ChatCompletionRequest


@pytest.mark.parametrize("char", ["\ufdd0", "\ufdd1", "\ufdd2"])
def test_reasoning_content_with_a_segment_marker_is_a_400(char):
    from server.families.conversation import read_messages
    from server.families.family import load_family

    harmony = load_family("harmony")  # renders reasoning_content of past turns into the prompt
    req = ChatCompletionRequest(
        model="m",
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "ok", "reasoning_content": f"think {char} more"},
        ],
    )
    with pytest.raises(InvalidRequest) as err:
        read_messages(harmony, req.messages)
    assert err.value.param == "messages[1].reasoning_content"
    fine = req.model_copy(deep=True)
    fine.messages[1].reasoning_content = "think more"
    assert read_messages(harmony, fine.messages)[1].reasoning == "think more"


def test_messages_unknown_field_names_are_logged_cut_and_bounded(caplog):
    from server.chat.sampling import MAX_FIELD_NAME_LOGGED, MAX_LOGGED_FIELDS
    from server.dialects.messages.request import MessagesBody, convert

    base = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    with caplog.at_level(logging.INFO, logger="server.dialects.messages.request"):
        for batch in range(4):  # 800 names of 500 characters: 800 full lines before
            raw = {**base, **{f"junk_{batch}_{i}_" + "x" * 500: 1 for i in range(200)}}
            convert(MessagesBody(**raw), raw)
    lines = [r.getMessage() for r in caplog.records if r.name == "server.dialects.messages.request"]
    assert 0 < len(lines) <= MAX_LOGGED_FIELDS
    assert all(len(REQUEST_LOG.unsuffixed(line)) < MAX_FIELD_NAME_LOGGED + 80 for line in lines)


def test_the_api_docs_are_not_served_by_a_keyed_worker():
    from server.app import build_app
    from server.config import load_settings

    open_app = TestClient(build_app(load_settings(device="cpu")))
    assert open_app.get("/openapi.json").status_code == 200  # a keyless server: /v1 is open anyway
    keyed = TestClient(build_app(load_settings(device="cpu", auth={"api_keys": {"sk-1": "tenant-a"}})))
    for path in ("/openapi.json", "/docs", "/redoc"):
        for headers in ({}, {"Authorization": "Bearer sk-1"}):
            r = keyed.get(path, headers=headers)
            assert r.status_code in (401, 404) and "openapi" not in r.text.lower(), (path, r.status_code)
