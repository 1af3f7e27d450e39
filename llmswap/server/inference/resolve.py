"""Which model a request names, and where that name sits in its body: the JSON `model`, a multipart or
urlencoded form field, or the `model` query parameter (llama-swap's `FetchContext`, reference 5.3).

Pure functions over the raw body bytes. Multipart bodies are scanned in place: only the part headers and
the small `model`/`stream` values are decoded, file parts are never copied, and the `model` value's byte
offsets are kept so a rename can be spliced in without re-encoding the form.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal
from urllib.parse import quote_plus, unquote_plus

from aiohttp.helpers import parse_mimetype

from llmswap.config.model import Config

Source = Literal["json", "multipart", "form", "query", "none"]


class MalformedRequest(ValueError):
    """The body cannot be read as what its Content-Type says (answered with 400)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Span:
    """Where a value sits in the raw body: `body[start:end]`."""

    start: int
    end: int


@dataclass(frozen=True)
class Identified:
    """What the request asks for. `model` is "" when no model could be identified."""

    model: str
    streaming: bool
    source: Source
    document: dict[str, Any] | None = None  # the parsed JSON object, when the body is one
    model_span: Span | None = None  # the model value's bytes in a multipart or urlencoded body
    boundary: str | None = None  # of a multipart body


def is_json_type(content_type: str) -> bool:
    mime = parse_mimetype(content_type)
    return (mime.type, mime.subtype) == ("application", "json") or mime.suffix == "json"


def identify(method: str, content_type: str, body: bytes | bytearray, query: Mapping[str, str]) -> Identified:
    """Find the model id and the stream flag of a request. Raises `MalformedRequest` for a body that is not
    what its Content-Type says (invalid JSON, a multipart body without a boundary)."""
    found = _from_body(method, content_type, body)
    if found.model:
        return found
    # The query parameter is the only source for GET; for other methods it is a fallback llama-swap does
    # not have, for clients that put the model in the URL of a body they cannot change.
    model = query.get("model", "")
    if model:
        streaming = found.streaming or query.get("stream", "") == "true"
        return Identified(model, streaming, "query", found.document, None, found.boundary)
    return found


def _from_body(method: str, content_type: str, body: bytes | bytearray) -> Identified:
    if method in ("GET", "HEAD") or not body:
        return Identified("", False, "none")
    mime = parse_mimetype(content_type) if content_type else None
    if content_type and is_json_type(content_type):
        return _from_document(_parse_json(body, content_type))
    if mime is not None and (mime.type, mime.subtype) == ("multipart", "form-data"):
        boundary = mime.parameters.get("boundary", "")
        if not boundary:
            raise MalformedRequest(
                "the multipart/form-data request has no boundary in its Content-Type header; "
                "let the HTTP client build the header (e.g. curl -F) instead of setting it by hand"
            )
        return _from_multipart(body, boundary)
    # llama-server reads a JSON body whatever its Content-Type says, and `curl -d '{...}'` without a header
    # sends one labelled application/x-www-form-urlencoded; llama-swap then finds no model. Here a body that
    # parses as a JSON object is taken as JSON under any other Content-Type (or none).
    if body.lstrip()[:1] == b"{":
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):
            document = None
        if isinstance(document, dict):
            return _from_document(document)
    if mime is not None and (mime.type, mime.subtype) == ("application", "x-www-form-urlencoded"):
        return _from_urlencoded(body)
    return Identified("", False, "none")


# Python's json module recurses once per level of nesting: a body of 100k `[` exhausts the stack.
NESTED_TOO_DEEP = "the request body's JSON is nested too deeply to read"


_DECODER = json.JSONDecoder()


def _parse_json(body: bytes | bytearray, content_type: str) -> Any:
    try:
        if body[:1] == b"{" and b"\x00" not in body[:4]:
            # UTF-8 for certain (json.loads would detect UTF-16/32 by the NULs and BOMs ruled out here):
            # decoded directly, without json.loads' detection of the encoding on every request.
            return _DECODER.decode(body.decode("utf-8", "surrogatepass"))  # as json.loads decodes
        return json.loads(body)
    except UnicodeDecodeError as exc:
        raise MalformedRequest(f"the request body is not UTF-8 encoded JSON ({exc})") from None
    except ValueError as exc:
        raise MalformedRequest(
            f"the request body is not valid JSON ({exc}); the Content-Type header says {content_type!r}"
        ) from None
    except RecursionError:
        raise MalformedRequest(NESTED_TOO_DEEP) from None


def _from_document(document: Any) -> Identified:
    if not isinstance(document, dict):
        return Identified("", False, "none")
    model = document.get("model")
    if model is not None and not isinstance(model, str):
        raise MalformedRequest(f"model must be a string naming a configured model, got {json.dumps(model)}")
    return Identified(model or "", document.get("stream") is True, "json", document)


# -------------------------------------------------------------------------------- multipart


@dataclass(frozen=True)
class FormPart:
    """One part of a multipart/form-data body, located without copying its content."""

    name: str
    filename: str | None
    content: Span


_DISPOSITION_PARAM = re.compile(r';\s*([A-Za-z0-9_*-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;]*)')


