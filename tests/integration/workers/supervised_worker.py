"""A worker process for the supervisor tests: `python supervised_worker.py MODE [ARG]`.

Modes: `sleep` (runs until signalled), `exit CODE` (exits at once), `accept` (accepts one connection on the
inherited listening socket, writes its worker index to it, then sleeps), `leave-on FILE` (exits 0 once FILE
exists, as a real worker leaves when its channel asks; with STAY=INDEX, the worker of that index stays).
With READY_DIR set, it creates the file READY_DIR/INDEX-PID once it is set up; with IGNORE_TERM=INDEX, the
worker of that index ignores SIGTERM.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

index = os.environ["LLMSWAP_WORKER_INDEX"]
if os.environ.get("IGNORE_TERM") == index:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
mode = sys.argv[1]
if mode == "exit":
    sys.exit(int(sys.argv[2]))
if "READY_DIR" in os.environ:
    with open(os.path.join(os.environ["READY_DIR"], f"{index}-{os.getpid()}"), "w"):
        pass
if mode == "leave-on":
    while not os.path.exists(sys.argv[2]) or os.environ.get("STAY") == index:
        time.sleep(0.01)
    sys.exit(0)
if mode == "accept":
    listener = socket.socket(fileno=int(os.environ["LLMSWAP_LISTEN_FD"]))
    connection, _ = listener.accept()
    connection.sendall(index.encode())
    connection.close()
time.sleep(60)
