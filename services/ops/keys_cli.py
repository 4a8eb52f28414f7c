"""``switchyard keys add|rotate|revoke``: write the structured API keys file (``services/keyfile/format.py``) that
the gateway re-reads within a second: API keys, and with ``add --role`` the admin API's tokens. Each change replaces
the file whole (temporary file, fsync, rename; mode 0600); ``add`` and ``rotate`` print the new key or token once, as
their last line of output, and only its salted hash is written. Only typer, the standard library and
``services.keyfile``: the root command imports this at startup."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from services.keyfile.format import (
    ID_PATTERN,
    MAX_SECRETS,
    STRUCTURED_SUFFIXES,
    TENANT_PATTERN,
    AdminEntry,
    KeyEntry,
    KeyFile,
    KeyFileError,
    hash_secret,
    is_structured,
    load_file,
    new_secret,
    parse_expiry,
    presented_admin_token,
    presented_key,
)
from services.keyfile.writing import locked, write_file

__all__ = ["register"]

EXIT_USAGE = 2

KeyId = Annotated[str, typer.Argument(metavar="ID", help="The key's id: 1-64 of A-Z a-z 0-9 -.", show_default=False)]
KeysFile = Annotated[
    Path | None,
    typer.Option(
        "--file",
        envvar="SWITCHYARD_API_KEYS_FILE",
        show_envvar=True,
        help="The keys file (.toml; .yaml or .yml with PyYAML installed).",
    ),
]
Models = Annotated[
    list[str],
    typer.Option(
        "--models",
        metavar="PATTERN",
        help="A model name or glob pattern the key may call; repeat it, or separate them with commas.",
        show_default=False,
    ),
]
Expires = Annotated[
    str | None, typer.Option("--expires", metavar="ISO", help="When the key stops working (ISO 8601; UTC if no zone).")
]
Tenant = Annotated[str | None, typer.Option("--tenant", help="Its tenant (rate limits, metrics); default: the id.")]
Rps = Annotated[
    float | None,
    typer.Option("--rps", min=0.001, help="The key's own rate limit, requests/s (its own bucket, not its tenant's)."),
]
Burst = Annotated[int | None, typer.Option("--burst", min=1, help="Its bucket's size; default: one second of --rps.")]
Concurrency = Annotated[
    int | None, typer.Option("--concurrency", min=1, help="The key's requests in flight at once, across its models.")
]


class Role(StrEnum):
    read_only = "read-only"
    operator = "operator"


RoleOption = Annotated[
    Role | None,
    typer.Option(
        "--role",
        help="Add an admin API token instead of an API key: read-only (status, events, statistics) or operator "
        "(every action too).",
        show_default=False,
    ),
]


class Which(StrEnum):
    old = "old"
    all = "all"


Secret = Annotated[
    Which, typer.Option("--secret", help="old: drop the older of two secrets (after a rotate); all: the whole key.")
]


def register(app: typer.Typer) -> None:
    keys = typer.Typer(help="Add, rotate and revoke API keys in the gateway's keys file.", no_args_is_help=True)
    keys.command("add")(add)
    keys.command("rotate")(rotate)
    keys.command("revoke")(revoke)
    app.add_typer(keys, name="keys")


def add(
    key_id: KeyId,
    models: Models = [],  # noqa: B006 - typer reads the default, never mutates it
    file: KeysFile = None,
    expires: Expires = None,
    tenant: Tenant = None,
    rps: Rps = None,
    burst: Burst = None,
    concurrency: Concurrency = None,
    role: RoleOption = None,
) -> None:
    """Add a key that may call the models given (or with --role an admin API token); prints it once, last."""
    path = _keys_file(file)
    with _locked(path):
        found = _read(path) if path.exists() else KeyFile({}, {})
        if not ID_PATTERN.fullmatch(key_id):
            _fail(f"the id must be 1-64 of A-Z a-z 0-9 - (got {key_id!r})")
        if key_id in found.keys or key_id in found.admins:
            kind = "a key" if key_id in found.keys else "an admin token"
            _fail(f"{path} has {kind} '{key_id}' already: rotate it (switchyard keys rotate {key_id}) or pick another "
                  "id")
        secret = new_secret()
        if role is not None:
            given = [name for name, value in (("--models", models), ("--tenant", tenant), ("--rps", rps),
                                              ("--burst", burst), ("--concurrency", concurrency)) if value]
            if given:
                _fail(f"{', '.join(given)} apply to API keys; an admin token (--role) has a role only")
            admin = AdminEntry(key_id, (hash_secret(secret),), role.value, _expiry(expires))
            _write(path, KeyFile(found.keys, {**found.admins, key_id: admin}))
            if not found.keys:  # on stderr: the secret stays the last line of the output
                typer.echo(f"note: {path} holds no API key: a gateway reading it (SWITCHYARD_API_KEYS_FILE) refuses "
                           "every inference request with 401 until one is added (switchyard keys add ID --models "
                           "PATTERN)", err=True)
            typer.echo(f"added admin token '{key_id}' ({role.value}) to {path}; it is shown only this once:")
            typer.echo(presented_admin_token(key_id, secret))
            return
        patterns = _patterns(models)
        if tenant is not None and not TENANT_PATTERN.fullmatch(tenant):
            _fail(f"--tenant must be 1-64 of A-Z a-z 0-9 _ . - (got {tenant!r})")
        if burst is not None and rps is None:
            _fail("--burst needs --rps beside it")
        entry = KeyEntry(key_id, (hash_secret(secret),), patterns, _expiry(expires), tenant or key_id,
                         rps=rps, burst=burst, concurrency=concurrency)
        _write(path, KeyFile({**found.keys, key_id: entry}, found.admins))
        typer.echo(f"added key '{key_id}' to {path} (models: {', '.join(patterns)}); it is shown only this once:")
        typer.echo(presented_key(key_id, secret))


def rotate(key_id: KeyId, file: KeysFile = None) -> None:
    """Give a key or admin token a new secret (the previous one stays valid); prints it once, last."""
    path = _keys_file(file)
    with _locked(path):
        found = _read(path)
        entry = _entry(found, key_id, path)
        secret = new_secret()
        kept = entry.secrets[-(MAX_SECRETS - 1) :]  # two already: the older goes
        renewed = replace(entry, secrets=(*kept, hash_secret(secret)))
        _write(path, _with(found, renewed))
        dropped = len(entry.secrets) - len(kept)
        kind = _kind(entry)
        typer.echo(
            f"rotated {kind} '{key_id}' in {path}: the previous secret stays valid until "
            f"`switchyard keys revoke {key_id} --secret old`"
            + (f" ({dropped} older secret dropped)" if dropped else "")
            + f"; the new {kind} is shown only this once:"
        )
        is_admin = isinstance(entry, AdminEntry)
        typer.echo(presented_admin_token(key_id, secret) if is_admin else presented_key(key_id, secret))


def revoke(key_id: KeyId, file: KeysFile = None, secret: Secret = Which.all) -> None:
    """Revoke a key or admin token (or only its older secret, after a rotate); refused within a second."""
    path = _keys_file(file)
    with _locked(path):
        found = _read(path)
        entry = _entry(found, key_id, path)
        kind = _kind(entry)
        if secret is Which.all:
            keys = {name: kept for name, kept in found.keys.items() if name != key_id}
            admins = {name: kept for name, kept in found.admins.items() if name != key_id}
            _write(path, KeyFile(keys, admins))
            typer.echo(f"revoked {kind} '{key_id}' in {path}")
            return
        if len(entry.secrets) < 2:
            _fail(f"{kind} '{key_id}' has one secret: --secret old needs two (after `switchyard keys rotate {key_id}`)")
        _write(path, _with(found, replace(entry, secrets=entry.secrets[-1:])))
        typer.echo(f"revoked the older secret of {kind} '{key_id}' in {path}; the newest one stays valid")


def _kind(entry: KeyEntry | AdminEntry) -> str:
    return "admin token" if isinstance(entry, AdminEntry) else "key"


def _with(found: KeyFile, entry: KeyEntry | AdminEntry) -> KeyFile:
    """``found`` with ``entry`` in place of the entry of its id."""
    if isinstance(entry, AdminEntry):
        return KeyFile(found.keys, {**found.admins, entry.id: entry})
    return KeyFile({**found.keys, entry.id: entry}, found.admins)


def _keys_file(file: Path | None) -> Path:
    if file is None:
        _fail("no keys file: give --file or set SWITCHYARD_API_KEYS_FILE")
    if not is_structured(file):
        _fail(f"the keys file must end in {', '.join(STRUCTURED_SUFFIXES)} (got {file}); the key:tenant line format "
              "is edited by hand")
    return file


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """The keys file's lock for the whole command: a command run beside it waits, then reads what it wrote."""
    with ExitStack() as stack:
        try:
            stack.enter_context(locked(path))
        except OSError as exc:
            _fail(f"cannot lock {path} for writing: {exc}")
        yield


