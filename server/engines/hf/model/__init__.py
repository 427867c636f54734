"""The hf engine's model runtime: the rows forward, the lean forward, shared-prefix attention."""
