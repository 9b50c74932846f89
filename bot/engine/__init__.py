"""The local vLLM engine: a real vLLM V1 engine on CPU with a tiny dummy-weight model."""
