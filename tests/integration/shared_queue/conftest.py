"""A real PostgreSQL for the shared task queue: one throwaway cluster per session (tests/helpers/postgres.py),
a fresh database per test.

Without PostgreSQL's server binaries (Debian's postgresql package) these tests are skipped, unless
LLMSWAP_REQUIRE_E2E=1 (CI sets it): then they fail, so CI cannot pass by skipping them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from llmswap.tasks.queue.sql import close_pools
from tests.helpers.postgres import Cluster, postgres_bin, running_cluster


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
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
    with running_cluster(bin_dir) as running:
        yield running


@pytest.fixture
def pg_url(cluster: Cluster) -> Iterator[str]:
    """The URL of an empty database of its own; this process's pools to it are closed after the test."""
    yield cluster.fresh_database()
    close_pools()
