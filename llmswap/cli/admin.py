"""`llmswap ps`, `llmswap load MODEL`, `llmswap unload [MODEL]`: the everyday admin tasks, done over HTTP
against a running llmswap (`--url`, default http://127.0.0.1:8080; the API key, when the server has
`apiKeys`, from the LLMSWAP_API_KEY environment variable).

- `ps` reads the `snapshot` frame of `GET /api/events` and prints the models that run or have requests
  (`--all`: every model) as a table, or as JSON with `--json`;
- `load` posts `/api/models/load/<model>` and returns once the model is ready, or fails with the reason;
- `unload` posts `/api/models/unload[/<model>]`.

Exit status 0 on success, 1 when the server refused or could not be reached (a one-line reason on stderr,
never a traceback), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from llmswap.cli.args import flag, parse_listen

API_KEY_ENV = "LLMSWAP_API_KEY"
URL_ENV = "LLMSWAP_URL"  # the running llmswap's address, when --url does not give it
DEFAULT_URL = "http://127.0.0.1:8080"
COMMANDS = ("ps", "load", "unload")
TIMEOUT = 10.0  # seconds for every call but `load`, which waits as long as the model takes to start
RUNNING_STATES = ("starting", "ready", "stopping", "sleeping")  # listed by `ps` (sleeping: its process lives)


class AdminError(Exception):
    """Why a command failed, as the user reads it."""


def add_parsers(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        parser = subcommands.add_parser(name, help=help_text, description=f"{help_text}. The API key, when "
                                        f"the server needs one, is read from ${API_KEY_ENV}.")
        flag(parser, "url", default=os.environ.get(URL_ENV, "").strip() or DEFAULT_URL,
             help=f"the running llmswap's address: a URL or HOST:PORT, as --listen takes it (default "
                  f"${URL_ENV}, else {DEFAULT_URL})")
        return parser

    ps = command("ps", "show the models that run or have requests: state, footprint, in flight, queued")
    flag(ps, "all", action="store_true", help="every configured model, running or not")
    ps.add_argument("-a", action="store_true", dest="all", help=argparse.SUPPRESS)
    flag(ps, "json", action="store_true", help="print JSON instead of a table")
    flag(ps, "all-hosts", action="store_true", dest="all_hosts",
         help="this host and every discover: true peer, as the server sees them (/api/hosts)")
    load = command("load", "start a model without sending it a request; wait until it is ready")
    load.add_argument("model", metavar="MODEL", help="a model id or alias")
    unload = command("unload", "stop a model (every model when none is named)")
    unload.add_argument("model", metavar="MODEL", nargs="?", help="a model id or alias (default: all)")


def run(args: argparse.Namespace) -> int:
    try:
        client = Client(args.url, os.environ.get(API_KEY_ENV, "").strip())
        if args.command == "ps" and args.all_hosts:
            print(ps_hosts(client, as_json=args.json), end="")
        elif args.command == "ps":
            print(ps(client, show_all=args.all, as_json=args.json), end="")
        elif args.command == "load":
            print(load(client, args.model))
        else:
            print(unload(client, args.model))
    except AdminError as err:
        print(f"llmswap {args.command}: {err}", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------------------------- HTTP


@dataclass(frozen=True)
class Client:
    url: str
    api_key: str = ""

    def __post_init__(self) -> None:
        url = self.url
        if "://" not in url:  # HOST:PORT, as --listen takes it
            try:
                host, port = parse_listen(url)
            except argparse.ArgumentTypeError as err:
                raise AdminError(f"--url {url!r} is neither a URL nor HOST:PORT ({err}), e.g. "
                                 f"{DEFAULT_URL}") from None
            shown = f"[{host}]" if ":" in host else host or "127.0.0.1"
            url = f"http://{shown}:{port}"
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise AdminError(f"--url {self.url!r} is not an http:// or https:// address, e.g. {DEFAULT_URL}")
        object.__setattr__(self, "url", url.rstrip("/"))

    def open(self, method: str, path: str, timeout: float | None = TIMEOUT) -> Any:
        """The open response to `method path`; an error status or an unreachable server → AdminError."""
        request = urllib.request.Request(self.url + path, method=method)
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            return urllib.request.urlopen(request, timeout=timeout)
        except urllib.error.HTTPError as err:
            raise AdminError(self._refusal(err)) from None
        except urllib.error.URLError as err:
            raise AdminError(f"cannot reach llmswap at {self.url} ({_reason(err.reason)}): is it running? "
                             "--url gives its address") from None
        except TimeoutError:
            raise AdminError(f"llmswap at {self.url} did not answer within {timeout:g}s") from None
        except OSError as err:
            raise AdminError(f"cannot reach llmswap at {self.url} ({_reason(err)})") from None

    def call(self, method: str, path: str, timeout: float | None = TIMEOUT) -> bytes:
        with self.open(method, path, timeout) as response:
            try:
                return bytes(response.read())
            except (TimeoutError, OSError) as err:
                raise AdminError(f"llmswap at {self.url} broke off its answer ({_reason(err)})") from None

    def _refusal(self, err: urllib.error.HTTPError) -> str:
        try:
            message = json.loads(err.read())["error"]["message"]
        except (ValueError, KeyError, TypeError, OSError):
            message = err.reason
        if err.code == 401:
            hint = f"set {API_KEY_ENV} to one of its apiKeys" if not self.api_key else f"check {API_KEY_ENV}"
            return f"{message} (HTTP 401): {hint}"
        return f"{message} (HTTP {err.code})"


def _reason(error: object) -> str:
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    return str(getattr(error, "strerror", None) or error)


def model_path(action: str, model: str) -> str:
    return f"/api/models/{action}/{quote(model, safe='/')}"


# ---------------------------------------------------------------------------------------------- commands


def load(client: Client, model: str) -> str:
    body = json.loads(client.call("POST", model_path("load", model), timeout=None))
    took = body.get("last_start_seconds")
    return f"{body.get('model', model)}: ready" + (f" (its last start took {took:.2f}s)" if took else "")


def unload(client: Client, model: str | None) -> str:
    if model is None:
        client.call("POST", "/api/models/unload")
        return "every model stopped"
    client.call("POST", model_path("unload", model))
    return f"{model}: stopped"


def fetch_snapshot(client: Client) -> dict[str, Any]:
    """The `snapshot` frame a new `/api/events` stream sends after llama-swap's opening frames."""
    with client.open("GET", "/api/events") as response:
        try:
            for raw in response:
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                if not line.startswith("data:"):
                    continue
                envelope = json.loads(line[len("data:"):])
                if envelope.get("type") == "snapshot":
                    return dict(json.loads(envelope["data"]))
        except (ValueError, KeyError, TypeError):
            raise AdminError(f"{client.url}/api/events is not an llmswap event stream") from None
        except OSError as err:
            raise AdminError(f"llmswap at {client.url} broke off its answer ({_reason(err)})") from None
    raise AdminError(f"{client.url}/api/events ended before its snapshot: is this llmswap?")


