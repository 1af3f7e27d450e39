"""A connection a worker accepted moves to main, in one process: real loopback connections, a real AF_UNIX
channel with SCM_RIGHTS, asyncio transports on both ends."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import ssl
import subprocess
from pathlib import Path

import pytest

from llmswap.workers.handover import (
    HEADER,
    Adopt,
    ChannelError,
    HandOverSender,
    NotMovable,
    detach,
    receive_hand_overs,
)
from tests.integration.workers.conftest import Rig
from tests.integration.workers.peers import ask, read_answer, request

PID = os.getpid()


async def test_main_answers_the_moved_connection_and_keeps_it_alive(rig: Rig) -> None:
    reader, writer = await rig.connect()

    assert await ask(reader, writer, "/main/1") == f"main {PID} GET /main/1 HTTP/1.1"
    # Keep-alive after the move: the next request on the same connection reaches the same main protocol.
    assert await ask(reader, writer, "/main/2") == f"main {PID} GET /main/2 HTTP/1.1"

    assert len(rig.mains) == 1 and bytes(rig.mains[0].received) == request("/main/1") + request("/main/2")
    worker = rig.workers[0]
    assert worker.moving is not None and worker.moving.done() and worker.moving.exception() is None
    assert worker.transport is not None and worker.transport.is_closing()
    assert not worker.lost  # the worker's protocol heard nothing once the hand-over began
    writer.close()
    await writer.wait_closed()


async def test_the_worker_copy_closed_leaves_the_client_connection_open(rig: Rig) -> None:
    reader, writer = await rig.connect()
    await ask(reader, writer, "/main/1")
    worker = rig.workers[0]
    assert worker.transport is not None
    await asyncio.sleep(0)  # the closed transport lets go of its socket on the next loop turn
    assert worker.transport.get_extra_info("socket").fileno() == -1  # the worker's descriptor is closed

    assert not reader.at_eof()
    assert await ask(reader, writer, "/main/2") == f"main {PID} GET /main/2 HTTP/1.1"
    writer.close()
    await writer.wait_closed()


async def test_answers_the_worker_gave_come_before_mains_in_order(rig: Rig) -> None:
    reader, writer = await rig.connect()
    writer.write(request("/worker/1") + request("/main/2") + request("/main/3"))  # pipelined, one write

    assert await read_answer(reader) == f"worker {PID} GET /worker/1 HTTP/1.1"
    assert await read_answer(reader) == f"main {PID} GET /main/2 HTTP/1.1"
    assert await read_answer(reader) == f"main {PID} GET /main/3 HTTP/1.1"
    assert bytes(rig.mains[0].received) == request("/main/2") + request("/main/3")  # held from /main/2 on
    writer.close()
    await writer.wait_closed()


async def test_bytes_sent_after_the_worker_stopped_reading_reach_main_after_the_held_ones(rig: Rig) -> None:
    reader, writer = await rig.connect()
    whole = request("/main/split")
    first_line = whole.index(b"\r\n") + 2
    writer.write(whole[:first_line])  # the worker moves the connection on the request line alone
    await rig.wait_adopted(1)
    assert bytes(rig.mains[0].received) == whole[:first_line]

    writer.write(whole[first_line:])  # read by main from the socket the worker no longer reads

    assert await read_answer(reader) == f"main {PID} GET /main/split HTTP/1.1"
    assert bytes(rig.mains[0].received) == whole
    writer.close()
    await writer.wait_closed()


async def test_a_hand_over_waits_until_the_workers_unwritten_answer_is_out(rig: Rig) -> None:
    rig.big_answer = 8 * 1024 * 1024  # more than the socket buffers take while the client reads nothing
    reader, writer = await rig.connect(receive_buffer=64 * 1024)
    writer.write(request("/worker/big") + request("/main/after"))
    await rig.wait_connected(1)
    worker = rig.workers[0]
    await asyncio.wait_for(worker.moving_began.wait(), 5)
    assert worker.transport is not None and worker.moving is not None
    for _ in range(20):
        await asyncio.sleep(0)
    assert worker.transport.get_write_buffer_size() > 0 and not worker.moving.done()
    assert rig.mains == []  # nothing moved while the worker still had bytes to write

    body = await read_answer(reader)
    line = f"worker {PID} GET /worker/big HTTP/1.1"
    assert body.startswith(line) and body.count(".") - line.count(".") == rig.big_answer  # all of it
    assert await read_answer(reader) == f"main {PID} GET /main/after HTTP/1.1"
    writer.close()
    await writer.wait_closed()


async def test_a_client_gone_before_the_move_fails_the_hand_over_and_nothing_reaches_main(rig: Rig) -> None:
    rig.big_answer = 8 * 1024 * 1024  # the hand-over waits for it to be written out
    _, writer = await rig.connect(receive_buffer=64 * 1024)
    writer.write(request("/worker/big") + request("/main/after"))
    await rig.wait_connected(1)
    worker = rig.workers[0]
    await asyncio.wait_for(worker.moving_began.wait(), 5)
    assert worker.moving is not None

    writer.transport.abort()  # unread bytes in its buffer: the kernel answers the worker's writes with RST

    with pytest.raises(ConnectionError):
        await asyncio.wait_for(worker.moving, 5)
    assert rig.mains == []


async def test_many_connections_move_at_once_each_to_its_own_protocol(rig: Rig) -> None:
    clients = [await rig.connect() for _ in range(24)]
    for number, (_, writer) in enumerate(clients):
        writer.write(request(f"/main/{number}"))  # all in flight before any answer is read

    answers = await asyncio.gather(*(read_answer(reader) for reader, _ in clients))
    assert answers == [f"main {PID} GET /main/{number} HTTP/1.1" for number in range(len(clients))]
    again = await asyncio.gather(*(ask(reader, writer, f"/main/{number}/again")
                                   for number, (reader, writer) in enumerate(clients)))
    assert again == [f"main {PID} GET /main/{number}/again HTTP/1.1" for number in range(len(clients))]
    assert len(rig.mains) == len(clients)
    for _, writer in clients:
        writer.close()


async def test_a_connection_whose_message_was_cut_short_is_closed_and_reading_ends() -> None:
    main_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    adopted: list[bytes] = []
    # The worker dies in the middle of a message: its length says 100 bytes, 3 came.
    socket.send_fds(worker_end, [HEADER.pack(100) + b"GET"], [accepted.fileno()])
    accepted.close()
    worker_end.close()

    await asyncio.wait_for(receive_hand_overs(main_end, lambda sock, held: adopted.append(held)), 5)

    assert adopted == []
    client.settimeout(5)
    assert client.recv(10) == b""  # main closed the last descriptor of the connection: the client sees FIN
    for sock in (client, listener, main_end):
        sock.close()


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and its key, made with the openssl command."""
    # Skipped without the openssl command, except in CI (LLMSWAP_REQUIRE_E2E=1, .ci/run installs it).
    if shutil.which("openssl") is None and os.environ.get("LLMSWAP_REQUIRE_E2E") != "1":
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


