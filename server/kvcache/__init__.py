"""The prefix (KV) cache: block index, tiers, tier 2, retention policy, session chains. Imports no engine."""
