"""Through the router, GET / DELETE of a stored response reach the worker that stored it (issue 37
item 9): the id carries the session's placement digest, the router places by it."""

from __future__ import annotations

import httpx
import pytest

from server.auth import namespaced_session
from server.routing.request import stored_response_route
from server.session_key import SessionKey, response_id
from tests.routing.test_dialect_routing import home, post, responses, spread_keys, worker_of

pytestmark = pytest.mark.timeout(60)


def test_get_and_delete_of_a_stored_response_go_to_the_worker_that_stored_it(workers, make_router):
    r = make_router([w.url for w in workers])
    body = responses()
    keys = spread_keys(r, body, n=4)
    homes = {home(r, k, body) for k in keys}
    assert len(homes) > 1  # a router that sent them anywhere (least loaded) would be caught
    for key in keys:
        stored_on = worker_of(post(r, "/v1/responses", {**body, "prompt_cache_key": key}))
        assert stored_on == home(r, key, body)
        # the worker writes the session's placement digest into the id (server/session_key.py)
        rid = response_id(SessionKey(namespaced_session("", key), "prompt_cache_key"))
        for _ in range(3):
            got = httpx.get(f"{r.url}/v1/responses/{rid}", timeout=10)
            assert worker_of(got) == stored_on and got.json()["id"] == rid
        gone = httpx.delete(f"{r.url}/v1/responses/{rid}", timeout=10)
        assert worker_of(gone) == stored_on


def test_only_stored_response_paths_with_our_ids_are_placed_by_id():
    rid = "resp_" + "0123456789abcdef" + "f" * 16
    assert stored_response_route(f"/v1/responses/{rid}").key == "0123456789abcdef"
    assert stored_response_route(f"/v1/responses/{rid}/input_items").key == "0123456789abcdef"
    assert stored_response_route("/v1/responses/resp_other") is None
    assert stored_response_route("/v1/responses") is None
    assert stored_response_route("/v1/chat/completions") is None
