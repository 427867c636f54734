"""Dialect adapters: other APIs' request/response shapes onto the one chat pipeline.

Each dialect converts its request into the internal ``ChatCompletionRequest`` (plus the raw
chat-shaped dict the session key reads) and converts the chat result back; the route
serves it through ``server.api.routes.serve_prepared``. Pure data conversion: nothing here
imports the chat layer.
"""
