"""The one parser for model version strings, whether they come from a REST path or a gRPC field."""

from __future__ import annotations

from services.gateway.errors import InvalidInput, shown

MAX_DIGITS = 18
"""Any 18-digit number fits int64 (as Triton's versions do); longer strings are refused before ``int()`` sees them,
which in Python 3.11 raises on more than 4,300 digits."""


def parse_version(raw: str) -> int | None:
    """``"3"`` -> 3; ``""`` -> None (the unversioned route or field). Anything else is the client's error: only
    ASCII digits (``str.isdigit`` also accepts ``²`` and ``１``, which ``int()`` then rejects or reads), no leading
    zeros (``01`` and ``1`` must not name the same version twice), and versions start at 1 as in Triton."""
    if raw == "":
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > MAX_DIGITS or (raw[0] == "0" and len(raw) > 1):
        raise InvalidInput(  # Triton's words first: scripts written for it match on them
            f"failed to get model version from specified version string {shown(raw)}; "
            f"versions are decimal integers like 1 or 12, got {shown(raw)}"
        )
    version = int(raw)
    if version == 0:
        raise InvalidInput("failed to get model version from specified version string '0'; versions start at 1")
    return version
