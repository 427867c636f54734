"""Engines: the seam between the chat service and the model runtime (hf, vllm)."""
