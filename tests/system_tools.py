"""Debian tools the tests use as real components (redis-server, docker-compose, promtool, prometheus, chromium)."""

from __future__ import annotations

import os
import shutil

import pytest


def require_tool(binary: str, package: str) -> str:
    """The tool's path. Without it the test is skipped on a developer's machine (the reason names the package to
    install), but fails under ``CI``, where ``.ci/run`` installs every one: CI never passes by skipping."""
    path = shutil.which(binary)
    if path is None:
        reason = f"{binary} is not installed (apt-get install {package}; .ci/run does it)"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and {reason}", pytrace=False)
        pytest.skip(reason)
    return path
