"""The servers under test as child processes: free ports, the gateway's command line, start, wait until
ready (over HTTP or gRPC), and stop."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
from workload import ROOT


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports, picked with their sockets held open together (picked one after another, the
    kernel may hand the same port out twice)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def gateway_command(repository: Path, http_port: int, grpc_port: int, *options: str) -> list[str]:
    """``switchyard serve`` on the given ports; ``options`` go before the repository (e.g. the backend)."""
    return [
        sys.executable,
        "-c",
        "from services.cli import main; main()",
        "serve",
        *options,
        "--repository",
        str(repository),
        "--port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
    ]


def stop_session(proc: subprocess.Popen[bytes]) -> None:
    """Stop a process started with ``start_new_session=True`` and everything it started (a supervisor's workers):
    SIGTERM to its process group, SIGKILL after a minute."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextmanager
def _spawned(
    args: list[str], log: Path, env: dict[str, str] | None = None, own_session: bool = False
) -> Iterator[subprocess.Popen[bytes]]:
    """The process, run from the checkout with its output in ``log``; terminated (then killed) on exit, or with
    ``own_session`` started in a session of its own and stopped whole (``stop_session``)."""
    with log.open("w") as out:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=own_session)
    try:
        yield proc
    finally:
        if own_session:
            stop_session(proc)
        else:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextmanager
def process(
    args: list[str], ready_url: str, log: Path, *, env: dict[str, str] | None = None, own_session: bool = False
) -> Iterator[subprocess.Popen[bytes]]:
    """A process serving HTTP, once ``ready_url`` answers 200; ``env``: its whole environment (None: this one's);
    ``own_session``: see ``_spawned``."""
    with _spawned(args, log, env, own_session) as proc:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{args[:3]} exited early; see {log}")
            try:
                with urllib.request.urlopen(ready_url, timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{ready_url} not ready after 180 s; see {log}")
            time.sleep(0.2)
        yield proc


@contextmanager
def grpc_process(args: list[str], target: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process serving gRPC, once its port accepts a channel."""
    with _spawned(args, log) as proc:
        with grpc.insecure_channel(target) as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
        yield proc
