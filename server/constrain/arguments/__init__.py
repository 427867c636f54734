"""Argument grammars: the seam, the xgrammar and outlines backends, Qwen3-Coder's XML parameters."""
