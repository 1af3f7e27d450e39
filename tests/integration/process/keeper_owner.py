"""A stand-in for llmswap holding one keeper: starts `sh -c SCRIPT` in a session of its own with a keeper of
GRACE seconds, prints the group's id, then waits forever (until the test SIGKILLs it).

Run by test_keeper.py as `python -m tests.integration.process.keeper_owner GRACE SCRIPT`.
"""

from __future__ import annotations

import subprocess
import sys
import time

from llmswap.process.keeper import start_keeper

if __name__ == "__main__":
    grace, script = float(sys.argv[1]), sys.argv[2]
    group = subprocess.Popen(["sh", "-c", script], start_new_session=True, stdin=subprocess.DEVNULL)
    keeper = start_keeper(group.pid, grace)
    assert keeper is not None
    print(f"group={group.pid} keeper={keeper.pid}", flush=True)
    while True:
        time.sleep(60)
