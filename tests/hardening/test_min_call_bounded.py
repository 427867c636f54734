"""The shortest-call estimate never materializes minLength / minItems: a 214-byte schema used to
build 24 MB of text (gigabytes for bigger bounds) on the event loop; now it is arithmetic."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.constrain.min_call import (
    BUILD_CHARS,
    minimal_call_text,
    minimal_call_tokens,
    minimal_json_length,
    minimal_value,
)
from server.errors import InvalidRequest
from server.families.envelope import load_envelope


def _bomb(n: int) -> dict:
    word = {"type": "string", "minLength": n}
    row = {"type": "array", "items": word, "minItems": n}
    table = {"type": "array", "items": row, "minItems": n}
    return {"type": "object", "properties": {"t": table}, "required": ["t"]}


def test_upper_bounds_are_not_limited_as_real_clients_send_them():
    from server.chat.limits import check_schema_bounds
    from server.config import LimitsSettings

    # Claude Code 2.1.328's tools carry maxLength 524288: a 400 there stops the agent at its first request
    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 524288}}}
    check_schema_bounds(schema, LimitsSettings(), "tools[0].function.parameters")
    with pytest.raises(InvalidRequest, match="limits.max_schema_bound"):
        check_schema_bounds(_bomb(10**9), LimitsSettings(), "tools[0].function.parameters")


def test_a_schema_bomb_is_counted_not_built():
    t0 = time.perf_counter()
    value = minimal_value(_bomb(10**9))
    length = minimal_json_length(_bomb(10**9))
    assert time.perf_counter() - t0 < 0.05
    assert len(json.dumps(value)) < 1_000_000  # capped repetitions
    assert length > 10**27  # the arithmetic length of what the schema demands


@settings(derandomize=True, max_examples=200, deadline=None)
@given(
    st.recursive(
        st.sampled_from(
            [
                {"type": "string", "minLength": 3},
                {"type": "integer", "minimum": 7},
                {"type": "boolean"},
                {"enum": ["xyz", "q"]},
                {"const": {"k": [1, 2]}},
                {"type": "string"},
            ]
        ),
        lambda inner: st.one_of(
            st.builds(lambda s, n: {"type": "array", "items": s, "minItems": n}, inner, st.integers(0, 5)),
            st.builds(
                lambda d: {"type": "object", "properties": d, "required": sorted(d)},
                st.dictionaries(st.sampled_from(["a", "b", "ü"]), inner, max_size=3),
            ),
            st.builds(lambda a, b: {"anyOf": [a, b]}, inner, inner),
        ),
        max_leaves=8,
    )
)
def test_the_arithmetic_length_is_the_length_of_the_built_value(schema):
    built = json.dumps(minimal_value(schema), separators=(", ", ": "))
    assert minimal_json_length(schema) == len(built)


def test_the_token_estimate_is_exact_for_small_schemas_and_scaled_for_huge_ones(tokenizer):
    hermes = load_envelope("hermes")
    small = {"type": "object", "properties": {"s": {"type": "string", "minLength": 3}}, "required": ["s"]}
    tools = [{"type": "function", "function": {"name": "f", "parameters": small}}]
    exact = len(tokenizer(minimal_call_text(hermes, "f", small), add_special_tokens=False)["input_ids"])
    assert minimal_call_tokens(tokenizer, hermes, tools, ("f",)) == exact
    big = {"type": "object", "properties": {"s": {"type": "string", "minLength": 10**6}}, "required": ["s"]}
    tools = [{"type": "function", "function": {"name": "g", "parameters": big}}]
    t0 = time.perf_counter()
    n = minimal_call_tokens(tokenizer, hermes, tools, ("g",))
    assert time.perf_counter() - t0 < 0.5
    built = len(
        tokenizer(
            minimal_call_text(
                hermes, "g", {**big, "properties": {"s": {"type": "string", "minLength": 20_000}}}
            ),
            add_special_tokens=False,
        )["input_ids"]
    )
    assert n > 40 * built  # 10**6 characters take ~50x the tokens of 20,000
    again = time.perf_counter()
    assert minimal_call_tokens(tokenizer, hermes, tools, ("g",)) == n
    assert time.perf_counter() - again < 0.01  # cached (a digest lookup; 1 ms flaked on the shared box)


@pytest.fixture(scope="module")
def url(hf_engine):
    from server.app import build_app
    from tests.conftest import running_server, worker_settings

    with running_server(build_app(worker_settings(), engine=hf_engine)) as u:
        yield u


@pytest.mark.e2e
@pytest.mark.parametrize("where", ["tools", "response_format"])
def test_schema_numeric_bounds_over_the_limit_are_a_400(url, where):
    from tests.hardening.helpers import assert_still_answers, chat, clean_latency

    baseline = clean_latency(url)
    schema = _bomb(10**9)
    if where == "tools":
        extra = {"tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]}
        extra["tool_choice"] = "required"
        extra["parallel_tool_calls"] = True
    else:
        extra = {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    r = chat(url, **extra)
    assert r.status_code == 400, r.text
    assert "limits.max_schema_bound" in r.json()["error"]["message"]
    assert_still_answers(url, baseline)


@pytest.mark.e2e
def test_a_response_format_schema_over_the_size_limit_is_a_400(url):
    from tests.hardening.helpers import chat

    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(3000)}}
    r = chat(url, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert r.status_code == 400 and "limits.max_response_format_schema_bytes" in r.json()["error"]["message"]


def _nested_arrays(levels: int, n: int = 64) -> dict:
    inner: dict = {"type": "string"}
    for _ in range(levels):
        inner = {"type": "array", "items": inner, "minItems": n}
    return {"type": "object", "properties": {"a": inner}, "required": ["a"]}


def test_nested_min_items_never_multiply_into_what_is_built(tokenizer):
    # issue 37 item 1: a 64-per-level cap still built 64**4 elements from a ~255-byte schema
    # (229 s and 16 GiB on a worker); the sample built is bounded in total, whatever the nesting
    three = json.dumps(minimal_value(_nested_arrays(3)), separators=(", ", ": "))
    assert len(three) <= 2 * BUILD_CHARS  # 1 MB before
    schema = _nested_arrays(4)
    assert len(json.dumps(schema)) < 260
    hermes = load_envelope("hermes")
    tools = [{"type": "function", "function": {"name": "nest", "parameters": schema}}]
    t0 = time.perf_counter()
    n = minimal_call_tokens(tokenizer, hermes, tools, ("nest",))
    assert time.perf_counter() - t0 < 1.0
    assert n > minimal_json_length(schema) // 8  # still the full length's worth of tokens (~67M chars)
    deep = _nested_arrays(8, 65536)
    assert len(json.dumps(minimal_value(deep))) <= 2 * BUILD_CHARS
    assert minimal_json_length(deep) > 65536**8
