"""Tool masking: tool_choice plans, the tool state machine, token-trie masks (see README.md)."""
