"""The mask library: tries, envelopes, argument grammars, constraints. Imports nothing above it."""
