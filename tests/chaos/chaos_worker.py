"""One chaos worker process: ``python chaos_worker.py URL WORKER_ID LEDGER``.

A real :class:`~dagwerk.runtime.worker.Worker` (two slots, 1-second leases,
a 2-second backstop) serving the whole queue until ``LEDGER/stop`` exists.
The CLI worker's 30-second leases would leave a killed worker's tasks
stranded for most of a one-minute run, hence this script.
"""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

from chaos_plugins import PLUGINS

from dagwerk.engine import open_store
from dagwerk.runtime.worker import Worker

# Deliveries per attempt before the queue dead-letters it: a worker killed
# at random is not a poison task, so the chaos runs never reach it.
MAX_DELIVERIES = 1000


def main(url: str, worker_id: str, ledger: str) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    options: dict[str, object] = {"max_deliveries": MAX_DELIVERIES}
    if url.startswith("postgres"):
        options["pool_size"] = 2
    store = open_store(url, **options)
    worker = Worker(
        store,
        PLUGINS,
        concurrency=2,
        lease_seconds=1.0,
        lease_grace=0.5,
        poll_interval=0.05,
        cancel_check_interval=0.25,
        worker_id=worker_id,
        execution_root=ledger,
        max_deliveries=MAX_DELIVERIES,
        backstop_interval=2.0,
    )
    stop = Path(ledger) / "stop"
    print(f"chaos worker {worker_id} serving", file=sys.stderr, flush=True)
    worker.start()
    pause = threading.Event()
    while not stop.exists():
        pause.wait(0.1)
    worker.stop(timeout=10)
    store.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
