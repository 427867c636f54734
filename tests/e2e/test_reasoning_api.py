"""Reasoning families end to end over HTTP: a tiny random-weight model with the family's real
tokenizer (agentserve make-test-model), served by the real app.

Per family that declares ``reasoning`` (grammars/families/*.yaml): ``required`` gives reasoning
then a valid call; the reasoning budget closes the reasoning; a ``<tool_call>`` written inside
the reasoning is never a call; stream equals non-stream (reasoning deltas included); past
reasoning is dropped as the vendor's template does (the cache report names the rewrite) or kept
with ``keep_reasoning`` (the session stays append-only). Replies are read with the official
``openai`` SDK types.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import jsonschema
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from server.config import load_settings
from server.families.family import family_choices, load_family
from server.families.model_facts import load_model_facts
from tests.finite_tools import SCHEMAS, TOOLS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


FAMILIES = [ref for ref in family_choices() if load_family(ref).reasoning is not None]
MODEL = "tiny"


@contextmanager
def serve_family(ref: str, tmp_path_factory) -> Iterator[tuple[str, dict[bool, str], Any]]:
    """(family ref, {keep_reasoning: url}, tokenizer): one server per history setting."""
    from transformers import AutoTokenizer

    from server.app import build_app
    from server.engines.hf.engine import HFEngine
    from server.families.test_model import make_test_model
    from tests.conftest import running_server

    folder = make_test_model(ref, tmp_path_factory.mktemp("models") / ref.replace(":", "_"))
    with ExitStack() as stack:
        urls = {}
        for keep in (False, True):
            settings = load_settings(
                model=str(folder),
                device="cpu",
                served_model_name=MODEL,
                tool_state_machine=None,
                keep_reasoning=keep,
            )
            engine = HFEngine(settings, load_model_facts(settings, "hf"))
            urls[keep] = stack.enter_context(running_server(build_app(settings, engine=engine)))
        yield ref, urls, AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module", params=FAMILIES)
def served(request, tmp_path_factory):
    """(family ref, {keep_reasoning: url}, tokenizer): one server per history setting."""
    with serve_family(request.param, tmp_path_factory) as found:
        yield found


def chat(url: str, messages: list[dict], **extra) -> dict:
    body = {
        "model": MODEL,
        "messages": messages,
        "tools": TOOLS,
        "temperature": 0,
        "max_tokens": 120,
        "parallel_tool_calls": False,
        **extra,
    }
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    ChatCompletion.model_validate(r.json())  # the official SDK reads it
    return r.json()


def _close_at(body: dict, close_tag: str) -> int:
    """The index of the generated token that closes the reasoning (from logprobs)."""
    tokens = [e["token"] for e in body["choices"][0]["logprobs"]["content"]]
    text = ""
    for i, tok in enumerate(tokens):
        text += tok
        if close_tag in text:
            return i
    raise AssertionError(f"the reasoning never closed: {text!r}")


def test_required_reasons_then_calls(served) -> None:
    ref, urls, _ = served
    msgs = [{"role": "user", "content": "List the root folder."}]
    for seed in range(3):
        body = chat(
            urls[False], msgs, tool_choice="required", seed=seed, temperature=1.0, max_reasoning_tokens=12
        )
        msg = body["choices"][0]["message"]
        assert msg["reasoning_content"] and msg["reasoning"] == msg["reasoning_content"], msg
        assert body["choices"][0]["finish_reason"] == "tool_calls", body
        for call in msg["tool_calls"]:
            jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])
    named = {"type": "function", "function": {"name": "shell_exit"}}
    body = chat(urls[False], msgs, tool_choice=named, max_reasoning_tokens=5, seed=1, temperature=1.0)
    msg = body["choices"][0]["message"]
    assert msg["reasoning_content"] and [c["function"]["name"] for c in msg["tool_calls"]] == ["shell_exit"]


@pytest.mark.parametrize("budget", [0, 3, 10])
def test_budget_closes_the_reasoning(served, budget: int) -> None:
    ref, urls, _ = served
    close = load_family(ref).reasoning.close_tag
    opened = len(_tok_ids(served, load_family(ref).reasoning.open))
    body = chat(
        urls[False],
        [{"role": "user", "content": "Think, then act."}],
        tool_choice="required",
        max_reasoning_tokens=budget,
        logprobs=True,
    )
    # open text, at most `budget` reasoning tokens, then the close (its leading newline forced first)
    assert _close_at(body, close) <= opened + budget + _close_tokens(served)
    assert body["choices"][0]["message"]["tool_calls"]
    # usage counts the reasoning: every token up to the one that closed it (the call's are not)
    usage = body["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == _close_at(body, close) + 1
    assert usage["completion_tokens_details"]["reasoning_tokens"] < usage["completion_tokens"]


def test_effort_maps_to_a_budget_and_none_turns_it_off(served) -> None:
    ref, urls, _ = served
    family = load_family(ref).reasoning
    msgs = [{"role": "user", "content": "Go."}]
    opened = len(_tok_ids(served, family.open))
    body = chat(
        urls[False], msgs, tool_choice="required", reasoning_effort="minimal", logprobs=True, max_tokens=200
    )
    assert _close_at(body, family.close_tag) <= opened + family.efforts["minimal"] + _close_tokens(served)
    off_body = chat(urls[False], msgs, tool_choice="required", reasoning_effort="none")
    off = off_body["choices"][0]["message"]
    reasoning_tokens = off_body["usage"]["completion_tokens_details"]["reasoning_tokens"]
    if not family.disabled:  # no off switch (gpt-oss, Magistral): the reasoning is closed at once, empty
        assert reasoning_tokens <= opened + _close_tokens(served) + 1, off_body["usage"]
    else:  # the family's off tail ends the prompt: the reply holds no reasoning at all
        assert reasoning_tokens == 0, off_body["usage"]
    assert off.get("reasoning_content") is None and off["tool_calls"]


def test_no_budget_runs_into_max_tokens_as_reasoning(served) -> None:
    _, urls, _ = served
    body = chat(
        urls[False],
        [{"role": "user", "content": "Hm."}],
        tool_choice="required",
        max_tokens=15,
        seed=0,
        temperature=1.0,
    )
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["reasoning_content"]
    assert (
        body["usage"]["completion_tokens_details"]["reasoning_tokens"] == body["usage"]["completion_tokens"]
    )
    assert not choice["message"].get("tool_calls") and choice["message"]["content"] is None


def _tok_ids(served, text: str) -> list[int]:
    return served[2](text, add_special_tokens=False)["input_ids"]


def _close_tokens(served) -> int:
    """Tokens of the close text up to its tag, less one (Qwen3 "\n</think>": 1; Harmony
    "<|end|><|start|>assistant": 2): _close_at is the index of the last of them."""
    close = load_family(served[0]).reasoning.close
    tag = close.strip()
    return len(_tok_ids(served, close[: close.index(tag) + len(tag)])) - 1


def test_a_call_inside_the_reasoning_is_not_a_call(served) -> None:
    ref, urls, _ = served
    tag = _tok_ids(served, "<tool_call>")
    if len(tag) != 1:  # the bias below writes the tag as one token
        pytest.skip(
            "no one-token call tag to bias: Harmony's and Mistral's calls open with special tokens, which "
            "the masks never allow inside the reasoning (tests/chat/test_reasoning_split.py, "
            "tests/families/test_mistral_think.py)"
        )
    msgs = [{"role": "user", "content": "Do not call anything."}]
    body = chat(urls[False], msgs, tool_choice="none", max_reasoning_tokens=6, logit_bias={str(tag[0]): 100})
    msg = body["choices"][0]["message"]
    assert "<tool_call>" in msg["reasoning_content"], msg  # the model wrote the tag while thinking
    assert not msg.get("tool_calls") and "<tool_call>" not in (msg["content"] or "")


def test_stream_equals_non_stream(served) -> None:
    _, urls, _ = served
    msgs = [{"role": "user", "content": "Look around."}]
    extra = {"tool_choice": "required", "max_reasoning_tokens": 9, "seed": 3, "temperature": 1.0}
    whole_body = chat(urls[False], msgs, **extra)
    whole = whole_body["choices"][0]["message"]
    body = {"model": MODEL, "messages": msgs, "tools": TOOLS, "max_tokens": 120}
    body |= {"parallel_tool_calls": False, "stream": True, "stream_options": {"include_usage": True}, **extra}
    calls: dict[int, dict] = {}
    reasoning, reasoning2, content, usage = "", "", "", None
    with httpx.stream("POST", urls[False] + "/v1/chat/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = ChatCompletionChunk.model_validate_json(line[6:])
            if chunk.usage is not None:
                usage = json.loads(line[6:])["usage"]
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            extra_fields = delta.model_extra or {}
            reasoning += extra_fields.get("reasoning_content") or ""
            reasoning2 += extra_fields.get("reasoning") or ""
            content += delta.content or ""
            for tc in delta.tool_calls or []:
                c = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                c["name"] += (tc.function.name if tc.function else None) or ""
                c["arguments"] += (tc.function.arguments if tc.function else None) or ""
    assert whole["reasoning_content"] and reasoning == reasoning2 == whole["reasoning_content"]
    assert content == (whole["content"] or "")
    assert [calls[i] for i in sorted(calls)] == [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in whole["tool_calls"]
    ]
    assert usage is not None and usage["completion_tokens_details"]["reasoning_tokens"] > 0
    assert usage["completion_tokens_details"] == whole_body["usage"]["completion_tokens_details"]


def session(
    url: str, key: str, choice: Callable[[int], str] = lambda turn: "required"
) -> tuple[int, int, int, list[dict]]:
    """A 10-turn agent session (tool loops, a new user message every third turn), sent back as an
    SDK does (reasoning_content with each assistant turn): (cached, ideal, prompt tokens, cache
    reports) over turns 2-10; ideal = the previous turn's prompt in whole cache blocks."""
    msgs: list[dict] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Start."},
    ]
    block = load_settings().prefix_cache.block_size
    cached, ideal, total, prev, reports = 0, 0, 0, None, []
    for turn in range(10):
        body = chat(
            url,
            msgs,
            tool_choice=choice(turn),
            prompt_cache_key=key,
            max_reasoning_tokens=24,
            seed=turn,
            temperature=1.0,
        )
        usage = body["usage"]
        if prev is not None:
            cached += usage["prompt_tokens_details"]["cached_tokens"]
            ideal += prev // block * block
            total += usage["prompt_tokens"]
            reports.append(body["cache"])
        prev = usage["prompt_tokens"]
        msg = body["choices"][0]["message"]
        msgs.append(
            {k: v for k, v in msg.items() if k in ("role", "content", "tool_calls", "reasoning_content")}
        )
        for call in msg.get("tool_calls") or []:
            msgs.append({"role": "tool", "tool_call_id": call["id"], "content": f"result {turn}"})
        if turn % 3 == 2:
            msgs.append({"role": "user", "content": f"Next step {turn}."})
    return cached, ideal, total, reports