def _read(path: Path) -> KeyFile:
    try:
        return load_file(path)
    except FileNotFoundError:
        _fail(f"{path} does not exist: `switchyard keys add` creates it")
    except (OSError, KeyFileError) as exc:
        _fail(str(exc))


def _write(path: Path, found: KeyFile) -> None:
    try:
        write_file(path, found)
    except (OSError, KeyFileError) as exc:
        _fail(f"cannot write {path}: {exc}")


def _entry(found: KeyFile, key_id: str, path: Path) -> KeyEntry | AdminEntry:
    entry = found.keys.get(key_id) or found.admins.get(key_id)
    if entry is None:
        _fail(f"{path} has no key or admin token '{key_id}' (`switchyard keys add {key_id} --models ...` adds a key)")
    return entry


def _patterns(models: list[str]) -> tuple[str, ...]:
    patterns = tuple(pattern.strip() for value in models for pattern in value.split(",") if pattern.strip())
    if not patterns:
        _fail("give the models the key may call: --models NAME (a glob pattern like 'resnet-*' works too)")
    return patterns


def _expiry(expires: str | None) -> datetime | None:
    if expires is None:
        return None
    try:
        when = parse_expiry(expires)
    except ValueError as exc:
        _fail(f"--expires {exc}")
    if when <= datetime.now(UTC):
        _fail(f"--expires {expires} is in the past: the key would never work")
    return when


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_USAGE)
