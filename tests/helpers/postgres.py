"""A throwaway PostgreSQL cluster for the shared-queue tests and bench: the distribution's server binaries
(`initdb`, `pg_ctl`; .ci/run installs them), its own data folder, a loopback port, stopped at the end.

PostgreSQL refuses to run as root: as root the cluster runs as the `postgres` user the package creates.
Each test gets a database of its own (`fresh_database`), so tests share one cluster and no rows.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import count

_databases = count(1)


def postgres_bin() -> str | None:
    """The folder holding initdb and pg_ctl, or None when PostgreSQL's server is not installed."""
    found = shutil.which("initdb")
    if found:
        return os.path.dirname(found)
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    return os.path.dirname(candidates[0]) if candidates else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Cluster:
    port: int
    user: str = "llmswap"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def fresh_database(self) -> str:
        """A new, empty database on the cluster; its URL."""
        import psycopg

        name = f"t{os.getpid()}_{next(_databases)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)


@contextmanager
def running_cluster(bin_dir: str) -> Iterator[Cluster]:
    """initdb into a temporary folder, start on a free loopback port (trust auth, no fsync), stop after."""
    folder = tempfile.mkdtemp(prefix="llmswap-pg-")
    data = os.path.join(folder, "data")
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    cluster = Cluster(_free_port())

    def run(*argv: str) -> None:
        subprocess.run([*as_user, *argv], check=True, capture_output=True, timeout=120)

    run(os.path.join(bin_dir, "initdb"), "-D", data, "-U", cluster.user, "-A", "trust", "--no-sync")
    options = (f"-p {cluster.port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
               " -c max_connections=200")
    run(os.path.join(bin_dir, "pg_ctl"), "-D", data, "-o", options, "-l", os.path.join(folder, "log"),
        "-w", "start")
    try:
        yield cluster
    finally:
        subprocess.run([*as_user, os.path.join(bin_dir, "pg_ctl"), "-D", data, "-m", "immediate", "stop"],
                       capture_output=True, timeout=60, check=False)
        shutil.rmtree(folder, ignore_errors=True)
