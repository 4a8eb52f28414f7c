"""The structured API keys file (``SWITCHYARD_API_KEYS_FILE`` ending in ``.toml``, ``.yaml`` or ``.yml``): one
``[keys.<id>]`` table per key with ``secrets`` (one or two salted scrypt hashes: two while a key is rotated),
``models`` (names or glob patterns the key may call; none by default), ``expires`` (ISO 8601, optional) and
``tenant`` (optional; the id by default). A client presents ``sy_<id>_<secret>``: the id names the one entry whose
hashes are checked, so verifying stays O(1) in the number of keys. The clear secret is never written anywhere."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import importlib
import json
import os
import re
import secrets
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from services.durable import fsync_folder, replace_file

PREFIX = "sy_"
"""A presented key is ``sy_<id>_<secret>``: the prefix tells it from a key of the line format."""
STRUCTURED_SUFFIXES = (".toml", ".yaml", ".yml")
MAX_SECRETS = 2
"""The current secret and the one it replaces, valid together while clients move to the new one."""
ID_PATTERN = re.compile(r"[A-Za-z0-9-]{1,64}")
"""No ``_``: the first ``_`` after the prefix ends the id in a presented key (the secret may hold ``_``)."""
TENANT_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""Tenants become metric labels, bucket keys and TOML table names: the same rule as the line format's."""
# The secret is 256 random bits: no guessing attack profits from a slow hash, so the cost is kept low enough to
# verify a new key on the event loop (about a millisecond); the salt keeps two equal secrets' hashes apart.
_SCRYPT_N, _SCRYPT_R, _SCRYPT_P, _HASH_BYTES, _SALT_BYTES = 2**10, 8, 1, 32, 16
_SECRET_BYTES = 32
_FIELDS = frozenset({"secrets", "models", "expires", "tenant"})
_HEADER = "# Switchyard API keys, written by `switchyard keys`: salted hashes only, never a key itself.\n"


class KeyFileError(ValueError):
    """The keys file is not usable; the message names the file, the key id and what was expected."""


@dataclass(frozen=True, slots=True)
class KeyEntry:
    id: str
    secrets: tuple[str, ...]
    """``scrypt$<salt b64>$<hash b64>``, oldest first."""
    models: tuple[str, ...]
    expires: datetime | None
    tenant: str

    def may_call(self, model: str) -> bool:
        return any(fnmatchcase(model, pattern) for pattern in self.models)

    def expired(self, now: datetime) -> bool:
        return self.expires is not None and now >= self.expires

    def matches(self, secret: str) -> bool:
        """Whether ``secret`` is one of the entry's; every hash is computed, so the answer's time says nothing of
        which one matched."""
        results = [verify_secret(secret, hashed) for hashed in self.secrets]
        return any(results)


def is_structured(path: Path) -> bool:
    return path.suffix.lower() in STRUCTURED_SUFFIXES


def new_secret() -> str:
    return secrets.token_urlsafe(_SECRET_BYTES)


def presented_key(key_id: str, secret: str) -> str:
    """What a client sends as ``X-API-Key``."""
    return f"{PREFIX}{key_id}_{secret}"


def split_presented(key: str) -> tuple[str, str] | None:
    """(id, secret) of a ``sy_<id>_<secret>`` key; None for anything else."""
    if not key.startswith(PREFIX):
        return None
    key_id, underscore, secret = key[len(PREFIX) :].partition("_")
    if not underscore or not secret or not ID_PATTERN.fullmatch(key_id):
        return None
    return key_id, secret


def hash_secret(secret: str) -> str:
    salt = os.urandom(_SALT_BYTES)
    return f"scrypt${_b64(salt)}${_b64(_scrypt(secret, salt))}"


def verify_secret(secret: str, hashed: str) -> bool:
    salt, expected = _hash_parts(hashed)
    return hmac.compare_digest(_scrypt(secret, salt), expected)


def load_entries(path: Path) -> dict[str, KeyEntry]:
    """The entries of the structured keys file at ``path``, by id. Raises ``KeyFileError`` (and ``OSError``)."""
    return parse_document(_read_document(path), str(path))


def parse_document(document: Mapping[str, Any], where: str) -> dict[str, KeyEntry]:
    unknown = sorted(set(document) - {"keys"})
    if unknown:
        raise KeyFileError(f"{where}: unknown top-level entries {unknown}; expected only [keys.<id>] tables")
    tables = document.get("keys", {})
    if not isinstance(tables, Mapping):
        raise KeyFileError(f"{where}: 'keys' must be a table of [keys.<id>] tables, got {type(tables).__name__}")
    return {str(key_id): _entry(str(key_id), table, f"{where}, key '{key_id}'") for key_id, table in tables.items()}


def render(entries: Mapping[str, KeyEntry], path: Path) -> str:
    """The file's text for ``entries``, in the format ``path``'s suffix names."""
    if path.suffix.lower() == ".toml":
        return _HEADER + "".join(_toml_table(entry) for entry in entries.values())
    yaml = _yaml(path)
    document = {"keys": {entry.id: _plain(entry) for entry in entries.values()}}
    return _HEADER + str(yaml.safe_dump(document, sort_keys=False, default_flow_style=False))


