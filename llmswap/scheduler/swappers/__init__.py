"""Eviction policies (`Swapper`s): `group` (llama-swap's groups), `matrix` (allowed combinations,
compiled by `llmswap.config.matrix_dsl` while the config loads), `vram` (memory budgets).
Import the module you need."""
