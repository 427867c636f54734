"""Profile the hf engine's decode loop on one agent turn (cProfile), against the bare model forward.
from server.families.model_facts import load_model_facts

    python benchmarks/speed/profile_hf.py [--context 4000] [--tokens 64] [--threads 2] [--top 25]

Builds the engine as ``agentserve serve`` does (embedded model), prefills one synthetic agent
prompt of about ``--context`` tokens, then runs ``--tokens`` decode steps of the engine
(``HFEngine.runner.decode_step``, on this thread) under cProfile; then the same number of steps of
the bare model (forward with a DynamicCache, argmax) for the floor. Prints ms/token of each,
the engine's overhead over the floor, and the top functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=4000)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()

    import torch
    from transformers import DynamicCache

    from benchmarks.harness.tokens import load_tokenizer, render_ids
    from benchmarks.harness.trace_gen import generate_sessions
    from benchmarks.harness.variants import build_requests
    from server.config import load_settings
    from server.engines.base import GenerationRequest, SamplingParams
    from server.engines.hf.engine import HFEngine
    from server.engines.hf.kv.growing import cache_kw
    from server.engines.hf.sampler import TokenSampler
    from server.engines.hf.sequence import SequenceState
    from server.families.model_facts import load_model_facts

    def say(msg: str) -> None:
        print(f"[profile {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    settings = load_settings(None, threads=args.threads)
    eng = HFEngine(settings.engine_settings(), load_model_facts(settings, "hf"))
    tok = load_tokenizer(None)
    session = generate_sessions(0, 1, context=8192, steps=50)[0]
    reqs = build_requests(session, "good")
    ids: list[int] = []
    for r in reqs:  # the first turn at least --context tokens long
        ids = render_ids(tok, r.body["messages"], r.body["tools"])
        if len(ids) >= args.context:
            break
    say(f"engine loaded; prompt {len(ids)} tokens; prefill")
    n = args.tokens
    seq = SequenceState(
        GenerationRequest("p", ids, SamplingParams(n + 1, temperature=0.0), None, "", "s"), None, None
    )
    seq.sampler = TokenSampler(seq.request.sampling, ids, eng.vocab_size, eng.device, None)
    seq.stop_ids = frozenset(eng.eos_token_ids)
    out: list[int] = []
    seq.emit = lambda chunk: out.extend(chunk.token_ids)  # type: ignore[method-assign]
    eng.runner.prefill(seq)
    say("prefilled; engine decode under cProfile")
    steps = 0
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    while seq.kv is not None and steps < n:
        eng.runner.decode_step(seq)
        steps += 1
    prof.disable()
    engine_s = time.perf_counter() - t0

    say("bare model: prefill + decode")
    kv = DynamicCache(config=eng.model.config)
    logits = eng.model(
        input_ids=torch.tensor([ids]), **cache_kw(eng.model, kv), use_cache=True, logits_to_keep=1
    ).logits
    t0 = time.perf_counter()
    for _ in range(steps):
        token = int(torch.argmax(logits[0, -1]).item())
        logits = eng.model(
            input_ids=torch.tensor([[token]]), **cache_kw(eng.model, kv), use_cache=True
        ).logits
    bare_s = time.perf_counter() - t0
    print(f"prompt {len(ids)} tokens, {steps} decode steps, {args.threads} threads")
    print(
        f"engine decode: {1000 * engine_s / steps:.1f} ms/token; "
        f"bare model forward: {1000 * bare_s / steps:.1f} ms/token "
        "(measured after the engine, not interleaved: under a changing load compare with care)"
    )
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime").print_stats(args.top)
    print(buf.getvalue())


if __name__ == "__main__":
    main()
