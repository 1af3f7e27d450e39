"""The status page: `/ui`, `/ui/` and `/ui/models` (where llama-swap links) serve one static HTML file.

The page (`static/index.html`, inline CSS and JS, no build step) draws everything, its log tail included,
from the one `/api/events` stream, and posts to the load and unload routes for its per-model buttons. It
is open without a key like the rest of `/ui` (see `auth.OPEN_PREFIX`); with `apiKeys` set it asks for a
key (or reads `#key=...` from the URL, or asks in a form) and sends it as a Bearer header on its own fetch
calls. The activity, cancel, machine, KV cache and playground panels are `static/activity.js`; the filters,
log chooser, charts (plain SVG) and hardware view are `static/views.js`; both are served under `/ui/`.
Nothing is fetched from outside the page: it works offline.
"""

from __future__ import annotations

import functools
from importlib import resources

from aiohttp import web

PAGE_PATHS = ("/ui", "/ui/", "/ui/models")


@functools.cache
def page_html() -> bytes:
    return resources.files("llmswap.server.observe").joinpath("static", "index.html").read_bytes()


SCRIPTS = ("activity.js", "views.js")


@functools.cache
def script_js(name: str) -> bytes:
    return resources.files("llmswap.server.observe").joinpath("static", name).read_bytes()


def setup(app: web.Application) -> None:
    for path in PAGE_PATHS:
        app.router.add_get(path, page)
    for name in SCRIPTS:
        app.router.add_get(f"/ui/{name}", functools.partial(script, name=name))


async def script(request: web.Request, *, name: str) -> web.Response:
    """One of the page's scripts (kept apart from the page's own inline one)."""
    return web.Response(body=script_js(name), content_type="text/javascript", charset="utf-8",
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
