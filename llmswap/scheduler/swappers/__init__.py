"""Eviction policies (`Swapper`s): `group` (llama-swap's groups), `matrix` (allowed combinations, with
its set language in `matrix_dsl`). Import the module you need; nothing is imported here so that the
config loader can import `matrix_dsl` without pulling in the others."""
