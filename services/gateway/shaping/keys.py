"""API keys: who is calling and which models it may use. Maps a presented key to its tenant, from
``SWITCHYARD_API_KEYS`` and a keys file that is re-read when it changes: ``key[:tenant]`` lines (every model), or a
structured file (``services/keyfile/format.py``) whose keys each name their models and may expire."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType

from pydantic import SecretStr

from services.gateway.errors import Forbidden, RateLimited, Unauthorized
from services.gateway.settings import Settings
from services.gateway.shaping.limits import Limit
from services.keyfile.format import (
    ADMIN_PREFIX,
    AdminEntry,
    KeyEntry,
    KeyFileError,
    is_structured,
    load_file,
    split_presented,
)

log = logging.getLogger(__name__)

ANONYMOUS = "anonymous"
"""The tenant of every request while API keys are off."""
RECHECK_S = 1.0
"""Least time between two looks at the keys file: a stat per request would be a syscall per request."""
MISSING = "missing API key: send it as the X-API-Key header (gRPC: x-api-key metadata)"
UNKNOWN = "unknown API key"
VERIFICATIONS_PER_S = 100
"""Secrets hashed per second at most, for keys not verified before (a presented key names an id of the file and a
secret not yet checked against it): each costs a scrypt hash, ~1 ms of CPU, so a flood of made-up secrets for a
real id could otherwise spend the event loop on hashing. Verified keys are remembered and never count."""
MAX_VERIFIED = 4096
"""Verified keys remembered per file version (by digest); past it the memory starts over: a bound, not a cache
policy, as a deployment has far fewer live keys."""
# Tenant names become metric labels, bucket keys and TOML table names: keep them plain.
_TENANT = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class ApiKeysError(ValueError):
    """The keys are not usable (a malformed entry, a missing file): the gateway does not start."""


class TooManyVerifications(RateLimited):
    """More new keys to verify than ``VERIFICATIONS_PER_S``: 429, retry in a second (a key verified once is
    remembered, so its holder is refused only while a flood of unverified secrets lasts). A reason of its own: the
    key's rate limit is not what refused it, and the id it names is whatever the sender wrote."""

    retry_after_s = 1
    reason = "key_flood"


class ModelForbidden(Forbidden):
    """A valid key calling a model outside its list. The message names the model asked for only: never the models
    the key may call nor any other key, and the same whether the model exists or not."""

    reason = "forbidden"


@dataclass(frozen=True, slots=True)
class Access:
    """What a verified key may do: its tenant, the models it may call (``None``: every model) and its own limits."""

    tenant: str
    entry: KeyEntry | None = None
    """The structured file's entry, whose ``may_call`` decides; None for the line format and anonymous callers."""
    limit: Limit | None = None
    """The key's own rate-limit bucket (``rps`` / ``burst`` in the keys file); None: its tenant's rules."""

    @classmethod
    def of(cls, entry: KeyEntry) -> Access:
        limit = None if entry.rps is None else Limit.of(entry.rps, entry.burst)
        return cls(entry.tenant, entry, limit)

    @property
    def key_id(self) -> str | None:
        return self.entry.id if self.entry is not None else None

    def may_call(self, model: str) -> bool:
        return self.entry is None or self.entry.may_call(model)

    def check(self, model: str) -> None:
        if not self.may_call(model):
            raise ModelForbidden(f"this API key may not use model '{model}'")


EVERYONE = Access(ANONYMOUS)


@dataclass(frozen=True)
class _Snapshot:
    tenants_by_digest: Mapping[bytes, str]
    signature: tuple[int, int, int] | None
    """The file's (inode, mtime, size) when it was parsed; None without a file."""
    entries: Mapping[str, KeyEntry] = field(default_factory=lambda: MappingProxyType({}))
    """The structured file's keys, by id."""
    admins: Mapping[str, AdminEntry] = field(default_factory=lambda: MappingProxyType({}))
    """The structured file's admin-API tokens, by id."""
    verified: dict[bytes, Access] = field(default_factory=dict)
    """Structured keys verified against this version of the file, by the presented key's sha256: their scrypt
    hash is computed once per file version, not once per request. Dropped with the snapshot when the file changes."""
    admins_verified: dict[bytes, AdminEntry] = field(default_factory=dict)
    """Admin tokens verified against this version of the file, by the presented token's sha256."""
    expiry_logged: set[str] = field(default_factory=set)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _parse(entries: Iterable[tuple[str, str]], found: dict[bytes, str]) -> None:
    """Adds ``key[:tenant]`` entries (each with where it came from, for messages) to ``found``, by digest."""
    for where, entry in entries:
        key, colon, tenant = (part.strip() for part in entry.partition(":"))
        if not key or any(char.isspace() for char in key):
            raise ApiKeysError(f"{where}: expected 'key' or 'key:tenant', the key part is empty or has spaces")
        digest = _digest(key)
        if not colon:
            tenant = f"key-{digest.hex()[:8]}"  # stable and names no secret: safe in metrics and logs
        elif not _TENANT.fullmatch(tenant):
            raise ApiKeysError(f"{where}: the tenant name must be 1-64 of A-Z a-z 0-9 _ . - (got {tenant!r})")
        if found.setdefault(digest, tenant) != tenant:
            raise ApiKeysError(f"{where}: this key is listed already for tenant '{found[digest]}'")


