"""The hf engine: transformers + torch, batched decode, token-granular prefix cache."""
