"""The admin APIs: models (load, unload, running), the task queue, the OpenAI Batch and Files API."""
