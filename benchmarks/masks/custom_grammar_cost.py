"""Cost of a custom tool's grammar mask (llguidance + the envelope transducer): Codex's apply_patch.

Compiles apply_patch (``tests/fixtures/apply_patch.lark``) for the embedded vocabulary in the
hermes (JSON string) and qwen3_coder (raw XML) envelopes, then replays a realistic patch token by
token (the model's own tokenization of the envelope text) timing ``fill`` (the mask) and
``accept_token`` per token of the input. Prints a markdown table.

    python benchmarks/masks/custom_grammar_cost.py
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from server.constrain.arguments.seam import CallFrame  # noqa: E402
from server.constrain.custom.compile import CustomCompiler  # noqa: E402
from server.constrain.custom.encoding import XML_END  # noqa: E402
from server.constrain.vocab import TokenVocab  # noqa: E402
from tests.constrain.custom_grammars import apply_patch_lark  # noqa: E402

PATCH = (
    '*** Begin Patch\n*** Update File: src/app.py\n@@ def main():\n-    print("hello")\n'
    '+    print("hello, world")  # é \\n\n     return 0\n*** Add File: docs/notes.md\n+# Notes\n'
    '+Tabs\tand "quotes".\n*** Delete File: old.txt\n*** End Patch\n'
)
ENVELOPES = {
    "hermes": ("json", "}\n</tool_call>"),
    "qwen3_coder": ("xml_parameters", "</function>\n</tool_call>"),
}


def main() -> None:
    from transformers import AutoTokenizer

    from server.model_store import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("embedded"))
    vocab = TokenVocab.from_tokenizer(tok, len(tok))
    t0 = time.perf_counter()
    custom = CustomCompiler(vocab)
    _ = custom.llg
    setup = time.perf_counter() - t0
    fmt = {"type": "grammar", "syntax": "lark", "definition": apply_patch_lark()}
    print(
        f"llguidance tokenizer for the embedded vocabulary ({vocab.vocab_size} tokens): "
        f"{setup * 1e3:.0f} ms (once)\n"
    )
    print("| envelope | compile ms | input tokens | fill µs p50 / mean / p95 | accept µs p50 |")
    print("|---|---|---|---|---|")
    for env, (style, suffix) in ENVELOPES.items():
        t0 = time.perf_counter()
        c = custom.compile("apply_patch", fmt, CallFrame("", suffix, style))
        m = c.matcher()
        compile_ms = (time.perf_counter() - t0) * 1e3
        body = (
            '{"input": ' + json.dumps(PATCH, ensure_ascii=False) + "}"
            if style == "json"
            else "<parameter=input>\n" + PATCH + XML_END.decode()
        ) + suffix
        ids = tok(body, add_special_tokens=False)["input_ids"]
        bitmask = np.zeros((1, vocab.words), dtype=np.int32)
        fills, accepts = [], []
        for t in ids:
            a = time.perf_counter()
            m.fill(bitmask, 0)
            b = time.perf_counter()
            assert (int(bitmask[0][t >> 5]) >> (t & 31)) & 1, (
                env,
                vocab.token_bytes[t],
                tok.decode(ids[: len(fills)]),
            )
            assert m.accept_token(t)
            fills.append((b - a) * 1e6)
            accepts.append((time.perf_counter() - b) * 1e6)
        assert m.is_terminated()
        q = statistics.quantiles(fills, n=20)
        print(
            f"| {env} | {compile_ms:.1f} | {len(ids)} | {statistics.median(fills):.0f} / "
            f"{statistics.mean(fills):.0f} / {q[-1]:.0f} | {statistics.median(accepts):.0f} |"
        )


if __name__ == "__main__":
    main()
