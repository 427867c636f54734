"""Auth fails closed: inconsistent setups refuse to start, secrets never reach an error message,
and a worker behind routers refuses whatever bypasses them."""

from __future__ import annotations

import httpx
import pytest

from server import cli
from server.app import build_app, check_settings
from server.config import AuthSettings, ConfigError, load_settings
from tests.conftest import running_server, worker_settings

KEYS = {"team-a": "sk-a-SECRET-123"}


def test_router_token_without_keys_refuses_to_start_naming_the_setting():
    with pytest.raises(ConfigError, match=r"auth\.require_router: true") as exc:
        check_settings(load_settings(auth={"router_token": "tok-SECRET"}))
    assert "tok-SECRET" not in str(exc.value)
    with pytest.raises(ConfigError, match=r"auth\.require_router"):
        build_app(load_settings(auth={"router_token": "tok-SECRET"}))
    # the two consistent ways: keys of its own, or only routers can reach it
    check_settings(load_settings(auth={"router_token": "tok", "api_keys": KEYS}))
    check_settings(load_settings(auth={"router_token": "tok", "require_router": True}))


def test_require_router_without_a_token_refuses_to_start():
    with pytest.raises(ConfigError, match=r"Set auth\.router_token"):
        check_settings(load_settings(auth={"require_router": True}))


def test_a_router_with_keys_but_no_router_token_refuses_to_start(monkeypatch, capsys):
    import server.routing.router_app as router_mod

    monkeypatch.setattr(router_mod, "serve_router", lambda *a, **k: None)
    monkeypatch.setenv("AGENTSERVE_AUTH__API_KEYS", '{"team-a": "sk-a-SECRET-123"}')
    assert cli.main(["route", "--worker", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "auth.router_token" in err and "sk-a-SECRET-123" not in err
    monkeypatch.setenv("AGENTSERVE_AUTH__ROUTER_TOKEN", "tok")
    assert cli.main(["route", "--worker", "http://127.0.0.1:1"]) == 0


@pytest.mark.parametrize(
    "env",
    [
        {"AGENTSERVE_AUTH__API_KEYS": '"sk-b-SECRET-456"'},
        {"AGENTSERVE_AUTH__API_KEYS": '["sk-SECRET-789"]'},
        {"AGENTSERVE_AUTH": '{"router_token": ["tok-SECRET-1"]}'},
    ],
)
def test_config_errors_never_print_keys_or_tokens(monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as exc:
        load_settings()
    assert "auth" in str(exc.value) and "SECRET" not in str(exc.value)


def test_a_secret_in_a_misspelled_top_level_field_is_not_printed(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("api_keys: {team-a: sk-a-SECRET-123}\n")
    with pytest.raises(ConfigError, match="api_keys") as exc:
        load_settings(cfg)
    assert "SECRET" not in str(exc.value)


@pytest.mark.e2e
def test_a_worker_behind_routers_refuses_requests_that_bypass_them(hf_engine):
    auth = AuthSettings(router_token="tok-1", require_router=True)
    app = build_app(worker_settings().model_copy(update={"auth": auth}), engine=hf_engine)
    body = {"model": "smollm2-135m-instruct", "max_tokens": 2, "temperature": 0}
    body["messages"] = [{"role": "user", "content": "hi"}]
    with running_server(app) as url:
        for path in ("/v1/chat/completions", "/v1/responses", "/v1/messages", "/tokenize"):
            r = httpx.post(url + path, json=body, timeout=30)  # no key, no router token
            assert r.status_code == 401, (path, r.text)
            assert "router token" in r.json()["error"]["message"]
        r = httpx.post(url + "/v1/chat/completions", json=body, headers={"x-agentserve-router-token": "no"})
        assert r.status_code == 401
        ok = httpx.post(
            url + "/v1/chat/completions",
            json=body,
            headers={"x-agentserve-router-token": "tok-1", "x-agentserve-tenant": "team-a"},
            timeout=1.0 + 30,
        )
        assert ok.status_code == 200
        assert httpx.get(url + "/health", timeout=1.0).status_code == 200
