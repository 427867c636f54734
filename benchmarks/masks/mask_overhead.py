"""Per-token cost of tool masking: compute and apply, name and argument phases, vs xgrammar alone.

Replays a fixed Hermes tool call token by token (the model's own tokenization) through

* ours: the ToolMatcher (trie for the name, xgrammar per tool for the arguments), and
* xgrammar alone: one grammar for the whole call (a union over the tools of
  ``NAME", "arguments": ARGS`` behind the same prefill), one GrammarMatcher;

timing ``fill_next_token_bitmask`` (compute) and ``accept_token`` per token, by phase, and
the batched apply of the bitmask to logits [B, V] (MaskApplier: copy + xgrammar kernel).
The last table compares the arguments backends (``--backends xgrammar,outlines``) side by
side: setup per vocabulary, compile time per tool, fill and accept per argument token, apply.
Prints markdown tables and the overhead against a decode step (``--decode-step-ms``; the
SmolLM2-135M fp32 decode step on 2 CPU cores is ~60 ms).

    python benchmarks/masks/mask_overhead.py                 # CPU
    python benchmarks/masks/mask_overhead.py --device cuda   # GPU logits (apply includes the H2D copy)
    python benchmarks/masks/mask_overhead.py --family llama3_json   # a family's envelope on its real
        # vocabulary (hermes, qwen3_coder: Qwen 151k; llama3_json: Llama 3 128k;
        # mistral_json_array, mistral_name_args: tekken 131k); 30 tools, the call rendered by
        # the envelope. The xgrammar-alone comparison runs for JSON envelopes with a text name end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import xgrammar as xgr  # noqa: E402

from server.chat.tool_choice import plan_tools  # noqa: E402
from server.constrain.arguments.seam import tool_schema  # noqa: E402
from server.constrain.envelope_compiler import EnvelopeCompiler  # noqa: E402
from server.constrain.tool_matcher import Phase  # noqa: E402
from server.constrain.trie import NameTrie  # noqa: E402
from server.families.envelope import load_envelope  # noqa: E402

TOOLS_FILE = ROOT / "tests" / "fixtures" / "prefixed_agent_tools.json"
CALL = {"name": "browser_open_site", "arguments": {"url": "https://example.org/docs/getting-started"}}
EXTRA_TOOL = {  # a 30th tool with typed, nested and optional arguments
    "type": "function",
    "function": {
        "name": "config_set",
        "parameters": {
            "type": "object",
            "properties": {
                "opts": {"type": "object", "properties": {"depth": {"type": "integer"}}},
                "tags": {"type": "array", "items": {"type": "string"}},
                "ratio": {"type": "number"},
                "force": {"type": "boolean"},
            },
            "required": ["force"],
        },
    },
}


def load_tokenizer(path: str | None):
    from transformers import AutoTokenizer

    if path is None:
        from server.model_store import resolve_model

        path = str(resolve_model("embedded", progress=True))
    return AutoTokenizer.from_pretrained(path)


def timed(fn, reps: int) -> float:
    """Median µs of fn() over reps runs."""
    out = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        out.append(time.perf_counter_ns() - t0)
    return statistics.median(out) / 1e3


def ours(compiler, tools, plan, tokens, reps, eos=(2, 0)):
    """µs per token by phase: fill and accept, replaying ``tokens`` after the prefill."""
    bitmask = xgr.allocate_token_bitmask(1, compiler.vocab.vocab_size)
    fill: dict[str, list[float]] = {}
    accept: dict[str, list[float]] = {}
    for _ in range(reps):
        c = compiler.build(tools, plan, eos)
        for tok in tokens:
            phase = {Phase.CALL: "name", Phase.ARGS: "arguments"}.get(c.phase, c.phase.name.lower())
            t0 = time.perf_counter_ns()
            c.fill_next_token_bitmask(bitmask, 0)
            t1 = time.perf_counter_ns()
            ok = c.accept_token(tok)
            t2 = time.perf_counter_ns()
            assert ok, c.error
            fill.setdefault(phase, []).append((t1 - t0) / 1e3)
            accept.setdefault(phase, []).append((t2 - t1) / 1e3)
    return fill, accept


def family_tokenizer(envelope: str):
    """(tokenizer, logits width, EOS ids) of the family's real vocabulary (tests/constrain/vocabs.py)."""
    from tests.constrain.conftest import FAMILIES
    from tests.constrain.vocabs import LOGITS_WIDTH, load_vocab_tokenizer

    vocab, eos = FAMILIES[envelope]
    tok = load_vocab_tokenizer(vocab)
    return tok, LOGITS_WIDTH[vocab], tuple(tok.convert_tokens_to_ids(t) for t in eos)