@dataclass(frozen=True)
class Row:
    model: str
    state: str
    footprint: int | None
    footprint_human: str
    in_flight: int
    queued: int
    pid: int | None
    last_start_seconds: float | None

    def as_json(self) -> dict[str, Any]:
        return {"model": self.model, "state": self.state, "footprint": self.footprint,
                "in_flight": self.in_flight, "queued": self.queued, "pid": self.pid,
                "last_start_seconds": self.last_start_seconds}


def rows(snapshot: dict[str, Any], show_all: bool) -> list[Row]:
    found = []
    for model in snapshot.get("models", []):
        busy = model["state"] in RUNNING_STATES or model["in_flight"] or model["waiting"]
        if not (show_all or busy):
            continue
        vram = (model.get("extras") or {}).get("vram") or {}
        shown = vram.get("footprint_human") or "-"
        found.append(Row(model["id"], model["state"], vram.get("footprint"), shown, model["in_flight"],
                         model["waiting"], model["pid"], model["last_start_seconds"]))
    return found


def table(found: Sequence[Row]) -> str:
    header = ("MODEL", "STATE", "FOOTPRINT", "IN FLIGHT", "QUEUED", "PID", "LAST START")
    lines = [header] + [
        (row.model, row.state, row.footprint_human, str(row.in_flight), str(row.queued),
         str(row.pid) if row.pid else "-",
         f"{row.last_start_seconds:.2f}s" if row.last_start_seconds is not None else "-")
        for row in found
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "".join(
        "   ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() + "\n"
        for line in lines
    )


def ps_hosts(client: Client, *, as_json: bool) -> str:
    """Every host's models: this one's and its discover peers' (`GET /api/hosts`)."""
    try:
        answer = json.loads(client.call("GET", "/api/hosts"))
        found, queue = answer["hosts"], answer.get("queue", [])
    except (ValueError, KeyError, TypeError, AttributeError):
        raise AdminError(f"{client.url}/api/hosts is not an llmswap's host list") from None
    if as_json:
        return json.dumps(found if not queue else {"hosts": found, "queue": queue}, indent=2) + "\n"
    lines = [("HOST", "STATE", "MODEL", "MODEL STATE", "IN FLIGHT", "QUEUED")]
    for host in found:
        live = "live" if host["fresh"] else "down or stale"
        for model in host["models"] or [{"id": "-", "state": "-", "in_flight": 0, "waiting": 0}]:
            lines.append((host["name"], live, model["id"], model["state"], str(model["in_flight"]),
                          str(model["waiting"])))
    text = _columns(lines)
    if queue:  # the hosts draining the shared task queue (tasks.db: postgresql://...)
        rows = [("TASK QUEUE HOST", "STATE", "HEARTBEAT", "TASK TYPES")]
        rows += [(h["name"] + (" (this)" if h["this"] else ""), "live" if h["live"] else "gone",
                  f"{h['heartbeat_age']:.1f}s ago", ", ".join(h["types"]) or "-") for h in queue]
        text += "\n" + _columns(rows)
    return text


def _columns(lines: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "".join("   ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() + "\n"
                   for line in lines)


def ps(client: Client, *, show_all: bool, as_json: bool) -> str:
    snapshot = fetch_snapshot(client)
    found = rows(snapshot, show_all)
    if as_json:
        return json.dumps({"router": snapshot.get("router"), "models": [row.as_json() for row in found]},
                          indent=2) + "\n"
    if not found:
        return "no model is running or has requests (llmswap ps --all lists every model)\n"
    return table(found)
