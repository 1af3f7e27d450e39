"""Refusing to start an upstream whose local port is already taken by something else.

Without this check the new upstream fails to bind and exits, or worse, the health check passes against the
stranger holding the port and requests are served by the wrong server. The check binds the address the way
a server would (SO_REUSEADDR, so sockets in TIME_WAIT from a previous run do not count); only an address in
use fails it. The holder's pid is looked up with psutil where the OS lets us see it.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
from urllib.parse import urlsplit

import psutil

from llmswap.process.errors import StartFailed

_DEFAULT_PORTS = {"http": 80, "https": 443}


def local_address(proxy: str) -> tuple[str, int] | None:
    """(bind address, port) when `proxy` points at this machine (localhost, a loopback or an unspecified
    address), else None: a remote upstream's port is not ours to check."""
    try:
        url = urlsplit(proxy)
        port = url.port or _DEFAULT_PORTS.get(url.scheme)
    except ValueError:
        return None
    host = url.hostname or ""
    if not host or port is None:
        return None
    if host == "localhost":
        return "127.0.0.1", port
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if not (ip.is_loopback or ip.is_unspecified):
        return None
    return str(ip), port


def address_in_use(address: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as exc:
            # Anything but "in use" (e.g. EACCES on a port below 1024) is for the upstream itself to report.
            return exc.errno == errno.EADDRINUSE
    return False


def describe_listener(port: int) -> str | None:
    """`pid 1234 (llama-server)` for the process listening on `port`, or None when the OS will not say."""
    try:
        connections = psutil.net_connections(kind="inet")
    except (psutil.AccessDenied, PermissionError):
        return None
    for connection in connections:
        if connection.status != psutil.CONN_LISTEN or not connection.laddr or connection.laddr.port != port:
            continue
        if connection.pid is None:
            return None
        try:
            name = psutil.Process(connection.pid).name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return f"pid {connection.pid}"
        return f"pid {connection.pid} ({name})"
    return None


async def ensure_port_free(model_id: str, proxy: str) -> None:
    """Raise StartFailed naming the port (and its holder) when `proxy`'s local port is already in use."""
    local = local_address(proxy)
    if local is None or not address_in_use(*local):
        return
    address, port = local
    holder = await asyncio.to_thread(describe_listener, port)
    by = f"by {holder}" if holder else "by another process"
    raise StartFailed(
        f"port {port} ({address}) for model {model_id} (proxy {proxy}) is already in use {by}: "
        f"stop that process, or give models.{model_id} a free port in its cmd and proxy"
    )
