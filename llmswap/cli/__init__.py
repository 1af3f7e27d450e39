"""The `llmswap` command: serving, checking a config, the admin commands and the task queue's."""
