"""Steps that may hold the interpreter's lock, and so stop the process's event loop, for long on purpose.

``torch.jit.load`` keeps the GIL for the whole read of a TorchScript file (measured here: 0.12 s for 200 MB, so
minutes for tens of GB), on whatever thread it runs. A watchdog that takes a silent event loop for a hung process
(a node's supervisor, ``workers/liveness.py``) must allow for it: such a step runs inside ``LOOP_HOLDS.holding()``,
and whoever watches the process hears when the first one begins and the last one ends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Listener = Callable[[bool], None]
"""Called with True when a first step begins to hold the loop, False when the last one ended; it must be quick (it
runs under the holds' lock, on the step's thread)."""


class LoopHolds:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._listeners: list[Listener] = []

    def listen(self, listener: Listener) -> Callable[[], None]:
        """``listener`` hears from now on (told at once when a step runs already); returns what stops it."""
        with self._lock:
            self._listeners.append(listener)
            if self._running:
                listener(True)

        def stop() -> None:
            with self._lock:
                self._listeners.remove(listener)

        return stop

    @contextmanager
    def holding(self) -> Iterator[None]:
        """Around a step that may hold the GIL for long (several may run at once, on several threads)."""
        with self._lock:
            self._running += 1
            if self._running == 1:
                for listener in self._listeners:
                    listener(True)
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1
                if self._running == 0:
                    for listener in self._listeners:
                        listener(False)


LOOP_HOLDS = LoopHolds()
"""The process's one registry: the steps (the embedded backend's loads) and the watcher (a node's worker) meet here."""
