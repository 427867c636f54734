"""The ids that end a reply are decided in one place, from the model and its family's data."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import yaml

from server.chat.service import ChatService
from server.config import load_settings
from server.engines.base import GenerationRequest, SamplingParams
from server.engines.hf.engine import HFEngine
from server.families.end_tokens import family_end_tokens, reply_end_ids
from server.families.family import FAMILIES_DIR, family_names, load_family
from server.families.model_facts import decide
from server.families.tokenizers import llama3_tokenizer
from server.metrics import Metrics
from server.protocol import ChatCompletionRequest
from tests.engines.fake import ScriptedEngine


def test_reply_end_ids_order_and_dedup(tokenizer):
    ids = reply_end_ids(tokenizer, ["<|im_end|>", "<|im_start|>", "<|no such token|>"], [2, 0, 7])
    assert ids[0] == tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") in ids  # an end token the vocabulary knows
    assert ids[-1] == 7 and len(ids) == len(set(ids))
    assert reply_end_ids(None, ["<|im_end|>"], 5) == (5,)


@pytest.mark.parametrize("name", family_names())
def test_every_family_names_its_end_tokens_in_its_file(name):
    data = yaml.safe_load((FAMILIES_DIR / f"{name}.yaml").read_text())
    assert family_end_tokens(load_family(name)) == tuple(data["test_model"]["eos"])
    assert family_end_tokens(load_family(name))  # every family says how its turns end


def test_the_family_end_tokens_reach_the_engine_and_the_masks():
    tok = llama3_tokenizer()  # its EOS is <|eot_id|>; llama3_json's turns also end at <|eom_id|>
    eom = tok.convert_tokens_to_ids("<|eom_id|>")
    assert (
        eom
        not in ScriptedEngine(tok, settings=load_settings(device="cpu", model_family="hermes")).eos_token_ids
    )
    settings = load_settings(device="cpu", model_family="llama3_json")
    facts = decide(settings, tok, None)  # decided before any engine, and only there
    assert eom in facts.end_ids and facts.end_ids[0] == tok.eos_token_id
    eng = ScriptedEngine(tok, settings=settings)
    assert eng.eos_token_ids == facts.end_ids and eng.facts.family.family.ref == "llama3_json"
    service = ChatService(eng, settings, Metrics())
    assert service.family is eng.facts.family.family  # chat reads the family the engine was built with
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    raw = {
        "model": settings.served_model_name,
        "messages": [{"role": "user", "content": "x"}],
        "tools": [tool],
    }
    prepared = service.prepare_chat(ChatCompletionRequest(**raw), {}, raw_body=raw)
    assert prepared.tool_spec is not None and prepared.tool_spec.eos_token_ids == eng.eos_token_ids
    assert service.compiler.eos_token_ids == eng.eos_token_ids  # a spec without EOS ids gets them too


def test_a_family_end_token_stops_the_hf_engine(hf_engine):
    start = hf_engine.tokenizer.convert_tokens_to_ids("<|im_start|>")  # no family ends a turn with it
    sampling = SamplingParams(max_tokens=3, temperature=0.0, logit_bias=((start, 100.0),))

    async def run(engine: HFEngine) -> tuple[list[int], str | None]:
        ids: list[int] = []
        reason = None
        async for chunk in engine.generate(GenerationRequest("end-tokens", [1, 9690, 198], sampling)):
            ids += chunk.token_ids
            reason = chunk.finish_reason
        return ids, reason

    assert start not in hf_engine.eos_token_ids
    assert asyncio.run(run(hf_engine)) == ([start] * 3, "length")
    facts = replace(hf_engine.facts, end_ids=(*hf_engine.facts.end_ids, start))  # a family ending at it
    engine = HFEngine(hf_engine.settings, facts, model=hf_engine.model)
    try:
        assert start in engine.eos_token_ids
        assert asyncio.run(run(engine)) == ([], "stop")  # the family's end token ends the reply
    finally:
        asyncio.run(engine.shutdown())
