"""The hf engine's linears: fused projections, oneDNN, the panel kernel. Imports nothing above it."""
