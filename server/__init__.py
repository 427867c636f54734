"""agentserve: an OpenAI-compatible inference server built for AI agents."""

__version__ = "0.1.0"
