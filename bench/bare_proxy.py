"""The least a Python proxy on aiohttp can do: read the request, send it upstream, answer with the answer.

Run: `python -m bench.bare_proxy PORT UPSTREAM_URL`. One aiohttp server, one aiohttp client session set up as
llmswap's (no connection limit, no decompression, no cookies, no headers of its own), nothing else: no model
lookup, scheduler, recording, log or metrics. `bench.wrk_nginx` sets llmswap against it in the same rounds, so
that what llmswap's own work costs per request is told apart from what the library costs any proxy built on
it (the floor of issue 25: aiohttp's server and client are the one stack).
"""

from __future__ import annotations

import sys

import aiohttp
from aiohttp import web

_DROPPED = frozenset({"host", "content-length", "transfer-encoding", "connection"})


def app(upstream: str) -> web.Application:
    session_key = web.AppKey("session", aiohttp.ClientSession)

    async def relay(request: web.Request) -> web.Response:
        body = await request.read()
        headers = {name: value for name, value in request.headers.items() if name.lower() not in _DROPPED}
        async with request.app[session_key].request(request.method, upstream + request.path_qs, data=body,
                                                     headers=headers, allow_redirects=False) as answer:
            data = await answer.read()
            return web.Response(body=data, status=answer.status,
                                headers={"Content-Type": answer.headers.get("Content-Type", "")})

    async def session(application: web.Application):  # type: ignore[no-untyped-def]
        application[session_key] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"))
        yield
        await application[session_key].close()

    application = web.Application()
    application.cleanup_ctx.append(session)
    application.router.add_route("*", "/{tail:.*}", relay)
    return application


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m bench.bare_proxy PORT UPSTREAM_URL", file=sys.stderr)
        return 2
    web.run_app(app(argv[1].rstrip("/")), host="127.0.0.1", port=int(argv[0]), print=None, access_log=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