def whole_call_grammar(compiler, tools, envelope):
    """xgrammar alone: one grammar for every tool's NAME + name_close + ARGS + call_end."""
    lit = lambda s: xgr.Grammar.from_ebnf(f"root ::= {json.dumps(s)}")  # noqa: E731
    per_tool = [
        xgr.Grammar.concat(
            lit(t["function"]["name"] + envelope.name_close),
            xgr.Grammar.from_json_schema(json.dumps(tool_schema(t)), any_whitespace=False),
            lit(envelope.call_end),
        )
        for t in tools
    ]
    t0 = time.perf_counter()
    compiled = compiler.backend.compiler.compile_grammar(xgr.Grammar.union(*per_tool))
    return compiled, (time.perf_counter() - t0) * 1e3


def xgrammar_alone(compiled, vocab_size, tokens, n_name, reps):
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    fill: dict[str, list[float]] = {}
    accept: dict[str, list[float]] = {}
    for _ in range(reps):
        m = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
        for i, tok in enumerate(tokens):
            phase = "name" if i < n_name else "arguments"
            t0 = time.perf_counter_ns()
            m.fill_next_token_bitmask(bitmask, 0)
            t1 = time.perf_counter_ns()
            assert m.accept_token(tok)
            t2 = time.perf_counter_ns()
            fill.setdefault(phase, []).append((t1 - t0) / 1e3)
            accept.setdefault(phase, []).append((t2 - t1) / 1e3)
    return fill, accept


def apply_cost(compiler, tools, plan, device, batches, reps, eos=(2, 0)):
    """µs per step for a batch: (MaskApplier fill + copy + kernel, kernel alone)."""
    from server.constrain.bitmask import MaskApplier

    v = compiler.vocab.vocab_size
    out = {}
    for b in batches:
        applier = MaskApplier(v)
        constraints = [compiler.build(tools, plan, eos) for _ in range(b)]
        logits = torch.randn(b, v, device=device)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        bitmask, _ = applier.fill(constraints)
        bitmask = bitmask.to(device)

        def whole(applier=applier, logits=logits, constraints=constraints, sync=sync):
            applier.apply(logits, constraints)
            sync()

        def kernel(logits=logits, bitmask=bitmask, sync=sync):
            xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=v)
            sync()

        whole(), kernel()
        out[b] = (timed(whole, reps), timed(kernel, reps))
    return out


