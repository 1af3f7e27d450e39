"""The front server: a raw asyncio protocol with httptools in front of aiohttp.

The hot requests — a non-streaming JSON POST to an inference route for a local model — are served here
without aiohttp's request machinery; everything else (other routes, the UI, websockets, streams, peers,
selectors, refusals, anything unusual on the wire) is handed to aiohttp with the connection, unchanged.
See `request` (what is fast), `protocol` (one connection), `serve` and `relay` (one fast request),
`wire` (the response bytes), `site` (the listener and the hand-over).
"""

from llmswap.server.front.site import Front, FrontSite

__all__ = ["Front", "FrontSite"]
