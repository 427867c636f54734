"""POST /tokenize and /detokenize on the embedded model (hermes): the prompt the model sees."""

from __future__ import annotations

import httpx

MODEL = "smollm2-135m-instruct"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def test_tokenize_messages_is_what_chat_completions_renders(server_url, tokenizer) -> None:
    """Checked against the chat path itself (its usage.prompt_tokens) and the tokenizer, not
    against the renderer /tokenize calls: a /tokenize that drifted from chat would fail here."""
    r = httpx.post(
        server_url + "/tokenize", json={"messages": MESSAGES, "tools": TOOLS, "return_text": True}, timeout=30
    )
    assert r.status_code == 200, r.text
    body = r.json()
    text = body["text"]
    assert text.startswith("<|im_start|>system\nBe brief.") and text.endswith("<|im_start|>assistant\n")
    assert '"name": "get_weather"' in text and "Weather in Paris?" in text
    assert body["tokens"] == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert body["count"] == len(body["tokens"]) and body["family"] == "hermes"
    chat = httpx.post(
        server_url + "/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "tool_choice": "auto", "max_tokens": 1},
        timeout=120,
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["prompt_tokens"] == body["count"]
    labels = [seg["label"] for seg in body["segments"]]
    assert "tools block" in labels and "system message" in labels
    no_gen = httpx.post(
        server_url + "/tokenize", json={"messages": MESSAGES, "add_generation_prompt": False}
    ).json()
    assert no_gen["count"] < body["count"]


def test_tokenize_keeps_the_clients_json_key_order(server_url) -> None:
    """Over HTTP (raw body -> request model -> renderer), the tools' schema keys and the call
    arguments reach the prompt in the order the client sent them, as the chat templates of
    the models show them; nothing is sorted on the way."""
    schema = (
        '{"type": "object", "required": ["zeta"], '
        '"properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}}}'
    )
    args = '"{\\"zeta\\": \\"z\\", \\"alpha\\": 1}"'
    call = f'{{"id": "c1", "type": "function", "function": {{"name": "f", "arguments": {args}}}}}'
    raw = (
        '{"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": null, '
        f'"tool_calls": [{call}]}}, {{"role": "tool", "tool_call_id": "c1", "content": "ok"}}], '
        f'"tools": [{{"type": "function", "function": {{"name": "f", "parameters": {schema}}}}}], '
        '"return_text": true}'
    )
    r = httpx.post(
        server_url + "/tokenize", content=raw, headers={"content-type": "application/json"}, timeout=30
    )
    assert r.status_code == 200, r.text
    text = r.json()["text"]
    assert schema in text
    assert '{"name": "f", "arguments": {"zeta": "z", "alpha": 1}}' in text


def test_tokenize_prompt_and_detokenize_round_trip(server_url) -> None:
    r = httpx.post(server_url + "/tokenize", json={"prompt": "hello <|im_start|>", "return_token_strs": True})
    body = r.json()
    assert r.status_code == 200 and body["count"] == len(body["token_strs"])
    back = httpx.post(server_url + "/detokenize", json={"tokens": body["tokens"]}).json()
    assert back == {"prompt": "hello <|im_start|>"}


def test_tokenize_errors_are_400s_that_say_how(server_url) -> None:
    both = httpx.post(server_url + "/tokenize", json={"prompt": "x", "messages": MESSAGES})
    neither = httpx.post(server_url + "/tokenize", json={})
    bad_ids = httpx.post(server_url + "/detokenize", json={"tokens": [-1]})
    wrong_model = httpx.post(server_url + "/tokenize", json={"model": "nope", "prompt": "x"})
    assert both.status_code == neither.status_code == bad_ids.status_code == 400
    assert "exactly one of 'messages'" in both.json()["error"]["message"]
    assert wrong_model.status_code == 400 and wrong_model.json()["error"]["code"] == "model_not_found"


def test_models_lists_the_family(server_url) -> None:
    assert httpx.get(server_url + "/v1/models").json()["data"][0]["family"] == "hermes"
