"""The status page: `/ui`, `/ui/` and `/ui/models` (where llama-swap links) serve one static HTML file.

The page (`static/index.html`, inline CSS and JS, no build step) draws everything, its log tail included,
from the one `/api/events` stream, and posts to the load and unload routes for its per-model buttons. It
is open without a key like the rest of `/ui` (see `auth.OPEN_PREFIX`); with `apiKeys` set it asks for a
key (or reads `#key=...` from the URL) and sends it as a Bearer header on its own fetch calls. The
activity, cancel, machine and playground panels are `static/activity.js`, served at `/ui/activity.js`.
"""

from __future__ import annotations

import functools
from importlib import resources

from aiohttp import web

PAGE_PATHS = ("/ui", "/ui/", "/ui/models")


@functools.cache
def page_html() -> bytes:
    return resources.files("llmswap.server.observe").joinpath("static", "index.html").read_bytes()


@functools.cache
def script_js() -> bytes:
    return resources.files("llmswap.server.observe").joinpath("static", "activity.js").read_bytes()


def setup(app: web.Application) -> None:
    for path in PAGE_PATHS:
        app.router.add_get(path, page)
    app.router.add_get("/ui/activity.js", script)


async def script(request: web.Request) -> web.Response:
    """The activity, machine and playground panels' script (kept apart from the page's own)."""
    return web.Response(body=script_js(), content_type="text/javascript", charset="utf-8",
                        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})


async def page(request: web.Request) -> web.Response:
    return web.Response(
        body=page_html(),
        content_type="text/html",
        charset="utf-8",
        headers={
            "Cache-Control": "no-cache",
            "X-Content-Type-Options": "nosniff",
            # The key may sit in the URL fragment; fragments are never sent, but say so for links too.
            "Referrer-Policy": "no-referrer",
        },
    )