async def test_a_tls_connection_is_refused_and_left_to_the_worker(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    refused: list[BaseException] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        try:
            await detach(writer.transport)  # type: ignore[arg-type]
        except NotMovable as exc:
            refused.append(exc)
            writer.write(b"still the worker's")  # the connection is untouched
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    client_context = ssl.create_default_context(cafile=str(cert))
    client_context.check_hostname = False
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context)
    writer.write(request("/main/tls"))

    assert await reader.read() == b"still the worker's"
    assert len(refused) == 1 and "TLS" in str(refused[0])
    writer.close()
    server.close()
    await server.wait_closed()


async def test_hand_overs_larger_than_the_channel_holds_wait_their_turn_and_arrive_whole() -> None:
    main_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    sender = HandOverSender(worker_end)
    connections = [socket.socketpair() for _ in range(6)]  # (the handed-over end, its peer)
    helds = [bytes([ord("a") + number]) * (300 * 1024) for number in range(len(connections))]
    sending = asyncio.gather(*(sender.send(moved.fileno(), held)
                               for (moved, _), held in zip(connections, helds, strict=True)))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not sending.done()  # the channel is full: the senders wait for main to read

    got: list[tuple[socket.socket, bytes]] = []
    all_in = asyncio.Event()

    def adopt(sock: socket.socket, held: bytes) -> None:
        got.append((sock, held))
        if len(got) == len(connections):
            all_in.set()

    receiving = asyncio.get_running_loop().create_task(receive_hand_overs(main_end, adopt))
    await asyncio.wait_for(sending, 5)
    await asyncio.wait_for(all_in.wait(), 5)

    assert [held for _, held in got] == helds  # whole, in order, never interleaved
    for number, ((moved, peer), (adopted, _)) in enumerate(zip(connections, got, strict=True)):
        moved.close()  # the sender's copy; the adopted one is the same connection
        peer.sendall(b"%d" % number)
        adopted.settimeout(5)
        assert adopted.recv(10) == b"%d" % number  # each message came with its own connection
        for sock in (peer, adopted):
            sock.close()
    receiving.cancel()
    main_end.close()
    worker_end.close()


