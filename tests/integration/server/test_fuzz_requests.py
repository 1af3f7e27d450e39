"""Random requests — methods, every route llmswap serves (and paths beside them), headers, bodies — against a
real llmswap with a demo upstream and a task queue, over raw sockets: every one is answered, none with a
5xx that is llmswap's own, and nothing is logged with a traceback.

What counts as llmswap's fault: any 5xx llmswap wrote itself. A 5xx the demo upstream answered and llmswap
relayed (it carries the demo's `X-Demo-Model` header) is the upstream's, and allowed: a proxy passes its
upstream's status on. A connection closed without any answer counts as a failure too.

Bounded for CI: a fixed number of derandomized examples. For a longer hunt, LLMSWAP_FUZZ_EXAMPLES=3000 raises
the count and LLMSWAP_FUZZ_RANDOM=1 draws new examples on every run.
The server runs on its own event loop in a thread, so hypothesis drives a plain synchronous test.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import re
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmswap.config.model import Config, TasksConfig
from tests.helpers.models import demo_config, exclusive_config
from tests.integration.server.conftest import serving

Request = tuple[str, str, list[tuple[str, str]], bytes, bool]  # method, path, headers, body, sent chunked
EXAMPLES = int(os.environ.get("LLMSWAP_FUZZ_EXAMPLES", "150"))
RANDOM = bool(os.environ.get("LLMSWAP_FUZZ_RANDOM"))
READ_WITHIN = 20.0  # seconds for one answer: generous, a model start is in it


@dataclass
class Background:
    """llmswap served on its own loop in a thread; the routes it has; records logged with a traceback."""

    config: Config
    url: str = ""
    routes: list[tuple[str, str]] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)
    _ready: threading.Event = field(default_factory=threading.Event)
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with serving(self.config) as served:
            self.url = served.url
            self.routes = sorted({(route.method, route.resource.canonical)
                                  for route in served.app.router.routes() if route.resource is not None})
            self._ready.set()
            await self._stop.wait()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)


class _Tracebacks(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or record.levelno >= logging.ERROR:
            self.into.append(f"{record.name}: {record.getMessage()}")


@pytest.fixture(scope="module")
def llmswap_in_a_thread(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Background]:
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    background = Background(exclusive_config(demo_config("m"), tasks=TasksConfig(db=tmp / "tasks.sqlite")))
    # Earlier tests' garbage is finalised here, before this llmswap's loop runs: a finaliser that schedules
    # work on the running loop (an SDK client left open does) would otherwise log its failure as this one's.
    gc.collect()
    handler = _Tracebacks(background.tracebacks)
    logging.getLogger().addHandler(handler)
    thread = threading.Thread(target=background.run, name="llmswap-fuzz", daemon=True)
    thread.start()
    try:
        assert background._ready.wait(30), "llmswap did not start"
        yield background
    finally:
        background.stop()
        thread.join(30)
        logging.getLogger().removeHandler(handler)


# -------------------------------------------------------------------------------- strategies

TOKEN = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.!~*'()%", max_size=12)
PATH_CHARS = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_.~%/:@!$&'()*+,;=?#[]", max_size=24)
HEADER_VALUE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
                       max_size=40)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
MODEL = st.sampled_from(["m", "", "nope", "m/x", "peer:m"]) | st.text(max_size=10)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["empty", "chat", "json", "deep", "binary", "form", "multipart"]))
    if kind == "empty":
        return b""
    if kind == "chat":
        body = {"model": draw(MODEL), "messages": draw(st.lists(st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "x"]), "content": JSON}), max_size=3)),
            "max_tokens": draw(st.integers(0, 4)), "stream": draw(st.booleans())}
        extra = draw(st.dictionaries(st.text(max_size=8), JSON, max_size=3))
        return json.dumps({**extra, **body}).encode()
    if kind == "json":
        return json.dumps(draw(JSON)).encode()
    if kind == "deep":
        depth = draw(st.integers(1000, 50_000))
        return b"[" * depth + b"]" * draw(st.sampled_from([depth, 0, depth // 2]))
    if kind == "form":
        return f"model={draw(MODEL)}&x={draw(st.text(max_size=10))}".encode(errors="replace")
    if kind == "multipart":
        name = draw(st.sampled_from(["file", "purpose", "model", ""]))
        return (f'--b\r\nContent-Disposition: form-data; name="{name}"; filename="f.jsonl"\r\n\r\n'
                f"{draw(st.text(max_size=30))}\r\n--b--\r\n").encode(errors="replace")
    return draw(st.binary(max_size=200))


HEADERS = st.lists(st.one_of(
    st.tuples(st.just("Content-Type"), st.sampled_from([
        "application/json", "text/plain", "multipart/form-data; boundary=b", "multipart/form-data",
        "application/x-www-form-urlencoded", "application/json; charset=latin-1", "*/*"]) | HEADER_VALUE),
    st.tuples(st.just("Content-Encoding"), st.sampled_from(["gzip", "deflate", "br", "zstd", "x"])),
    st.tuples(st.just("Accept"), st.sampled_from(["text/html", "text/plain", "application/json",
                                                  "text/event-stream", "*/*"])),
    st.tuples(st.sampled_from(["X-Priority", "Authorization", "Origin", "Range", "Expect", "Cookie",
                               "Upgrade", "X-Forwarded-For", "If-None-Match", "Accept-Encoding"]),
              HEADER_VALUE),
    st.tuples(TOKEN.filter(bool), HEADER_VALUE),
), max_size=5)


@st.composite
def requests(draw: st.DrawFn, routes: list[tuple[str, str]]) -> Request:
    method, path = draw(st.sampled_from(routes))
    path = re.sub(r"\{[^}]*\}", lambda _: draw(st.sampled_from(["1", "99999999999999999999999", "m", "x%00",
                                                                  "file-1", "batch_1"]) | TOKEN), path)
    if draw(st.booleans()):
        path += draw(PATH_CHARS)
    if draw(st.integers(0, 9)) == 0:
        method = draw(st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD", "BREW"]))
    if path.endswith("/upstream/m") or ("/upstream/" in path and draw(st.booleans())):
        path = "/upstream/m/" + draw(PATH_CHARS)
    return method, path or "/", draw(HEADERS), draw(bodies()), draw(st.booleans())


@st.composite
def inference_requests(draw: st.DrawFn) -> Request:
    """A request shaped like a real one for the demo model, with random details: it reaches the upstream."""
    path = draw(st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/embeddings",
                                 "/completion", "/v1/rerank", "/upstream/m/v1/chat/completions"]))
    body = {"model": "m", "messages": [{"role": "user", "content": draw(st.text(max_size=20))}],
            "prompt": draw(st.text(max_size=10)), "input": draw(st.text(max_size=10)),
            "max_tokens": draw(st.integers(0, 4)), "stream": draw(st.booleans())}
    headers = [("Content-Type", "application/json"), *draw(HEADERS.filter(
        lambda pairs: not any(name.lower() in ("content-type", "content-encoding") for name, _ in pairs)))]
    return "POST", path, headers, json.dumps(body).encode(), draw(st.booleans())


def http_exchange(url: str, method: str, path: str, headers: list[tuple[str, str]], body: bytes,
                  chunked: bool) -> tuple[int, dict[str, str], bytes]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
        payload = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
    else:
        lines.append(f"Content-Length: {len(body)}")
        payload = body
    raw = "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + payload
    with socket.create_connection((host, int(port)), timeout=READ_WITHIN) as sock:
        sock.sendall(raw)
        answer = b""
        # Up to the end of the head: event streams (/api/events, /logs/stream) never end.
        while b"\r\n\r\n" not in answer and (chunk := sock.recv(65536)):
            answer += chunk
    head, _, rest = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parts = status_line.split(" ")
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    pairs = (line.split(":", 1) for line in header_lines if ":" in line)
    return status, {name.strip().lower(): value.strip() for name, value in pairs}, rest


def test_random_requests_get_no_5xx_of_llmswaps_own_and_log_no_traceback(
    llmswap_in_a_thread: Background,
) -> None:
    background = llmswap_in_a_thread
    seen: Counter[str] = Counter()  # the kinds of answers reached: the run must get past the front door

    @settings(max_examples=EXAMPLES, derandomize=not RANDOM, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(requests(background.routes) | inference_requests())
    def one(request: Request) -> None:
        method, path, headers, body, chunked = request
        try:
            status, answer_headers, answer = http_exchange(background.url, method, path, headers, body,
                                                           chunked)
        except TimeoutError:
            raise AssertionError(f"no answer within {READ_WITHIN}s: {method} {path}") from None
        assert status != 0, f"closed without an answer: {method} {path} {headers}"
        relayed = "x-demo-model" in answer_headers
        seen["relayed" if relayed else f"{status // 100}xx"] += 1
        assert status < 500 or relayed, f"{status} for {method} {path} {headers}: {answer[:300]!r}"
        assert not background.tracebacks, background.tracebacks

    one()
    assert seen["relayed"] and seen["2xx"] and seen["4xx"], seen
