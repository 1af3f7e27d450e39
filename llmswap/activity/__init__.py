"""What every request cost: token counts and speeds read from upstream answers, activity records (kept in
memory, optionally in SQLite), request/response captures, and the statistics the API serves.

Nothing here knows about aiohttp routes: `ActivityRecorder.begin` is the one entry point the request path
calls (see `recorder.py`), and `llmswap.server.observe.activity` serves what is recorded.
"""
