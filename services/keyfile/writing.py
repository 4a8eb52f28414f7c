"""Writing the structured API keys file (``format.py`` reads it): its text in TOML or YAML, checked to read back by the
gateway's own rules before it replaces the file whole, under a lock that makes `switchyard keys` commands take turns."""

from __future__ import annotations

import fcntl
import json
import math
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from services.durable import fsync_folder, replace_file
from services.keyfile.format import AdminEntry, KeyEntry, KeyFile, KeyFileError, parse_document, parse_text, yaml_module

HEADER = "# Switchyard API keys, written by `switchyard keys`: salted hashes only, never a key itself.\n"


def render(entries: Mapping[str, KeyEntry], path: Path, admins: Mapping[str, AdminEntry] | None = None) -> str:
    """The file's text for ``entries`` (and ``admins``), in the format ``path``'s suffix names."""
    admins = admins or {}
    if path.suffix.lower() == ".toml":
        tables = [_toml_table("keys", entry.id, _plain(entry)) for entry in entries.values()]
        tables += [_toml_table("admins", admin.id, _plain_admin(admin)) for admin in admins.values()]
        return HEADER + "".join(tables)
    yaml = yaml_module(path)
    document: dict[str, Any] = {"keys": {entry.id: _plain(entry) for entry in entries.values()}}
    if admins:
        document["admins"] = {admin.id: _plain_admin(admin) for admin in admins.values()}
    return HEADER + str(yaml.safe_dump(document, sort_keys=False, default_flow_style=False))


def write_entries(path: Path, entries: Mapping[str, KeyEntry], admins: Mapping[str, AdminEntry] | None = None) -> None:
    """Replaces the file whole (a temporary file beside it, fsync, rename; a new file's mode is 0600, a replaced
    one keeps its mode and group): the gateway reading it at any moment sees either the old file or the new one,
    never a part. Raises ``KeyFileError`` and writes nothing when the text would not read back (an ``rps`` of inf, a
    model name that is not text)."""
    data = _checked_text(render(entries, path, admins), path)
    replace_file(path, data)
    fsync_folder(path.parent)  # the rename itself survives a crash


def write_file(path: Path, file: KeyFile) -> None:
    write_entries(path, file.keys, file.admins)


def lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Holds the keys file's lock (an ``flock`` on ``.<name>.lock`` beside it) for a read, change and write: two
    `switchyard keys` commands at once otherwise each write what they read, and one's change is lost (a key said to
    be revoked stays valid). The gateway reads without it: each write replaces the file whole. Raises ``OSError``."""
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when the descriptor closes, or the process dies
        yield
    finally:
        os.close(fd)


def _checked_text(text: str, path: Path) -> bytes:
    """``text`` as the file's bytes once it reads back as a valid keys file, by the gateway's own rules: a file the
    gateway would refuse keeps it on the previous keys (a revocation never takes effect) and leaves every later
    `switchyard keys` command refusing to read it."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start : exc.end]
        raise KeyFileError(f"{path}: {bad!r} is not text (a model name or pattern with undecodable bytes?)") from None
    parse_document(parse_text(data, path), str(path))
    return data


def _plain(entry: KeyEntry) -> dict[str, Any]:
    found: dict[str, Any] = {"secrets": list(entry.secrets), "models": list(entry.models)}
    if entry.expires is not None:
        found["expires"] = entry.expires.isoformat()
    if entry.tenant != entry.id:
        found["tenant"] = entry.tenant
    if entry.rps is not None:
        found["rps"] = entry.rps
    for name in ("burst", "concurrency"):
        if getattr(entry, name) is not None:
            found[name] = int(getattr(entry, name))
    return found


def _plain_admin(admin: AdminEntry) -> dict[str, Any]:
    found: dict[str, Any] = {"secrets": list(admin.secrets), "role": admin.role}
    if admin.expires is not None:
        found["expires"] = admin.expires.isoformat()
    return found


def _toml_table(kind: str, entry_id: str, fields: Mapping[str, Any]) -> str:
    lines = [f"\n[{kind}.{entry_id}]"]
    lines += [f"{name} = {_toml_value(value)}" for name, value in fields.items()]
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    """A string, a number or a list of strings as TOML. Not ``json.dumps``: JSON writes a character beyond the BMP as
    two surrogate escapes (``\\ud83d\\ude00``) and infinity as ``Infinity``, neither of which TOML reads."""
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, str):
        return '"' + "".join(_TOML_ESCAPES.get(char) or _toml_char(char) for char in value) + '"'
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")  # read back, then refused by name
    return json.dumps(value)


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _toml_char(char: str) -> str:
    # TOML's basic strings take any character as itself except the control characters, which are escaped.
    return f"\\u{ord(char):04x}" if ord(char) < 0x20 or ord(char) == 0x7F else char
