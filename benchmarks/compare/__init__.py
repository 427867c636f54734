"""One module per comparison of ``agentserve bench NAME``; each exposes ``run(args)``."""
