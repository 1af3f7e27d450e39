"""A real PostgreSQL for the shared task queue: one throwaway cluster per session (tests/helpers/postgres.py),
a fresh database per test.

Without PostgreSQL's server binaries (Debian's postgresql package) these tests are skipped, unless
LLMSWAP_REQUIRE_E2E=1 (CI sets it): then they fail, so CI cannot pass by skipping them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llmswap.tasks.queue.sql import PostgresDb
from tests.helpers.postgres import Cluster, require_postgres, running_cluster


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    with running_cluster(require_postgres()) as running:
        yield running


@pytest.fixture
def pg_db(cluster: Cluster) -> Iterator[PostgresDb]:
    """An empty database of its own (`.url` for a config); its pool in this process is closed after the
    test."""
    database = PostgresDb(cluster.fresh_database())
    yield database
    database.close()
