"""Errors of the local-Triton tooling; each message names the cause and the fix."""

from __future__ import annotations

__all__ = ["DerivedRepositoryError", "TritonLocalError", "TritonNotInstalled", "TritonStartError"]


class TritonLocalError(Exception):
    """Base class: something about the local CPU Triton went wrong."""


class TritonNotInstalled(TritonLocalError):
    """The install step has not run, or left an unusable stub env."""


class DerivedRepositoryError(TritonLocalError):
    """The exporter repository cannot be turned into a python-backend repository."""


class TritonStartError(TritonLocalError):
    """tritonserver exited or did not become ready in time."""
