"""The one parser for model version strings, whether they come from a REST path or a gRPC field."""

from __future__ import annotations

from services.gateway.errors import InvalidInput, shown

MAX_DIGITS = 18
"""Any 18-digit number fits int64 (as Triton's versions do); longer strings are refused before ``int()`` sees them,
which in Python 3.11 raises on more than 4,300 digits."""


def parse_version(raw: str) -> int | None:
    """``"3"`` -> 3; ``""`` -> None (the unversioned route or field). As Triton reads a version string: leading zeros
    are the same number (``"01"`` is version 1), and ``"0"`` is a number no repository holds (the caller answers it
    as an unknown version, 404, as Triton does). Anything else is the client's error: only ASCII digits
    (``str.isdigit`` also accepts ``²`` and ``１``, which ``int()`` then rejects or reads)."""
    if raw == "":
        return None
    digits = raw.lstrip("0") if raw.isascii() and raw.isdigit() else None
    if digits is None or len(digits) > MAX_DIGITS:
        raise InvalidInput(  # Triton's words first: scripts written for it match on them
            f"failed to get model version from specified version string {shown(raw)}; "
            f"versions are decimal integers like 1 or 12, got {shown(raw)}"
        )
    return int(digits) if digits else 0
