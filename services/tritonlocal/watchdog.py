"""Stops a local tritonserver whose launcher died without stopping it (SIGKILL, OOM kill, a crashed test).

``LocalTriton`` starts this file as a separate process beside each server: ``python watchdog.py LAUNCHER_PID
SERVER_PID``. It waits on Linux pidfds for whichever of the two exits first. The server exiting first is the
normal case (the launcher stopped it) and the watchdog just ends. The launcher exiting first leaves an
orphaned server holding its ports, so the watchdog sends the server's process group (the server and its
python-backend stubs) SIGTERM, then SIGKILL after a grace period.

Standard library only and no imports from the project: it runs as a plain script, whatever ``sys.path`` the
launcher had. (A ``PR_SET_PDEATHSIG`` in the server would need ``preexec_fn``, which is unsafe in threaded
launchers such as the gateway's tests.)
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys

GRACE_S = 5.0
"""How long the orphaned server may take to stop after SIGTERM before its whole group is SIGKILLed."""


def watch(launcher_pid: int, server_pid: int, grace_s: float = GRACE_S) -> str:
    """Block until one of the two exits; return what happened (for the log line)."""
    try:
        server = os.pidfd_open(server_pid)
    except ProcessLookupError:
        return "server already gone"
    try:
        launcher = os.pidfd_open(launcher_pid)
    except ProcessLookupError:  # the launcher died before we started watching: the server is an orphan
        _stop_group(server_pid, server, grace_s)
        return "launcher gone before the watch began: server stopped"
    poller = select.poll()
    poller.register(launcher, select.POLLIN)
    poller.register(server, select.POLLIN)
    if server in {fd for fd, _ in poller.poll()}:
        return "server exited"
    _stop_group(server_pid, server, grace_s)
    return "launcher exited: server stopped"


def _stop_group(server_pid: int, server_fd: int, grace_s: float) -> None:
    # The server leads its own session, so its process group id is its pid; the stubs are in that group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(server_pid, signal.SIGTERM)
    select.select([server_fd], [], [], grace_s)  # readable once the server has exited
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(server_pid, signal.SIGKILL)  # the stubs, or a server that ignored SIGTERM


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle, not ours
    launcher_pid, server_pid = int(sys.argv[1]), int(sys.argv[2])
    outcome = watch(launcher_pid, server_pid)
    print(f"switchyard triton watchdog: {outcome} (launcher {launcher_pid}, server {server_pid})", flush=True)


if __name__ == "__main__":
    main()
