"""KV caches kept across swaps: llama-server's slots saved before a stop and restored after the next start.

`disk.py` owns the files (staleness, the size bound), `keeper.py` the calls to llama-server, `KvKeeper` is
what a `Process` holds. Between `process` (its user) and `machine` in the layers.
"""

from llmswap.kvcache.disk import Save, SaveFolder, all_saves, hold_bound
from llmswap.kvcache.keeper import KvKeeper, KvReport

__all__ = ["KvKeeper", "KvReport", "Save", "SaveFolder", "all_saves", "hold_bound"]
