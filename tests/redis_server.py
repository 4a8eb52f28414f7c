"""A real ``redis-server`` (the Debian package) on a free loopback port, for the replica tests; it persists to its
folder with an fsync'd append-only file, so a killed and restarted server keeps the routing, as a production one
would."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from services.tritonlocal import free_port
from tests.slow_work import slow_work
from tests.system_tools import require_tool


def require_redis() -> str:
    """The server binary (skipped without it, except under ``CI``)."""
    return require_tool("redis-server", "redis-server")


class RedisServer:
    def __init__(self, folder: Path) -> None:
        self.binary = require_redis()
        self.folder = folder
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        slow_work("starts redis-server")
        self.folder.mkdir(parents=True, exist_ok=True)
        command = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
                   "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--protected-mode", "no"]
        with (self.folder / "redis.log").open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as connection:
                    connection.sendall(b"PING\r\n")
                    if connection.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: {(self.folder / 'redis.log').read_text()[-2000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@contextmanager
def redis_server(folder: Path) -> Iterator[RedisServer]:
    server = RedisServer(folder)
    server.start()
    try:
        yield server
    finally:
        server.kill()