async def test_finish_lets_the_hand_overs_under_way_arrive_then_the_reader_sees_the_end() -> None:
    main_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    sender = HandOverSender(main_end)  # main's end: a retiring worker gets no connection after these
    connections = [socket.socketpair() for _ in range(3)]
    helds = [bytes([ord("a") + number]) * (300 * 1024) for number in range(len(connections))]
    sending = asyncio.gather(*(sender.send(moved.fileno(), held)
                               for (moved, _), held in zip(connections, helds, strict=True)))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not sending.done()  # the channel is full: they are under way

    finishing = asyncio.get_running_loop().create_task(sender.finish())
    await asyncio.sleep(0)
    spare, spare_peer = socket.socketpair()
    late = asyncio.get_running_loop().create_task(sender.send(spare.fileno(), b"late"))
    got: list[tuple[socket.socket, bytes]] = []

    # Returns at the channel's end: every hand-over under way arrived first, the late one never did.
    await asyncio.wait_for(receive_hand_overs(worker_end, lambda sock, held: got.append((sock, held))), 5)

    await asyncio.wait_for(finishing, 5)
    assert [held for _, held in got] == helds
    with pytest.raises(ChannelError, match="no more connections"):
        await late
    await asyncio.wait_for(sending, 5)
    worker_end.sendall(b"back")  # the other way stays open: a worker still gives connections back
    main_end.settimeout(5)
    assert main_end.recv(10) == b"back"
    for sock in (main_end, worker_end, spare, spare_peer, *(s for pair in connections for s in pair),
                 *(adopted for adopted, _ in got)):
        sock.close()


async def test_a_connection_that_cannot_move_is_kept_by_the_keeper_or_else_closed() -> None:
    kept: list[tuple[socket.socket, bytes]] = []
    keepers: list[Adopt | None] = [lambda sock, held: kept.append((sock, held)), None]  # one per connection
    moved = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        channel, gone_worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        gone_worker.close()  # the worker died: the channel's other end is gone
        await HandOverSender(channel).move(writer.transport, b"held", "a worker", keepers.pop(0))  # type: ignore[arg-type]
        channel.close()
        moved.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    address = server.sockets[0].getsockname()
    reader, writer = await asyncio.open_connection(*address)
    await asyncio.wait_for(moved.wait(), 5)
    [(sock, held)] = kept
    assert held == b"held"
    writer.write(b"ping")  # the connection lives on, here
    sock.settimeout(5)
    assert await asyncio.to_thread(sock.recv, 4) == b"ping"
    sock.sendall(b"pong")
    assert await asyncio.wait_for(reader.readexactly(4), 5) == b"pong"
    sock.close()
    writer.close()

    moved.clear()
    reader, writer = await asyncio.open_connection(*address)  # no keeper this time: nobody can serve it
    await asyncio.wait_for(moved.wait(), 5)
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    server.close()
    await server.wait_closed()
