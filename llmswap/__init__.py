"""llmswap: a model-swapping reverse proxy for local OpenAI-compatible model servers."""

__version__ = "0.1.0"