def write_entries(path: Path, entries: Mapping[str, KeyEntry]) -> None:
    """Replaces the file whole (a temporary file beside it, fsync, rename; mode 0600, as mkstemp makes it): the
    gateway reading it at any moment sees either the old file or the new one, never a part."""
    replace_file(path, render(entries, path).encode("utf-8"))
    fsync_folder(path.parent)  # the rename itself survives a crash


def _entry(key_id: str, table: Any, where: str) -> KeyEntry:
    if not ID_PATTERN.fullmatch(key_id):
        raise KeyFileError(f"{where}: the id must be 1-64 of A-Z a-z 0-9 - (no '_': it ends the id in a key)")
    if not isinstance(table, Mapping):
        raise KeyFileError(f"{where}: expected a table with 'secrets' and 'models', got {type(table).__name__}")
    unknown = sorted(set(table) - _FIELDS)
    if unknown:
        raise KeyFileError(f"{where}: unknown fields {unknown}; expected {sorted(_FIELDS)}")
    tenant = table.get("tenant", key_id)
    if not isinstance(tenant, str) or not TENANT_PATTERN.fullmatch(tenant):
        raise KeyFileError(f"{where}: 'tenant' must be 1-64 of A-Z a-z 0-9 _ . - (got {tenant!r})")
    secrets_, models = _secrets(table.get("secrets"), where), _models(table.get("models", []), where)
    return KeyEntry(key_id, secrets_, models, _expiry(table.get("expires"), where), tenant)


def _secrets(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_SECRETS:
        raise KeyFileError(f"{where}: 'secrets' must be a list of 1 or {MAX_SECRETS} hashes (`switchyard keys add`)")
    for number, hashed in enumerate(value, start=1):
        if not isinstance(hashed, str):
            raise KeyFileError(f"{where}: secret {number} must be a string 'scrypt$<salt>$<hash>'")
        try:
            _hash_parts(hashed)
        except KeyFileError as exc:
            raise KeyFileError(f"{where}: secret {number}: {exc}") from None
    return tuple(value)


def _models(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(model, str) and model.strip() for model in value):
        raise KeyFileError(f"{where}: 'models' must be a list of model names or glob patterns (like 'resnet-*')")
    return tuple(model.strip() for model in value)


def _expiry(value: Any, where: str) -> datetime | None:
    """An ISO 8601 instant; without a zone it is UTC, a date alone is its midnight UTC."""
    if value is None:
        return None
    try:
        return parse_expiry(value)
    except ValueError as exc:
        raise KeyFileError(f"{where}: 'expires' {exc}") from None


def parse_expiry(value: Any) -> datetime:
    """``value`` (a string, or what TOML and YAML read as a date or time) as an aware datetime."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"must be an ISO 8601 date or time like 2027-01-31T00:00:00Z, got {value!r}") from None
    if isinstance(value, date) and not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day)
    if not isinstance(value, datetime):
        raise ValueError(f"must be an ISO 8601 date or time, got {type(value).__name__}")
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _hash_parts(hashed: str) -> tuple[bytes, bytes]:
    scheme, _, rest = hashed.partition("$")
    salt_text, _, hash_text = rest.partition("$")
    if scheme != "scrypt" or not salt_text or not hash_text:
        raise KeyFileError("expected 'scrypt$<salt base64>$<hash base64>'")
    try:
        salt, expected = base64.b64decode(salt_text, validate=True), base64.b64decode(hash_text, validate=True)
    except binascii.Error:
        raise KeyFileError("expected base64 salt and hash in 'scrypt$<salt>$<hash>'") from None
    if len(expected) != _HASH_BYTES:
        raise KeyFileError(f"expected a hash of {_HASH_BYTES} bytes, got {len(expected)}")
    return salt, expected


def _scrypt(secret: str, salt: bytes) -> bytes:
    return hashlib.scrypt(secret.encode(), salt=salt, n=_SCRYPT_N, r=_SCRYPT_R, p=_SCRYPT_P, dklen=_HASH_BYTES)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _read_document(path: Path) -> Mapping[str, Any]:
    text = path.read_bytes()
    if path.suffix.lower() == ".toml":
        try:
            return tomllib.loads(text.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise KeyFileError(f"{path} is not valid UTF-8 TOML: {exc}") from None
    yaml = _yaml(path)
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KeyFileError(f"{path} is not valid YAML: {exc}") from None
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise KeyFileError(f"{path}: expected a mapping with 'keys' at the top, got {type(document).__name__}")
    return document


def _yaml(path: Path) -> Any:
    """PyYAML, which the base install does not bring: TOML needs nothing beyond Python."""
    try:
        return importlib.import_module("yaml")
    except ImportError:
        raise KeyFileError(f"{path}: a YAML keys file needs PyYAML (pip install pyyaml); or use a .toml file") from None


def _plain(entry: KeyEntry) -> dict[str, Any]:
    found: dict[str, Any] = {"secrets": list(entry.secrets), "models": list(entry.models)}
    if entry.expires is not None:
        found["expires"] = entry.expires.isoformat()
    if entry.tenant != entry.id:
        found["tenant"] = entry.tenant
    return found


def _toml_table(entry: KeyEntry) -> str:
    # JSON strings and arrays of strings are valid TOML basic strings and arrays: no TOML writer is needed.
    lines = [f"\n[keys.{entry.id}]"]
    lines += [f"{name} = {json.dumps(value)}" for name, value in _plain(entry).items()]
    return "\n".join(lines) + "\n"
