"""Entry point for ``python -m llmswap.demo``."""

import time

# Taken before the heavy imports so that --startup-delay and --exit-after count from process start.
_STARTED_AT = time.monotonic()

from llmswap.demo.main import main  # noqa: E402

raise SystemExit(main(started_at=_STARTED_AT))
