"""The hf engine's KV memory: caches grown in place, the slot pool, cache blocks. Imports nothing above it."""
