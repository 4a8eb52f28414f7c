"""Where the exporters' own output goes while an export runs.

torch.export, torch.onnx and the tracer print graphs, progress lines and warnings that mean nothing to a user
whose export worked and everything to one whose export failed. They are written to a log file in the export's
staging folder, which ``export()`` keeps when the export fails; with ``verbose`` they go to stderr as they come.
Both the Python streams and the process's file descriptors 1 and 2 are redirected (the C++ side of torch writes
to the descriptors), so output from other threads of the process lands in the log for the export's duration.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO

LOG_FILE = "export.log"
_TOOLCHAIN_LOGGERS = ("torch", "onnx", "onnxscript", "onnx_ir", "onnxruntime")


@contextlib.contextmanager
def captured(log_path: Path | None) -> Iterator[None]:
    """Send the exporters' output to ``log_path`` (``None``: leave it on stderr) for the block's duration.

    Warnings are recorded and written out either way: the test suite and careful users turn warnings into errors,
    and an exporter's deprecation notice must not fail an export.
    """
    if log_path is None:
        with _warnings_to(sys.stderr):
            yield
        return
    with open(log_path, "a", encoding="utf-8", errors="replace") as log, _descriptors_to(log), \
            contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), _loggers_to(log), _warnings_to(log):
        yield


@contextlib.contextmanager
def _warnings_to(stream: IO[str]) -> Iterator[None]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for w in caught:
                stream.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line))


@contextlib.contextmanager
def _descriptors_to(log: IO[str]) -> Iterator[None]:
    saved: list[tuple[int, int]] = []
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            stream.flush()
    try:
        for fd in (1, 2):
            with contextlib.suppress(OSError):  # no such descriptor (a GUI process): nothing to redirect
                saved.append((fd, os.dup(fd)))
                os.dup2(log.fileno(), fd)
        yield
    finally:
        log.flush()
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)


@contextlib.contextmanager
def _loggers_to(log: IO[str]) -> Iterator[None]:
    """torch configures its loggers with handlers bound to the stderr of import time: point those at the log."""
    swapped: list[tuple[logging.StreamHandler[IO[str]], IO[str]]] = []
    names = [name for name in logging.Logger.manager.loggerDict if name.split(".")[0] in _TOOLCHAIN_LOGGERS]
    for name in names:
        for handler in logging.getLogger(name).handlers:
            if type(handler) is logging.StreamHandler:
                swapped.append((handler, handler.stream))
                handler.setStream(log)
    try:
        yield
    finally:
        for handler, stream in swapped:
            handler.setStream(stream)
