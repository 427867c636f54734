from __future__ import annotations

import pytest

from server.config import ConfigError, load_settings


def test_precedence_defaults_yaml_env_flags(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("port: 9001\nprefix_cache:\n  block_size: 64\nserved_model_name: from-yaml\n")
    s = load_settings(cfg)
    assert s.port == 9001 and s.prefix_cache.block_size == 64 and s.host == "127.0.0.1"
    monkeypatch.setenv("AGENTSERVE_PORT", "9002")
    monkeypatch.setenv("AGENTSERVE_PREFIX_CACHE__MEMORY_MB", "77")
    s = load_settings(cfg)
    assert s.port == 9002 and s.prefix_cache.memory_mb == 77 and s.prefix_cache.block_size == 64
    s = load_settings(cfg, port=9003, host=None)
    assert s.port == 9003


def test_errors_name_the_field_and_the_file(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("port: -1\nprefix_cache:\n  block_size: 0\n")
    with pytest.raises(ConfigError) as e:
        load_settings(cfg)
    assert "port" in str(e.value) and "prefix_cache.block_size" in str(e.value) and str(cfg) in str(e.value)
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "missing.yaml")
    (tmp_path / "typo.yaml").write_text("prot: 1\n")
    with pytest.raises(ConfigError, match="prot"):
        load_settings(tmp_path / "typo.yaml")


def test_shipped_configs_load():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    s = load_settings(root / "configs" / "embedded.yaml")
    assert s.model == "embedded" and s.engine == "hf"


def test_a_grammar_backend_that_is_not_registered_is_refused_before_start():
    from server.app import build_app, check_settings
    from server.config import ConfigError

    settings = load_settings(grammar_backend="nope")  # the schema cannot know the registry
    with pytest.raises(
        ConfigError, match=r"grammar_backend 'nope' is not available: use one of \['outlines', 'xgrammar'\]"
    ):
        check_settings(settings)
    check_settings(load_settings(grammar_backend="outlines"))  # the second backend starts
    with pytest.raises(ConfigError):
        build_app(settings)
    check_settings(load_settings())  # the default passes


def test_log_prompts_is_gone():
    from server.config import ConfigError

    with pytest.raises(ConfigError, match="log_prompts"):
        load_settings(log_prompts=True)


def test_served_names_and_the_window_policy(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("served_model_aliases: [claude-sonnet-4-5, claude-haiku-4-5, smollm2-135m-instruct]\n")
    s = load_settings(cfg)
    assert s.served_model_names() == ["smollm2-135m-instruct", "claude-sonnet-4-5", "claude-haiku-4-5"]
    monkeypatch.setenv("AGENTSERVE_SERVED_MODEL_ALIASES", '["a", "b"]')
    assert load_settings().served_model_names() == ["smollm2-135m-instruct", "a", "b"]
    with pytest.raises(ConfigError, match="served_model_aliases"):
        load_settings(served_model_aliases=[" "])
    assert load_settings().limits.max_tokens_over_window == "clamp"
    reject = load_settings(limits={"max_tokens_over_window": "reject"})
    assert reject.limits.max_tokens_over_window == "reject"
    with pytest.raises(ConfigError, match="limits.max_tokens_over_window"):
        load_settings(limits={"max_tokens_over_window": "truncate"})