def test_past_reasoning_dropped_or_kept(served) -> None:
    """Prints both hit rates (run with -s). The cache also keeps each reply's own tokens, so
    cached/ideal can pass 100% when the history renders the reply back as it was written."""
    ref, urls, _ = served
    dropped = session(urls[False], f"drop-{ref}")
    kept = session(urls[True], f"keep-{ref}")
    for name, (c, i, t, _) in (("vendor history (drop)", dropped), ("keep_reasoning", kept)):
        print(
            f"\n{ref} {name}: cached {c} of ideal {i} ({c / i:.2%}); of all prompt tokens {t} ({c / t:.2%})"
        )
    if load_family(ref).reasoning.history == "until_answer":
        # gpt-oss keeps the analysis of a tool loop (this session only calls): every prompt starts
        # with the previous one both ways; tests/e2e/test_harmony_api.py has the session with answers.
        # The vendor template writes a past call's header otherwise than the model did (`to=` before
        # `<|channel|>`): the reply's own tokens from there on are named, never the prompt's
        assert all(r.get("diverged_at_token") is None for r in kept[3]), kept[3]
        for r in dropped[3]:
            if r.get("diverged_at_token") is not None:
                assert r["type"] == "template_rewrote_history" and r["detail"]["segment"] == "reply", r
        assert dropped[0] >= 0.99 * dropped[1] and kept[0] >= 0.99 * kept[1]
        return
    if load_family(ref).reasoning.history == "all":  # Mistral: every turn keeps its reasoning
        for c, i, _, reports in (dropped, kept):
            assert all(r.get("diverged_at_token") is None for r in reports), reports
            assert c >= 0.99 * i
        return
    # the vendor's history drops reasoning before a new user message: named in the cache report
    rewrites = [r for r in dropped[3] if r.get("type") == "template_rewrote_history"]
    assert rewrites, dropped[3]
    assert "reasoning" in json.dumps(rewrites[0]) and "keep_reasoning" in json.dumps(rewrites[0])
    assert sum(r["missed_tokens"] for r in rewrites) > 0  # each rewrite loses tokens it had cached
    # kept: append-only, every turn's prompt starts with the previous one (its reply too)
    assert all(r.get("diverged_at_token") is None for r in kept[3]), kept[3]
    # (cached/ideal can pass 100% both ways: the reply's tokens count; compare shares of the prompts)
    assert kept[0] >= 0.99 * kept[1] and kept[0] / kept[2] > dropped[0] / dropped[2]


