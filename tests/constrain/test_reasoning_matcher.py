"""The reasoning matcher (server/constrain/reasoning_matcher.py) on Qwen's real vocabulary.

Random walks through the masks (every step samples among the allowed tokens, seeded) must
give: the open text, free reasoning, the close, then what the tool plan demands (a valid call
for required / named). The budget forces the close after exactly that many reasoning tokens;
a ``<tool_call>`` inside the reasoning is accepted as text, and only the text after the close
is ever parsed for calls.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from server.chat.reasoning_reply import ReasoningSplitter
from server.chat.toolcalls import parse_tool_calls
from server.constrain.plan import ReasoningPlan, ToolPlan
from server.families.envelope import load_envelope
from server.families.family import load_family

FAMILY = load_family("hermes:qwen3_thinking")
R = FAMILY.reasoning
HERMES = load_envelope("hermes")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell_ls",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "enum": ["/", "/tmp"]}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "shell_exit", "parameters": {"type": "object", "properties": {}}},
    },
]


@pytest.fixture(scope="module")
def qwen(official):
    return official("qwen")


def _plan(mode: str, allowed: tuple[str, ...], budget: int | None, prefill: str = "") -> ToolPlan:
    assert R is not None
    return ToolPlan(mode, allowed, False, prefill, None, ReasoningPlan(R.open, R.close, budget))  # type: ignore[arg-type]


def _allowed(c, qwen) -> np.ndarray:
    bm = np.zeros((1, qwen.vocab.words), dtype=np.int32)
    c.fill_next_token_bitmask(bm, 0)
    bits = np.unpackbits(bm[0].view(np.uint8), bitorder="little")[: qwen.vocab.vocab_size]
    return np.flatnonzero(bits)


def walk(c, qwen, seed: int, steps: int = 120, prefer: int | None = None) -> list[int]:
    """Sample among the allowed tokens (``prefer`` whenever it is allowed) until the end."""
    rng = np.random.default_rng(seed)
    ids: list[int] = []
    for _ in range(steps):
        allowed = _allowed(c, qwen)
        tid = prefer if prefer is not None and prefer in allowed else int(rng.choice(allowed))
        assert c.accept_token(tid), c.error
        ids.append(tid)
        if c.is_terminated():
            break
    return ids


def _split(text: str) -> tuple[str | None, str]:
    assert R is not None
    s = ReasoningSplitter(ReasoningPlan(R.open, R.close))
    answer = s.feed(text)[1] + s.finish()[1]
    return s.reasoning, answer


@pytest.mark.parametrize("seed", range(4))
def test_required_reasons_then_writes_a_valid_call(qwen, seed: int) -> None:
    eos = qwen.eos("hermes")
    prefill = HERMES.opening
    c = qwen.compiler("hermes").build(TOOLS, _plan("required", ("shell_ls", "shell_exit"), 6, prefill), eos)
    ids = walk(c, qwen, seed)
    text = qwen.tokenizer.decode(ids)
    assert text.startswith(R.open) and R.close_tag in text, text
    _, answer = _split(text)
    parsed = parse_tool_calls(answer, HERMES, TOOLS)
    assert len(parsed.tool_calls) == 1 and not parsed.content, text
    call = parsed.tool_calls[0]
    assert call.name in ("shell_ls", "shell_exit") and isinstance(json.loads(call.arguments), dict)


@pytest.mark.parametrize("budget", [0, 1, 5, 17])
def test_the_budget_forces_the_close(qwen, budget: int) -> None:
    eos = qwen.eos("hermes")
    close_id = qwen.tokenizer.convert_tokens_to_ids(R.close_tag)
    c = qwen.compiler("hermes").build(TOOLS, _plan("auto", ("shell_ls", "shell_exit"), budget), eos)
    ids = walk(c, qwen, seed=budget, steps=budget + 12)
    opened = len(qwen.tokenizer(R.open, add_special_tokens=False)["input_ids"])
    thought = ids[opened:]
    # the close tag is never sampled here (one token among 150k), so it is the forced one
    assert close_id in thought and thought.index(close_id) <= budget + 1, qwen.tokenizer.decode(ids)
    assert qwen.tokenizer.decode(ids).count(R.close_tag) == 1


def test_a_call_inside_the_reasoning_is_text_and_never_parsed(qwen) -> None:
    eos = qwen.eos("hermes")
    tag = qwen.tokenizer.convert_tokens_to_ids("<tool_call>")
    c = qwen.compiler("hermes").build(TOOLS, _plan("none", (), 4), eos)
    ids = walk(c, qwen, seed=0, prefer=tag, steps=30)
    text = qwen.tokenizer.decode(ids)
    reasoning, answer = _split(text)
    assert reasoning is not None and "<tool_call>" in reasoning  # written while thinking
    assert "<tool_call>" not in answer  # mode none after the close: the tag is masked
    # a whole call written inside the reasoning is reasoning, not a call
    body = '<tool_call>\n{"name": "shell_ls", "arguments": {"path": "/"}}\n</tool_call>'
    reasoning, answer = _split(R.open + body + R.close + "done")
    assert reasoning == body and parse_tool_calls(answer, HERMES, TOOLS).tool_calls == ()


def test_a_token_running_past_the_close_must_fit_what_is_forced(qwen) -> None:
    eos = qwen.eos("hermes")
    c = qwen.compiler("hermes").build(TOOLS, _plan("required", ("shell_ls",), None, HERMES.opening), eos)
    walk(c, qwen, seed=0, steps=3)  # the open text, a reasoning token
    allowed = set(_allowed(c, qwen).tolist())
    vocab = qwen.vocab
    # every allowed token that completes the close tag runs on only with the forced "\n\n<tool_call>..."
    forced = (R.close[R.close.index(R.close_tag) + len(R.close_tag) :] + HERMES.opening).encode()
    for tid, off in c.masks.watch.complete[c.q].items():
        assert (tid in allowed) == forced.startswith(vocab.token_bytes[tid][off:])
    assert not (allowed & set(eos))  # the reasoning must close before the reply may end


def test_without_tools_the_gate_still_applies_the_budget(qwen) -> None:
    eos = qwen.eos("hermes")
    c = qwen.compiler("hermes").build(None, _plan("auto", (), 3), eos)
    assert c is not None
    ids = walk(c, qwen, seed=2, steps=12)
    assert R.close_tag in qwen.tokenizer.decode(ids)


def test_a_plain_plan_builds_no_gate(qwen) -> None:
    eos = qwen.eos("hermes")
    assert qwen.compiler("hermes").build(None, ToolPlan("auto", (), False, ""), eos) is None


def test_the_plan_round_trips_through_json() -> None:
    plan = _plan("required", ("shell_ls",), 9, HERMES.opening)
    assert ToolPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


def test_a_special_token_close_tag_ends_the_reasoning(qwen) -> None:
    """Tags that are special tokens (Mistral's [THINK] / [/THINK]; here two of Qwen's specials)."""
    from server.constrain.reasoning_matcher import ReasoningMatcher

    tok, eos = qwen.tokenizer, qwen.eos("hermes")
    open_id, close_id = tok.convert_tokens_to_ids(["<|box_start|>", "<|box_end|>"])
    assert not qwen.vocab.token_bytes[close_id]  # opaque: no text spells it
    masks = qwen.compiler("hermes").reasoning_masks("<|box_start|>", "<|box_end|>")
    gate = ReasoningMatcher(masks, None, "", eos)
    ids = walk(gate, qwen, seed=0, steps=2, prefer=close_id)  # the model closes as soon as it may
    assert ids[:2] == [open_id, close_id] and gate.phase.name == "INNER"
    budgeted = ReasoningMatcher(masks, None, "", eos, budget=3)
    ids = walk(budgeted, qwen, seed=1, steps=5)
    assert ids[0] == open_id and ids[4] == close_id  # three reasoning tokens, then the forced close


ANSWER = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["verdict"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(("mode", "tools"), [("auto", None), ("none", TOOLS)])
def test_response_format_applies_after_the_reasoning(qwen, mode: str, tools) -> None:
    """The whole wraps the response_format constraint in the gate: free reasoning (past the
    budget's close), then JSON following the schema, then the end of the reply."""
    from server.constrain.compiler import Compiler
    from server.constrain.spec import ToolSpec

    whole = Compiler(qwen.tokenizer, qwen.vocab.vocab_size)
    whole._vocab = qwen.vocab  # the session's vocabulary (built once)
    eos = qwen.eos("hermes")
    allowed = ("shell_ls", "shell_exit") if tools else ()
    spec = ToolSpec(tools or [], _plan(mode, allowed, 5), "hermes", eos_token_ids=eos, text_schema=ANSWER)
    for seed in range(3):
        c = whole.build(spec)
        ids = walk(c, qwen, seed, steps=60)
        assert c.is_terminated() and ids[-1] in eos, qwen.tokenizer.decode(ids)
        reasoning, answer = _split(qwen.tokenizer.decode(ids[:-1]))
        assert reasoning is not None and "verdict" not in reasoning
        assert json.loads(answer) in ({"verdict": "yes"}, {"verdict": "no"}), answer
