"""Running llmswap as one main process plus worker processes: the pieces that do not depend on the server
(which assembles them: `llmswap.server.workers` in main, `llmswap.server.worker_process` in a worker).

`channel` carries control messages between main and a worker; `grants` (main) and `leases` (worker) make
the one scheduler in main grant every lease a worker serves; `handover` moves an accepted client connection
from a worker to main; `supervisor` starts main's workers, restarts the ones that die and stops them with the
stop's grace.
"""
