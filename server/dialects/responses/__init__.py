"""The OpenAI Responses API (``POST /v1/responses``) as a thin adapter onto Chat Completions.

- ``tools.py``: tools and tool_choice (function, namespace, custom; hosted tools dropped);
- ``request.py``: a Responses body → a chat-shaped dict (input items → messages);
- ``response.py``: a chat completion → a ``response`` object (output items, usage, cache);
- ``stream.py``: chat stream chunks → Responses stream events;
- ``store.py``: the bounded per-tenant store behind ``store`` / ``previous_response_id``.
"""