def _file_entries(path: Path) -> list[tuple[str, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ApiKeysError(f"{path} is not UTF-8 text: {exc}") from None
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.strip()
        if entry and not entry.startswith("#"):
            entries.append((f"{path}, line {number}", entry))
    return entries


def _signature(path: Path) -> tuple[int, int, int]:
    stat = os.stat(path)
    return stat.st_ino, stat.st_mtime_ns, stat.st_size  # the inode: a file replaced by rename is re-read too


class ApiKeys:
    """Tenants by key. Keys are held only as sha256 digests; the file is looked at once a second at most."""

    def __init__(
        self,
        keys: SecretStr | None,
        path: Path | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``clock`` paces the looks at the file; ``wall`` is the time expiries are compared with."""
        self._fixed: dict[bytes, str] = {}
        text = keys.get_secret_value() if keys is not None else ""
        entries = [part for part in text.split(",") if part.strip()]
        _parse(((f"SWITCHYARD_API_KEYS, entry {n}", e) for n, e in enumerate(entries, start=1)), self._fixed)
        self._path = path
        self._clock = clock
        self._wall = wall
        self._hashing = (float(VERIFICATIONS_PER_S), clock())
        """The verification bucket: (tokens, when they were counted)."""
        self._busy_logged = float("-inf")
        self._checked = clock()
        self._rejected: tuple[int, int, int] | None = None
        """The signature of a file version that failed to load: not re-read until it changes."""
        self._failing = False
        if path is not None and not path.is_file():
            raise ApiKeysError(f"the API keys file {path} does not exist or is not a file (SWITCHYARD_API_KEYS_FILE)")
        try:
            self._snapshot = self._load()
        except OSError as exc:
            raise ApiKeysError(f"the API keys file {path} cannot be read: {exc}") from None
        self._warn_if_keyless()

    @property
    def enabled(self) -> bool:
        return self._path is not None or bool(self._fixed)

    def authenticate(self, key: str | None) -> str:
        """The caller's tenant; ``ANONYMOUS`` while keys are off. Messages never contain the key."""
        return self.identify(key).tenant

    def identify(self, key: str | None) -> Access:
        """The caller's tenant and models (``EVERYONE`` while keys are off); 401 for a missing, unknown or expired
        key. Messages never contain the key."""
        if not self.enabled:
            return EVERYONE
        self._refresh()
        if not key:
            raise Unauthorized(MISSING)
        # Only digests are compared: a dict lookup's timing depends on the sha256 of the guess, which tells an
        # attacker nothing about the bytes of any real key, so no prefix can be found byte by byte. It stays O(1)
        # however long the file is, where hmac.compare_digest against every key would grow with it.
        snapshot = self._snapshot
        digest = _digest(key)
        tenant = snapshot.tenants_by_digest.get(digest)
        if tenant is not None:
            return Access(tenant)
        access = snapshot.verified.get(digest) or self._verify(snapshot, key, digest)
        entry = access.entry
        if entry is not None and entry.expired(datetime.fromtimestamp(self._wall(), UTC)):
            if entry.id not in snapshot.expiry_logged:  # once per key and file version, not once per request
                snapshot.expiry_logged.add(entry.id)
                log.warning("refused API key id '%s': key expired at %s", entry.id, entry.expires)
            raise Unauthorized(UNKNOWN)  # the client learns no more than for a key that never was
        return access

    def _verify(self, snapshot: _Snapshot, key: str, digest: bytes) -> Access:
        """A structured key's access once its secret matches one of the id's hashes (only that id's: O(1))."""
        parts = split_presented(key)
        entry = snapshot.entries.get(parts[0]) if parts is not None else None
        if parts is None or entry is None:
            raise Unauthorized(UNKNOWN)
        self._may_hash()
        if not entry.matches(parts[1]):
            raise Unauthorized(UNKNOWN)
        if len(snapshot.verified) >= MAX_VERIFIED:
            snapshot.verified.clear()
        access = snapshot.verified[digest] = Access.of(entry)
        return access

    def _may_hash(self) -> None:
        """Takes a token of the verification bucket, or refuses (``TooManyVerifications``), logging once a second."""
        now = self._clock()
        tokens, then = self._hashing
        tokens = min(float(VERIFICATIONS_PER_S), tokens + (now - then) * VERIFICATIONS_PER_S)
        if tokens < 1:
            self._hashing = (tokens, now)
            if now - self._busy_logged >= 1.0:
                self._busy_logged = now
                log.warning("more than %d new API keys or admin tokens a second to verify: refusing the excess with "
                            "429 (a flood of made-up secrets for existing ids?)", VERIFICATIONS_PER_S)
            raise TooManyVerifications(
                "too many new API keys to verify at once; retry in a second (keys verified before are not held up)"
            )
        self._hashing = (tokens - 1, now)

    def known_id(self, key: str | None) -> str | None:
        """The keys file's id that ``key`` names (``sy_<id>_...``), whatever its secret; None when it names none. For
        counting refusals by key id: an id is a label only when the file has it."""
        parts = split_presented(key) if key else None
        return parts[0] if parts is not None and parts[0] in self._snapshot.entries else None

    @property
    def structured(self) -> bool:
        """Whether a structured keys file is configured: the one place admin tokens other than
        ``SWITCHYARD_ADMIN_TOKEN`` can come from (it may gain some at any reload)."""
        return self._path is not None and is_structured(self._path)

    def admin(self, token: str) -> AdminEntry | None:
        """The keys file's admin token that ``token`` (``sya_<id>_<secret>``) presents; None for anything else, an
        expired token included (logged once per id and file version)."""
        self._refresh()
        parts = split_presented(token, ADMIN_PREFIX)
        if parts is None:
            return None
        snapshot = self._snapshot
        digest = _digest(token)
        entry = snapshot.admins_verified.get(digest)
        if entry is None:
            candidate = snapshot.admins.get(parts[0])
            if candidate is None:
                return None
            self._may_hash()
            if not candidate.matches(parts[1]):
                return None
            if len(snapshot.admins_verified) >= MAX_VERIFIED:
                snapshot.admins_verified.clear()
            entry = snapshot.admins_verified[digest] = candidate
        if entry.expired(datetime.fromtimestamp(self._wall(), UTC)):
            if entry.id not in snapshot.expiry_logged:
                snapshot.expiry_logged.add(entry.id)
                log.warning("refused admin token id '%s': token expired at %s", entry.id, entry.expires)
            return None
        return entry

    def tenants(self) -> frozenset[str]:
        """Every tenant ``authenticate`` may return now: a bounded set, fit for metric labels."""
        if not self.enabled:
            return frozenset({ANONYMOUS})
        snapshot = self._snapshot
        return frozenset(snapshot.tenants_by_digest.values()) | {entry.tenant for entry in snapshot.entries.values()}

    def _load(self) -> _Snapshot:
        found = dict(self._fixed)
        if self._path is None:
            return _Snapshot(MappingProxyType(found), None)
        signature = _signature(self._path)
        if not is_structured(self._path):
            _parse(_file_entries(self._path), found)
            return _Snapshot(MappingProxyType(found), signature)
        try:
            loaded = load_file(self._path)
        except KeyFileError as exc:
            raise ApiKeysError(str(exc)) from None
        keys, admins = MappingProxyType(dict(loaded.keys)), MappingProxyType(dict(loaded.admins))
        return _Snapshot(MappingProxyType(found), signature, keys, admins)

    def _refresh(self) -> None:
        now = self._clock()
        if self._path is None or now - self._checked < RECHECK_S:
            return
        self._checked = now
        signature = None
        try:
            signature = _signature(self._path)
            if signature == self._rejected:
                return
            snapshot = self._snapshot if signature == self._snapshot.signature else self._load()
        except (OSError, ApiKeysError) as exc:
            self._rejected = signature
            if not self._failing:  # once per failure, not once per request
                log.error("cannot reload the API keys (%s); keeping the %d keys loaded before", exc, len(self))
            self._failing = True
            return
        if self._failing:
            log.info("the API keys file %s is readable and valid again", self._path)
        self._failing = False
        self._rejected = None
        if snapshot is not self._snapshot:
            self._snapshot = snapshot
            log.info("reloaded the API keys from %s: %d keys, %d tenants", self._path, len(self), len(self.tenants()))
            self._warn_if_keyless()

    def _warn_if_keyless(self) -> None:
        """A keys file without a single API key (admin tokens only, or none yet) lets no inference in: what an
        operator who only meant to add an admin token needs to hear at once, not from the clients' 401s."""
        snapshot = self._snapshot
        if self._path is not None and not snapshot.tenants_by_digest and not snapshot.entries:
            admins = f" ({len(snapshot.admins)} admin token(s) only)" if snapshot.admins else ""
            log.warning(
                "the API keys file %s holds no API key%s: every inference request is refused with 401 until one is "
                "added (switchyard keys add ID --models PATTERN --file %s)", self._path, admins, self._path,
            )

    def __len__(self) -> int:
        """Keys and admin tokens."""
        snapshot = self._snapshot
        return len(snapshot.tenants_by_digest) + len(snapshot.entries) + len(snapshot.admins)


def build_api_keys(settings: Settings) -> ApiKeys:
    """The gateway's keys (``enabled`` is False when neither setting names any); raises ``ApiKeysError``."""
    return ApiKeys(settings.api_keys, settings.api_keys_file)
