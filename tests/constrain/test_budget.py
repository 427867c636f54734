"""No parallel call is begun without budget to finish it (``ToolMatcher.more_calls``)."""

from __future__ import annotations

import json

from server.chat.tool_choice import plan_tools
from server.constrain.min_call import minimal_call_text, minimal_value

from .decode import EOS
from .test_tool_matcher import feed, mask_of

FIRST = 'open_site", "arguments": {"url": "https://x.org"}}\n</tool_call>'


def test_minimal_value_meets_the_schema():
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "minLength": 2},
            "b": {"enum": ["long", "s"]},
            "c": {"type": "array", "items": {"type": "integer", "minimum": 3}, "minItems": 1},
            "d": {"type": "string"},
        },
        "required": ["a", "b", "c"],
    }
    assert minimal_value(schema) == {"a": "aa", "b": "s", "c": [3]}


def test_another_call_needs_the_budget_of_the_shortest_call(compiler, tokenizer, swe_tools, hermes):
    plan = plan_tools(swe_tools, "required", [{"role": "user", "content": "hi"}], True, None, hermes)
    unlimited = compiler.build(swe_tools, plan, EOS)
    assert feed(unlimited, tokenizer, FIRST)
    used = unlimited.used
    sep = tokenizer.encode("\n")[0]
    assert sep in mask_of(unlimited, tokenizer) and not unlimited.is_terminated()

    probe = compiler.build(swe_tools, plan, EOS, budget=10_000)
    need = probe.min_call
    fns = [t["function"] for t in swe_tools]
    texts = [minimal_call_text(hermes, f["name"], f.get("parameters")) for f in fns]
    shortest = min(len(tokenizer.encode(text)) for text in texts)
    assert need == shortest > 5

    enough = compiler.build(swe_tools, plan, EOS, budget=used + need)
    assert feed(enough, tokenizer, FIRST)
    assert sep in mask_of(enough, tokenizer) and not enough.is_terminated()

    short = compiler.build(swe_tools, plan, EOS, budget=used + need - 1)
    assert feed(short, tokenizer, FIRST)
    assert mask_of(short, tokenizer) == set(EOS) and short.is_terminated()
    assert not short.accept_token(sep) and "only end of sequence" in short.error


def test_the_budget_travels_in_the_tool_spec(swe_tools, hermes):
    from server.constrain.spec import ToolSpec

    plan = plan_tools(swe_tools, "auto", [{"role": "user", "content": "hi"}], True, None, hermes)
    spec = ToolSpec(swe_tools, plan, budget=64)
    assert ToolSpec.from_json(json.dumps(spec.to_json())).budget == 64
    assert ToolSpec.from_json(ToolSpec(swe_tools, plan).to_json()).budget is None
