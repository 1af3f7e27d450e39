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
from dataclasses import dataclass, field
from itertools import count

_databases = count(1)


def postgres_bin() -> str | None:
    """The folder holding initdb and pg_ctl, or None when PostgreSQL's server is not installed."""
    found = shutil.which("initdb")
    if found:
        return os.path.dirname(found)
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    return os.path.dirname(candidates[0]) if candidates else None


def require_postgres() -> str:
    """The server binaries' folder; skips the test without them (or without psycopg), or fails it under
    LLMSWAP_REQUIRE_E2E=1 (CI), which must not pass by skipping."""
    import pytest

    bin_dir = postgres_bin()
    missing = "PostgreSQL's server is not installed (apt-get install postgresql)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        bin_dir, missing = None, "psycopg is not installed: pip install 'llmswap-proxy[postgres]'"
    if bin_dir is None:
        if os.environ.get("LLMSWAP_REQUIRE_E2E") == "1":
            pytest.fail(f"LLMSWAP_REQUIRE_E2E=1 but {missing}", pytrace=False)
        pytest.skip(missing)
    return bin_dir


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Cluster:
    bin_dir: str
    folder: str
    port: int = field(default_factory=_free_port)
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

    def _run(self, tool: str, *args: str, check: bool = True) -> None:
        as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*as_user, os.path.join(self.bin_dir, tool), *args], check=check, capture_output=True,
                       timeout=120)

    @property
    def data(self) -> str:
        return os.path.join(self.folder, "data")

    def init(self) -> None:
        self._run("initdb", "-D", self.data, "-U", self.user, "-A", "trust", "--no-sync")

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
                   " -c max_connections=200")
        self._run("pg_ctl", "-D", self.data, "-o", options, "-l", os.path.join(self.folder, "log"), "-w",
                  "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", self.data, "-m", "immediate", "stop", check=False)


@contextmanager
def running_cluster(bin_dir: str) -> Iterator[Cluster]:
    """initdb into a temporary folder, start on a free loopback port (trust auth, no fsync), stop after."""
    folder = tempfile.mkdtemp(prefix="llmswap-pg-")
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    cluster = Cluster(bin_dir, folder)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)