def multipart_parts(body: bytes | bytearray, boundary: str) -> Iterator[FormPart]:
    """The parts of a multipart/form-data body, in order. Raises `MalformedRequest` if the body does not
    follow the boundary its header announced."""
    delimiter = b"--" + boundary.encode("latin-1")
    view = memoryview(body)
    position = _find(body, delimiter, 0)
    if position < 0:
        raise MalformedRequest(f"the multipart body does not contain its boundary {boundary!r}")
    while True:
        after = position + len(delimiter)
        if bytes(view[after : after + 2]) == b"--":
            return  # the closing delimiter
        headers_start = _skip_line_end(body, after)
        headers_end = _find(body, b"\r\n\r\n", headers_start)
        if headers_end < 0:
            raise MalformedRequest("a multipart part has no end of headers (a blank line)")
        headers = bytes(view[headers_start:headers_end]).decode("utf-8", errors="replace")
        content_start = headers_end + 4
        next_delimiter = _find(body, b"\r\n" + delimiter, content_start)
        if next_delimiter < 0:
            raise MalformedRequest(f"the multipart body is truncated: no closing boundary {boundary!r}")
        name, filename = _disposition(headers)
        yield FormPart(name, filename, Span(content_start, next_delimiter))
        position = next_delimiter + 2


def _find(body: bytes | bytearray, needle: bytes, start: int) -> int:
    return body.find(needle, start)


def _skip_line_end(body: bytes | bytearray, position: int) -> int:
    if body[position : position + 2] == b"\r\n":
        return position + 2
    if body[position : position + 1] == b"\n":
        return position + 1
    return position


def _disposition(headers: str) -> tuple[str, str | None]:
    for line in headers.split("\r\n"):
        key, _, value = line.partition(":")
        if key.strip().lower() != "content-disposition":
            continue
        params = {k.lower(): _unquote(v.strip()) for k, v in _DISPOSITION_PARAM.findall(value)}
        return params.get("name", ""), params.get("filename")
    return "", None


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


_SMALL_FIELD = 4096  # a model name or a stream flag; anything longer is not one


def _from_multipart(body: bytes | bytearray, boundary: str) -> Identified:
    model = ""
    span: Span | None = None
    streaming = False
    for part in multipart_parts(body, boundary):
        if part.filename is not None or part.content.end - part.content.start > _SMALL_FIELD:
            continue
        if part.name == "model" and span is None:
            model = bytes(body[part.content.start : part.content.end]).decode("utf-8", errors="replace")
            span = part.content
        elif part.name == "stream":
            streaming = bytes(body[part.content.start : part.content.end]).strip() == b"true"
    return Identified(model.strip(), streaming, "multipart", None, span, boundary)


# -------------------------------------------------------------------------------- urlencoded

_PAIR = re.compile(rb"[^&]+")


def _from_urlencoded(body: bytes | bytearray) -> Identified:
    model = ""
    span: Span | None = None
    streaming = False
    for match in _PAIR.finditer(body):
        raw_key, sep, raw_value = match.group().partition(b"=")
        key = unquote_plus(raw_key.decode("latin-1"))
        value = unquote_plus(raw_value.decode("latin-1"), encoding="utf-8", errors="replace")
        if key == "model" and span is None:
            model = value
            start = match.start() + len(raw_key) + len(sep)
            span = Span(start, match.end())
        elif key == "stream":
            streaming = value == "true"
    return Identified(model, streaming, "form", None, span)


def encode_form_value(found: Identified, value: str) -> bytes:
    """`value` encoded the way the request's body encodes the field it replaces."""
    if found.source == "form":
        return quote_plus(value).encode()
    return value.encode()


def renamed(found: Identified, raw: bytearray, model: str) -> tuple[Identified, bytearray]:
    """The request as if the client had named `model` where it named the old one (a profile pin or a
    selector's choice): the JSON `model`, the form field, or (for the query) only `found`, the caller
    rewrites the query string it forwards."""
    if found.document is not None and found.source == "json":
        document = {**found.document, "model": model}
        body = bytearray(json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode())
        return replace(found, model=model, document=document), body
    if found.model_span is not None and found.source in ("multipart", "form"):
        span = found.model_span
        value = encode_form_value(found, model)
        body = raw[: span.start] + value + raw[span.end :]
        return replace(found, model=model, model_span=Span(span.start, span.start + len(value))), body
    return replace(found, model=model), raw


NOT_FOUND = "no router for requested model"  # llama-swap's words, which tools match: the message starts so
SHOWN_NAMES = 20


NO_MODEL = "no model id could be identified"  # llama-swap's words: the message starts so


def no_model_message(config: Config, asked: str = "") -> str:
    """The 404 for a request that names no model (or one the active profile turns off): where llmswap reads
    the id from, and what could be asked for."""
    if asked:
        return f"{NO_MODEL}: the active profile disables {asked!r} (PUT /api/profiles/active changes it)"
    names = _askable(config)
    listed = f"; available are {', '.join(names[:SHOWN_NAMES])}" if names else ""
    return (f'{NO_MODEL}: name one as "model" in the JSON body (a form field for uploads, or ?model= in the '
            f"URL){listed}")


def _askable(config: Config) -> list[str]:
    return sorted(
        {m.id for m in config.models.values() if not m.unlisted}
        | {alias for alias, target in config.aliases.items()
           if target in config.models and not config.models[target].unlisted}
        | {s.id for s in config.selectors.values() if not s.unlisted}
        | {model for peer in config.peers.values() for model in peer.models}
    )


def unknown_model_message(config: Config, name: str) -> str:
    """The 404 for a model no router serves: llama-swap's words, then the name asked for and what could be
    asked for instead (listed models, their aliases, selectors and peers' models; the first twenty)."""
    names = _askable(config)
    if not names:
        return f"{NOT_FOUND} {name!r}: no model is configured"
    shown = ", ".join(names[:SHOWN_NAMES])
    more = (f" and {len(names) - SHOWN_NAMES} more (GET /v1/models lists them)"
            if len(names) > SHOWN_NAMES else "")
    return f"{NOT_FOUND} {name!r}: available are {shown}{more}"
