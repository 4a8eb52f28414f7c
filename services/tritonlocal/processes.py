"""Process hygiene for local Triton servers: free ports, and no server or python stub left running when the
launcher exits or a server dies."""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import signal
import socket
import subprocess
from collections.abc import Iterable
from pathlib import Path

from services.tritonlocal.errors import TritonStartError

HOST = "127.0.0.1"


def free_port() -> int:
    """A port the kernel considers free now (it may be taken again before it is bound; fine for tests)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports the kernel considers free now. Held open together while they are picked: picked one
    after another, the kernel may hand out a port it just gave back (seen in CI: Triton's gRPC and metrics ports
    came out equal and it refused to start)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


PORT_RANGE = range(0, 65536)


def check_ports_free(ports: dict[str, int]) -> None:
    """Another server on our port would answer the readiness polls in our place: refuse to start then. A port outside
    0-65535, or one given to two listeners, is refused here too, naming them (tritonserver would exit with a line in
    its log, and Python's bind raises OverflowError)."""
    for kind, port in ports.items():
        if port not in PORT_RANGE:
            raise TritonStartError(f"{kind} port {port} is not a port number: expected 0-65535 (0 picks a free one)")
    given: dict[int, str] = {}
    for kind, port in ports.items():
        if port in given:
            raise TritonStartError(f"{given[port]} and {kind} are both given port {port}: each listener needs its own")
        given[port] = kind
    for kind, port in ports.items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers of a crash are fine
            try:
                sock.bind((HOST, port))
            except OSError as exc:
                message = f"{kind} port {port} on {HOST} is in use ({exc.strerror}); pick another"
                raise TritonStartError(message) from None


def digest(path: Path) -> str:
    """A short stable name for a repository path (its derived copy's folder)."""
    return hashlib.sha1(str(path).encode()).hexdigest()[:10]


# Servers still running when the interpreter exits (a failed test, an exception in a script) are killed,
# never orphaned.
live: set[subprocess.Popen[bytes]] = set()


STUB_REGION_PREFIX = "triton_python_backend_shm_region_"
"""How the python backend names the shared-memory region it gives each stub (under /dev/shm)."""
SHM_ROOT = Path("/dev/shm")
SHM_NEARLY_FULL_BYTES = 16 * 2**20
"""Free space under which /dev/shm is named as a likely cause of a crash: the regions of a few stubs."""


def shared_memory_state(root: Path = SHM_ROOT) -> str:
    """How full ``root`` is, in words, for a crash report: the python backend's stubs keep their regions there."""
    try:
        found = os.statvfs(root)
    except OSError as exc:
        return f"{root}: unreadable ({exc.strerror})"
    return describe_shared_memory(root, found.f_blocks * found.f_frsize, found.f_bavail * found.f_frsize)


def describe_shared_memory(root: Path, total: int, free: int) -> str:
    mib = 2**20
    said = f"{root}: {(total - free) // mib} of {total // mib} MiB in use"
    if free >= SHM_NEARLY_FULL_BYTES:
        return said
    return (
        f"{said}, nearly full: each python-backend stub keeps a region of a megabyte or more there, a model whose "
        "stub finds no room fails to load, and a process that touches a page the folder cannot back dies of SIGBUS "
        "(give it more room, e.g. `docker run --shm-size=1g`)"
    )


def reap_group(process: subprocess.Popen[bytes], regions: Iterable[str] = ()) -> None:
    """Kill what is left of an exited server's process group (it leads its own session, so the group id
    is its pid): python-backend stubs orphaned by a SIGKILLed server do not always exit by themselves. Then remove
    the stubs' shared-memory regions (``regions``, and those of stubs still in the group): a server that exits
    normally removes them itself, a killed one leaves them in /dev/shm, a megabyte or more each."""
    if process.poll() is None:
        return
    left = {*regions, *stub_regions(process.pid)}
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    for region in left:
        with contextlib.suppress(OSError):
            (SHM_ROOT / region).unlink()


def stub_regions(group: int) -> list[str]:
    """The shared-memory regions of the python-backend stubs in process group ``group`` (each stub's command line
    names its region)."""
    regions: list[str] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) != group:
                continue
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):  # gone meanwhile, or not ours to read
            continue
        regions += [a.decode() for a in arguments if a.startswith(STUB_REGION_PREFIX.encode()) and b"/" not in a]
    return regions


@atexit.register
def _kill_leftovers() -> None:
    for process in list(live):
        if process.poll() is None:
            process.kill()
            process.wait(10)
        reap_group(process)
