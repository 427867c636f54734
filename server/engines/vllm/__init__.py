"""The vLLM engine: every `import vllm` of the server lives in this package."""
