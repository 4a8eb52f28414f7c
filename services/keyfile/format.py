"""The structured API keys file (``SWITCHYARD_API_KEYS_FILE`` ending in ``.toml``, ``.yaml`` or ``.yml``).

One ``[keys.<id>]`` table per API key with ``secrets`` (one or two salted scrypt hashes: two while a key is rotated),
``models`` (names or glob patterns the key may call; none by default), ``expires`` (ISO 8601, optional), ``tenant``
(optional; the id by default), and optional limits of its own: ``rps`` / ``burst`` (a rate-limit bucket for the key)
and ``concurrency`` (requests in flight at once). A client presents ``sy_<id>_<secret>``: the id names the one entry
whose hashes are checked, so verifying stays O(1) in the number of keys.

One ``[admins.<id>]`` table per admin-API token with ``secrets``, ``role`` (``read-only``: status, events,
statistics; ``operator``: every action too) and ``expires``; an operator presents ``Bearer sya_<id>_<secret>``. Ids
are unique across both kinds, so ``switchyard keys rotate ID`` needs no kind. The clear secret is never written
anywhere. Writing the file is ``writing.py``'s."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import importlib
import math
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

PREFIX = "sy_"
"""A presented key is ``sy_<id>_<secret>``: the prefix tells it from a key of the line format."""
ADMIN_PREFIX = "sya_"
"""A presented admin token is ``sya_<id>_<secret>``: told from an API key at a glance (in a shell history, a
secret scanner's rules)."""
READ_ONLY, OPERATOR = "read-only", "operator"
ROLES = (READ_ONLY, OPERATOR)
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
_FIELDS = frozenset({"secrets", "models", "expires", "tenant", "rps", "burst", "concurrency"})
_ADMIN_FIELDS = frozenset({"secrets", "role", "expires"})
_TABLES = ("keys", "admins")


class KeyFileError(ValueError):
    """The keys file is not usable; the message names the file, the key id and what was expected."""


class _Hashed:
    """What both kinds of entry share: hashed secrets and an expiry."""

    __slots__ = ()
    secrets: tuple[str, ...]
    expires: datetime | None

    def expired(self, now: datetime) -> bool:
        return self.expires is not None and now >= self.expires

    def matches(self, secret: str) -> bool:
        """Whether ``secret`` is one of the entry's; every hash is computed, so the answer's time says nothing of
        which one matched."""
        results = [verify_secret(secret, hashed) for hashed in self.secrets]
        return any(results)


@dataclass(frozen=True, slots=True)
class KeyEntry(_Hashed):
    id: str
    secrets: tuple[str, ...]
    """``scrypt$<salt b64>$<hash b64>``, oldest first."""
    models: tuple[str, ...]
    expires: datetime | None
    tenant: str
    rps: float | None = None
    """The key's own sustained requests per second (its own bucket, in place of its tenant's); None: the tenant's
    rules (``SWITCHYARD_LIMITS_FILE``, ``SWITCHYARD_RATE_LIMIT_RPS``) apply."""
    burst: int | None = None
    """The key's bucket size; None: one second's worth of ``rps``."""
    concurrency: int | None = None
    """Requests of this key in flight at once, across its models (for the node with ``--workers``); None: no cap
    of its own."""

    def may_call(self, model: str) -> bool:
        return any(fnmatchcase(model, pattern) for pattern in self.models)


@dataclass(frozen=True, slots=True)
class AdminEntry(_Hashed):
    id: str
    secrets: tuple[str, ...]
    role: str
    """``read-only`` or ``operator``."""
    expires: datetime | None = None

    @property
    def operator(self) -> bool:
        return self.role == OPERATOR


@dataclass(frozen=True, slots=True)
class KeyFile:
    """A whole keys file: API keys and admin tokens, each by id."""

    keys: Mapping[str, KeyEntry]
    admins: Mapping[str, AdminEntry]


def is_structured(path: Path) -> bool:
    return path.suffix.lower() in STRUCTURED_SUFFIXES


def new_secret() -> str:
    return secrets.token_urlsafe(_SECRET_BYTES)


def presented_key(key_id: str, secret: str) -> str:
    """What a client sends as ``X-API-Key``."""
    return f"{PREFIX}{key_id}_{secret}"


def presented_admin_token(admin_id: str, secret: str) -> str:
    """What an operator sends as ``Authorization: Bearer ...``."""
    return f"{ADMIN_PREFIX}{admin_id}_{secret}"


def split_presented(key: str, prefix: str = PREFIX) -> tuple[str, str] | None:
    """(id, secret) of a ``sy_<id>_<secret>`` key (``sya_`` with ``prefix=ADMIN_PREFIX``); None for anything else."""
    if not key.startswith(prefix):
        return None
    key_id, underscore, secret = key[len(prefix) :].partition("_")
    if not underscore or not secret or not ID_PATTERN.fullmatch(key_id):
        return None
    return key_id, secret


def hash_secret(secret: str) -> str:
    salt = os.urandom(_SALT_BYTES)
    return f"scrypt${_b64(salt)}${_b64(_scrypt(secret, salt))}"


def verify_secret(secret: str, hashed: str) -> bool:
    salt, expected = _hash_parts(hashed)
    return hmac.compare_digest(_scrypt(secret, salt), expected)


def load_file(path: Path) -> KeyFile:
    """The structured keys file at ``path``. Raises ``KeyFileError`` (and ``OSError``)."""
    return parse_document(_read_document(path), str(path))


def load_entries(path: Path) -> dict[str, KeyEntry]:
    """The API keys of the structured keys file at ``path``, by id."""
    return dict(load_file(path).keys)


def parse_document(document: Mapping[str, Any], where: str) -> KeyFile:
    unknown = sorted(set(document) - set(_TABLES))
    if unknown:
        raise KeyFileError(
            f"{where}: unknown top-level entries {unknown}; expected only [keys.<id>] and [admins.<id>] tables"
        )
    keys = {str(key_id): _entry(str(key_id), table, f"{where}, key '{key_id}'")
            for key_id, table in _tables(document, "keys", where).items()}
    admins = {str(admin_id): _admin(str(admin_id), table, f"{where}, admin token '{admin_id}'")
              for admin_id, table in _tables(document, "admins", where).items()}
    both = sorted(set(keys) & set(admins))
    if both:
        raise KeyFileError(f"{where}: the id {both[0]!r} names an API key and an admin token; ids must be unique")
    return KeyFile(keys, admins)


def _tables(document: Mapping[str, Any], name: str, where: str) -> Mapping[str, Any]:
    tables = document.get(name, {})
    if not isinstance(tables, Mapping):
        raise KeyFileError(f"{where}: '{name}' must be a table of [{name}.<id>] tables, got {type(tables).__name__}")
    return tables


def _checked_table(entry_id: str, table: Any, where: str, fields: frozenset[str]) -> Mapping[str, Any]:
    """``table`` once its id is well formed and it is a table of known ``fields`` only."""
    if not ID_PATTERN.fullmatch(entry_id):
        raise KeyFileError(f"{where}: the id must be 1-64 of A-Z a-z 0-9 - (no '_': it ends the id in a key)")
    if not isinstance(table, Mapping):
        raise KeyFileError(f"{where}: expected a table with 'secrets' and more, got {type(table).__name__}")
    unknown = sorted(set(table) - fields)
    if unknown:
        raise KeyFileError(f"{where}: unknown fields {unknown}; expected {sorted(fields)}")
    return table


def _entry(key_id: str, raw: Any, where: str) -> KeyEntry:
    table = _checked_table(key_id, raw, where, _FIELDS)
    tenant = table.get("tenant", key_id)
    if not isinstance(tenant, str) or not TENANT_PATTERN.fullmatch(tenant):
        raise KeyFileError(f"{where}: 'tenant' must be 1-64 of A-Z a-z 0-9 _ . - (got {tenant!r})")
    secrets_, models = _secrets(table.get("secrets"), where), _models(table.get("models", []), where)
    rps = _number(table.get("rps"), "rps", where, whole=False)
    burst = _whole(_number(table.get("burst"), "burst", where, whole=True))
    if burst is not None and rps is None:
        raise KeyFileError(f"{where}: 'burst' needs an 'rps' beside it")
    concurrency = _whole(_number(table.get("concurrency"), "concurrency", where, whole=True))
    expires = _expiry(table.get("expires"), where)
    return KeyEntry(key_id, secrets_, models, expires, tenant, rps=rps, burst=burst, concurrency=concurrency)


def _admin(admin_id: str, raw: Any, where: str) -> AdminEntry:
    table = _checked_table(admin_id, raw, where, _ADMIN_FIELDS)
    role = table.get("role")
    if role not in ROLES:
        raise KeyFileError(f"{where}: 'role' must be one of {', '.join(ROLES)} (got {role!r})")
    return AdminEntry(admin_id, _secrets(table.get("secrets"), where), str(role), _expiry(table.get("expires"), where))


def _whole(value: float | None) -> int | None:
    return None if value is None else int(value)


def _number(value: Any, name: str, where: str, *, whole: bool) -> float | None:
    """An optional limit: a number above 0 (a whole one for ``whole``); bool is refused (``rps = true`` is a
    mistake, not 1)."""
    if value is None:
        return None
    kinds = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or value <= 0:
        expected = "a whole number >= 1" if whole else "a number of requests per second > 0"
        raise KeyFileError(f"{where}: '{name}' must be {expected}, got {value!r}")
    return float(value)


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
    return parse_text(path.read_bytes(), path)


def parse_text(text: bytes, path: Path) -> Mapping[str, Any]:
    """A keys file's document from its bytes, by the format its suffix names."""
    if path.suffix.lower() == ".toml":
        try:
            return tomllib.loads(text.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise KeyFileError(f"{path} is not valid UTF-8 TOML: {exc}") from None
    yaml = yaml_module(path)
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KeyFileError(f"{path} is not valid YAML: {exc}") from None
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise KeyFileError(f"{path}: expected a mapping with 'keys' at the top, got {type(document).__name__}")
    return document


def yaml_module(path: Path) -> Any:
    """PyYAML, which the base install does not bring: TOML needs nothing beyond Python."""
    try:
        return importlib.import_module("yaml")
    except ImportError:
        raise KeyFileError(f"{path}: a YAML keys file needs PyYAML (pip install pyyaml); or use a .toml file") from None
