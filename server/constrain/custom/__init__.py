"""Custom tools: the free-text input under the tool's Lark or regex grammar (llguidance)."""