def backends_side_by_side(tok, width, envelope, tools, plan, tokens, eos, args) -> str:
    """Per arguments backend: compile ms per tool (uncached), fill/accept µs per argument token, apply."""
    from server.constrain.vocab import TokenVocab

    vocab = TokenVocab.from_tokenizer(tok, width)
    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    rows = [
        f"\n## Arguments backends side by side ({len(tools)} tools, the call to {CALL['name']})\n",
        "| backend | setup ms (once per vocab) | compile ms per tool | fill µs/tok (arguments) "
        "| accept µs/tok | fill + copy + apply µs (batch 1) |",
        "|---|---|---|---|---|---|",
    ]
    for name in [b for b in args.backends.split(",") if b]:
        t0 = time.perf_counter()
        try:
            compiler = EnvelopeCompiler(tok, width, envelope, backend=name, vocab=vocab)
        except ValueError as exc:
            rows.append(f"| {name} | unavailable: {exc} | | | | |")
            continue
        setup_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        compiler.build(tools, plan, eos)  # one grammar per tool, uncached
        per_tool = (time.perf_counter() - t0) * 1e3 / len(tools)
        fill, accept = ours(compiler, tools, plan, tokens, args.reps, eos)
        ((applied, _),) = apply_cost(compiler, tools, plan, args.device, [1], args.reps * 3, eos).values()
        rows.append(
            f"| {name} | {setup_ms:.0f} | {per_tool:.0f} | {med(fill.get('arguments', [])):.1f} "
            f"| {med(accept.get('arguments', [])):.1f} | {applied:.1f} |"
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the embedded model)")
    ap.add_argument("--family", default=None, help="an envelope, on its family's real vocabulary")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--decode-step-ms", type=float, default=60.0)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument(
        "--backends", default="xgrammar,outlines", help="arguments backends compared side by side"
    )
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))

    tools = json.loads(TOOLS_FILE.read_text())
    if args.family:
        tok, width, eos = family_tokenizer(args.family)
        envelope = load_envelope(args.family)
        tools.append(EXTRA_TOOL)
    else:
        tok, eos = load_tokenizer(args.tokenizer), (2, 0)
        width, envelope = len(tok), load_envelope("hermes")
    names = tuple(t["function"]["name"] for t in tools)
    t0 = time.perf_counter()
    compiler = EnvelopeCompiler(tok, width, envelope)
    factory_ms = (time.perf_counter() - t0) * 1e3
    m = compiler.masks
    builds = []
    for _ in range(5):
        t0 = time.perf_counter()
        NameTrie(compiler.vocab, names, m.lead, m.term, m.close_rest.encode(), m.term_token)
        builds.append((time.perf_counter() - t0) * 1e3)
    plan = plan_tools(tools, "required", [], False, None, envelope)
    t0 = time.perf_counter()
    compiler.build(tools, plan, eos)  # compiles one grammar per tool (cached afterwards)
    compile_ms = (time.perf_counter() - t0) * 1e3

    arguments = json.dumps(CALL["arguments"])
    text = envelope.render_calls([(CALL["name"], arguments, "a1B2c3D4e")])
    head = envelope.opening + CALL["name"] + envelope.close_text("a1B2c3D4e")
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    tokens = enc(text[len(plan.prefill) :])  # the model writes on from the prefill
    n_name = len(enc(head[len(plan.prefill) :]))

    f_ours, a_ours = ours(compiler, tools, plan, tokens, args.reps, eos)
    whole = envelope.arguments == "json" and envelope.name_close_token is None and not envelope.calls_close
    if whole:
        compiled, whole_ms = whole_call_grammar(compiler, tools, envelope)
        f_x, a_x = xgrammar_alone(compiled, width, tokens, n_name, args.reps)
    else:
        whole_ms, f_x, a_x = float("nan"), {}, {}
    batches = [int(b) for b in args.batches.split(",")]
    applied = apply_cost(compiler, tools, plan, args.device, batches, args.reps * 3, eos)

    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    print(
        f"# Mask overhead ({args.device}; envelope {envelope.name}; vocab {len(tok)} (logits {width}); "
        f"{len(tools)} tools; call to {CALL['name']})\n"
    )
    print(f"- compiler (vocab bytes, envelope masks, tag watch): {factory_ms:.0f} ms once per tokenizer")
    print(f"- trie build for {len(names)} names: {med(builds):.2f} ms (median of 5, uncached)")
    print(f"- first build of the constraint (compiles {len(tools)} argument grammars): {compile_ms:.0f} ms")
    if whole:
        print(f"- xgrammar alone, one grammar for the whole call: compile {whole_ms:.0f} ms")
    print()
    print("| phase | tokens | ours: fill µs/tok | ours: accept | xgrammar alone: fill | xgr alone: accept |")
    print("|---|---|---|---|---|---|")
    for phase in ("name", "arguments"):
        fo, ao, fx, ax = (med(d.get(phase, [])) for d in (f_ours, a_ours, f_x, a_x))
        n = len(f_ours.get(phase, [])) // args.reps
        print(f"| {phase} | {n} | {fo:.1f} | {ao:.1f} | {fx:.1f} | {ax:.1f} |")
    print(f"\n| batch | fill rows + copy + apply µs ({args.device}) | apply kernel alone µs |")
    print("|---|---|---|")
    for b, (whole, kernel) in applied.items():
        print(f"| {b} | {whole:.1f} | {kernel:.1f} |")
    for phase in ("name", "arguments"):
        cost = med(f_ours.get(phase, [])) + med(a_ours.get(phase, [])) + applied[batches[0]][1]
        pct = 100 * cost / (args.decode_step_ms * 1e3)
        step = f"{args.decode_step_ms:.0f} ms decode step"
        print(
            f"\n{phase} phase, batch {batches[0]}: fill + accept + apply = {cost:.1f} µs = {pct:.2f}% of a",
            step,
        )
    print(backends_side_by_side(tok, width, envelope, tools, plan, tokens, eos, args))


if __name__ == "__main__":
    main()
