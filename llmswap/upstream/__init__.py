"""The one dispatch path below the HTTP routes and the task queue: pool, filters, forward, recording.

Imports run down the layers: `llmswap.server` and `llmswap.tasks` use this package; it uses the router.
"""

from llmswap.upstream.client import UpstreamPool
from llmswap.upstream.dispatcher import (
    Dispatcher,
    Lease,
    Origin,
    UpstreamAnswer,
    UpstreamUnreachable,
)

__all__ = [
    "Dispatcher",
    "Lease",
    "Origin",
    "UpstreamAnswer",
    "UpstreamPool",
    "UpstreamUnreachable",
]
