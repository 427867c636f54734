"""Anthropic Messages (``POST /v1/messages``, ``/v1/messages/count_tokens``) as a thin adapter.

A Messages body becomes the internal ``ChatCompletionRequest`` plus a chat-shaped raw body
(``request.py``, blocks read by ``blocks.py``); the chat completion comes back as a Message
(``response.py``) or as Anthropic stream events (``stream.py``); errors take Anthropic's
shape (``errors.py``); ids map both ways (``ids.py``). The route is ``server/api/messages.py``.
"""
