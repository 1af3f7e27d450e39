"""The demo upstream: a small OpenAI- and Anthropic-compatible model server for examples, tests, benchmarks.

Run it as a real process: ``python -m llmswap.demo --port N --model-name X``. It answers with deterministic
text that names the model, so whoever reads a response can tell which upstream served it, and it has knobs
that make it fail the ways real model servers fail (slow start, crash, never healthy, ignoring SIGTERM,
out of memory).
"""
