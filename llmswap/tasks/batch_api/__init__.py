"""OpenAI's Batch and Files API over the task queue."""
