"""How a child process ended, in words, for the logs and errors that name it: a supervisor's worker, a local Triton."""

from __future__ import annotations

import signal


def describe_exit(code: int) -> str:
    """A return code in words: ``exit status 1``, ``signal SIGSEGV`` (Popen and multiprocessing give a signal as -N)."""
    if code >= 0:
        return f"exit status {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:
        return f"signal {-code}"
