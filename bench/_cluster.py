"""A durable PostgreSQL cluster the benchmark starts and stops itself.

``python -m bench --durable-postgres`` measures against a cluster with
``fsync = on``, ``synchronous_commit = on`` and ``full_page_writes = on``
(PostgreSQL's defaults, which production runs), in a temporary directory,
listening on 127.0.0.1 and a free port. The server's binaries run as the
``postgres`` user when this process is root (``initdb`` refuses root), as in
``.ci/postgres.sh``, whose test cluster turns durability off.

Run as a module it starts a cluster and prints its URL, or stops one:

    python -m bench._cluster start DIR
    python -m bench._cluster stop DIR
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

__all__ = ["DurableCluster", "server_binaries"]

DURABLE_SETTINGS = {
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "max_connections": "200",
}
"""The server settings of the bench's cluster: durable commits."""


def server_binaries() -> Path:
    """The directory of ``initdb`` and ``pg_ctl`` (Debian keeps them off PATH)."""
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: [int(x) for x in p.parent.name.split(".") if x.isdigit()],
    )
    for candidate in reversed(versions):
        if (candidate / "initdb").is_file():
            return candidate
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise RuntimeError(
        "no PostgreSQL server binaries (initdb, pg_ctl): install the postgresql package"
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class DurableCluster:
    """A PostgreSQL cluster in ``directory`` with durable commits."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.data = directory / "data"
        self.bin = server_binaries()
        self.port = 0

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, *command: str) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *command]
        return list(command)

    def start(self) -> str:
        """Create and start the cluster; its URL."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.data.exists():
            shutil.rmtree(self.data)
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres")
        with (self.directory / "initdb.log").open("wb") as log:
            subprocess.run(
                self._as_postgres(
                    str(self.bin / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                ),
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
            )
        self.port = _free_port()
        options = " ".join(
            [f"-h 127.0.0.1 -p {self.port} -k {self.directory}"]
            + [f"-c {name}={value}" for name, value in DURABLE_SETTINGS.items()]
        )
        subprocess.run(
            self._as_postgres(
                str(self.bin / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.directory / "server.log"),
                "-w",
                "-t",
                "60",
                "-o",
                options,
                "start",
            ),
            stdout=subprocess.DEVNULL,
            check=True,
        )
        return self.url

    def stop(self) -> None:
        """Stop the server (fast shutdown) if it runs."""
        if (self.data / "postmaster.pid").exists():
            subprocess.run(
                self._as_postgres(
                    str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "stop"
                ),
                stdout=subprocess.DEVNULL,
                check=False,
            )

    def __enter__(self) -> DurableCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        raise SystemExit("usage: python -m bench._cluster start|stop DIR")
    cluster = DurableCluster(Path(argv[1]).resolve())
    if argv[0] == "start":
        print(cluster.start())
    else:
        cluster.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
