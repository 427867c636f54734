"""Per-token cost of the reasoning phase of a reasoning family's masks (``ReasoningMatcher``).

Replays a fixed reply of a reasoning family token by token through the request's constraint
(the gate around the tool constraint) and times ``fill_next_token_bitmask`` and
``accept_token`` per phase: the forced open text, free reasoning (the close-tag watch; rows
cached per watch state), the close and the call opening forced, then the name and arguments
of the tool call (the ToolMatcher's own phases). Each family with ``reasoning`` in its file,
on the family's test vocabulary (``family_test_tokenizer``: the real one where it can be built
offline; gpt-oss: SmolLM2's + the Harmony special tokens, not o200k), 30 tools, ``tool_choice: required``.

    python benchmarks/masks/reasoning_overhead.py [--family hermes:qwen3_thinking] [--reps 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import xgrammar as xgr  # noqa: E402

from benchmarks.masks.mask_overhead import CALL, TOOLS_FILE  # noqa: E402
from server.chat.reasoning_reply import choose_reasoning  # noqa: E402
from server.chat.tool_choice import plan_tools  # noqa: E402
from server.constrain.envelope_compiler import EnvelopeCompiler  # noqa: E402
from server.families.envelope import load_envelope  # noqa: E402
from server.families.family import family_choices, load_family  # noqa: E402
from server.families.test_model import family_test_tokenizer  # noqa: E402
from tests.constrain.vocabs import LOGITS_WIDTH  # noqa: E402

THOUGHT = "The user wants the docs page. I could call browser_open_site; <tool_call> here is just text.\n" * 3


def phase_of(c) -> str:
    inner = getattr(c, "inner", None)
    if c.phase.name != "INNER":
        return {"OPEN": "open (forced)", "THINK": "reasoning", "FORCE": "close + opening (forced)"}[
            c.phase.name
        ]
    return {"CALL": "name", "ARGS": "arguments"}.get(inner.phase.name, inner.phase.name.lower())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    refs = [r for r in family_choices() if load_family(r).reasoning is not None]
    ap.add_argument("--family", default=refs[0], choices=refs)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    family = load_family(args.family)
    assert family.reasoning is not None
    envelope = load_envelope(family.envelope)
    # the family's test vocabulary: the real one (Qwen, tekken with [THINK]) where it can be built
    # offline, else (gpt-oss: no o200k here) SmolLM2's + the family's special tokens
    tok = family_test_tokenizer(args.family)
    width = max(len(tok), LOGITS_WIDTH.get(str(family.test_model.get("vocab")), 0))
    eos = tuple(tok.convert_tokens_to_ids(t) for t in family.test_model.get("eos", []))
    tools = json.loads(TOOLS_FILE.read_text())
    compiler = EnvelopeCompiler(tok, width, envelope)
    plan = plan_tools(tools, "required", [], False, None, envelope)
    plan = replace(plan, reasoning=choose_reasoning(family.reasoning, None, None).plan)
    r = family.reasoning
    reply = r.open + THOUGHT.strip("\n") + r.close
    reply += envelope.render_calls([(CALL["name"], json.dumps(CALL["arguments"]), "")])
    tokens = tok.encode(reply, add_special_tokens=False)
    bitmask = xgr.allocate_token_bitmask(1, compiler.vocab.vocab_size)
    fill: dict[str, list[float]] = {}
    accept: dict[str, list[float]] = {}
    for _ in range(args.reps):
        c = compiler.build(tools, plan, eos)
        for t in tokens:
            phase = phase_of(c)
            t0 = time.perf_counter_ns()
            c.fill_next_token_bitmask(bitmask, 0)
            t1 = time.perf_counter_ns()
            ok = c.accept_token(t)
            t2 = time.perf_counter_ns()
            assert ok, c.error
            fill.setdefault(phase, []).append((t1 - t0) / 1e3)
            accept.setdefault(phase, []).append((t2 - t1) / 1e3)
    med = statistics.median
    print(
        f"# Reasoning-phase mask cost ({args.family}; vocab {len(tok)}, logits {width}; {len(tools)} tools)\n"
    )
    print("| phase | tokens | fill µs/tok (median) | accept µs/tok |")
    print("|---|---|---|---|")
    for phase, xs in fill.items():
        print(f"| {phase} | {len(xs) // args.reps} | {med(xs):.1f} | {med(accept[phase]):.1f} |")


if __name__ == "__main__":
    main()
