"""Chat: deterministic prompt rendering, tool-call parsing, and the chat service."""