ANSWER = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["yes", "no"]},
        "count": {"type": "integer", "enum": [1, 2, 3]},
    },
    "required": ["verdict", "count"],
    "additionalProperties": False,
}
ANSWER_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}


def _structured(url: str, stream: bool, **extra) -> tuple[str, str, str | None]:
    """(reasoning, content, finish_reason) of a response_format request without tools."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Think, then answer in JSON."}],
        "response_format": ANSWER_FORMAT,
        "max_tokens": 120,
        "stream": stream,
        **extra,
    }
    if not stream:
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        choice = ChatCompletion.model_validate(r.json()).choices[0]
        msg = r.json()["choices"][0]["message"]
        assert msg.get("reasoning") == msg.get("reasoning_content")
        return msg.get("reasoning_content") or "", choice.message.content or "", choice.finish_reason
    reasoning, content, finish = "", "", None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = ChatCompletionChunk.model_validate_json(line[6:])
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            content += delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return reasoning, content, finish


def test_response_format_applies_after_the_reasoning(served) -> None:
    """response_format with a reasoning family: free reasoning, returned apart; then JSON that
    follows the schema (it was a 400 before); stream equals non-stream."""
    ref, urls, _ = served
    close = load_family(ref).reasoning.close_tag
    for seed in range(3):
        extra = {"seed": seed, "temperature": 1.0, "max_reasoning_tokens": 10}
        reasoning, content, finish = _structured(urls[False], False, **extra)
        assert reasoning and close not in reasoning and close not in content, (reasoning, content)
        assert finish == "stop", (finish, content)
        jsonschema.validate(json.loads(content), ANSWER)
        assert _structured(urls[False], True, **extra) == (reasoning, content, finish)
