"""Keeps the derived repository in step with its source while the local Triton runs, on a background thread."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from services.tritonlocal.errors import TritonLocalError


class Follower:
    """Calls ``build`` every ``interval_s`` seconds until ``stop()``; a failed round (a model half copied in) is
    reported on stderr and retried at the next one."""

    def __init__(self, build: Callable[[], object], interval_s: float) -> None:
        self._build = build
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="derived-repository-follow", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            try:
                self._build()
            except (TritonLocalError, OSError) as exc:
                print(f"switchyard triton: the derived repository was not updated: {exc}", file=sys.stderr)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()
