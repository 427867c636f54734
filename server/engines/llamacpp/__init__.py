"""The llamacpp engine: GGUF files through llama.cpp (llama-cpp-python's low-level API)."""
