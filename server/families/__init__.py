"""Model families: prompt layout and tool-call format as data (grammars/families, grammars/envelopes)."""
