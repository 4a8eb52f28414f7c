"""Whole numbers in the admin API's query strings (``?limit=``, ``?minutes=``, ``?step=``), read as text first: their
digits are counted before ``int()`` sees them, which in Python 3.11 raises on more than 4,300."""

from __future__ import annotations

from services.gateway.errors import InvalidInput, shown


def whole_number(raw: str | None, name: str, *, default: int, most: int) -> int:
    """``raw`` as an integer from 1 to ``most`` (``default`` when the parameter is absent); anything else is a 400
    naming the parameter, the range and (trimmed) what came."""
    if raw is None:
        return default
    if raw.isascii() and raw.isdigit() and len(raw) <= len(str(most)) and 1 <= int(raw) <= most:
        return int(raw)
    raise InvalidInput(f"query parameter '{name}' must be an integer from 1 to {most}, got {shown(raw)}")
