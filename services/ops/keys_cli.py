"""``switchyard keys add|rotate|revoke``: write the structured API keys file (``services/keyfile/format.py``) that
the gateway re-reads within a second. Each change replaces the file whole (temporary file, fsync, rename; mode
0600); ``add`` and ``rotate`` print the new key once, as their last line of output, and only its salted hash is
written. Only typer, the standard library and ``services.keyfile``: the root command imports this at startup."""

from __future__ import annotations

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
    KeyEntry,
    KeyFileError,
    hash_secret,
    is_structured,
    load_entries,
    new_secret,
    parse_expiry,
    presented_key,
    write_entries,
)

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
    key_id: KeyId, models: Models, file: KeysFile = None, expires: Expires = None, tenant: Tenant = None
) -> None:
    """Add a key that may call the models given; prints the key once, as the last line."""
    path = _keys_file(file)
    entries = _read(path) if path.exists() else {}
    if not ID_PATTERN.fullmatch(key_id):
        _fail(f"the id must be 1-64 of A-Z a-z 0-9 - (got {key_id!r})")
    if key_id in entries:
        _fail(f"{path} has a key '{key_id}' already: rotate it (switchyard keys rotate {key_id}) or pick another id")
    patterns = _patterns(models)
    if tenant is not None and not TENANT_PATTERN.fullmatch(tenant):
        _fail(f"--tenant must be 1-64 of A-Z a-z 0-9 _ . - (got {tenant!r})")
    secret = new_secret()
    entry = KeyEntry(key_id, (hash_secret(secret),), patterns, _expiry(expires), tenant or key_id)
    _write(path, {**entries, key_id: entry})
    typer.echo(f"added key '{key_id}' to {path} (models: {', '.join(patterns)}); it is shown only this once:")
    typer.echo(presented_key(key_id, secret))


def rotate(key_id: KeyId, file: KeysFile = None) -> None:
    """Give a key a new secret (the previous one stays valid); prints the key once, last."""
    path = _keys_file(file)
    entries = _read(path)
    entry = _entry(entries, key_id, path)
    secret = new_secret()
    kept = entry.secrets[-(MAX_SECRETS - 1) :]  # two already: the older goes
    _write(path, {**entries, key_id: replace(entry, secrets=(*kept, hash_secret(secret)))})
    dropped = len(entry.secrets) - len(kept)
    typer.echo(
        f"rotated key '{key_id}' in {path}: the previous secret stays valid until "
        f"`switchyard keys revoke {key_id} --secret old`"
        + (f" ({dropped} older secret dropped)" if dropped else "")
        + "; the new key is shown only this once:"
    )
    typer.echo(presented_key(key_id, secret))


def revoke(key_id: KeyId, file: KeysFile = None, secret: Secret = Which.all) -> None:
    """Revoke a key (or only its older secret, after a rotate); the gateway refuses it within a second."""
    path = _keys_file(file)
    entries = _read(path)
    entry = _entry(entries, key_id, path)
    if secret is Which.all:
        remaining = {name: kept for name, kept in entries.items() if name != key_id}
        _write(path, remaining)
        typer.echo(f"revoked key '{key_id}' in {path}")
        return
    if len(entry.secrets) < 2:
        _fail(f"key '{key_id}' has one secret: --secret old needs two (after `switchyard keys rotate {key_id}`)")
    _write(path, {**entries, key_id: replace(entry, secrets=entry.secrets[-1:])})
    typer.echo(f"revoked the older secret of key '{key_id}' in {path}; the newest one stays valid")


def _keys_file(file: Path | None) -> Path:
    if file is None:
        _fail("no keys file: give --file or set SWITCHYARD_API_KEYS_FILE")
    if not is_structured(file):
        _fail(f"the keys file must end in {', '.join(STRUCTURED_SUFFIXES)} (got {file}); the key:tenant line format "
              "is edited by hand")
    return file


def _read(path: Path) -> dict[str, KeyEntry]:
    try:
        return load_entries(path)
    except FileNotFoundError:
        _fail(f"{path} does not exist: `switchyard keys add` creates it")
    except (OSError, KeyFileError) as exc:
        _fail(str(exc))


def _write(path: Path, entries: dict[str, KeyEntry]) -> None:
    try:
        write_entries(path, entries)
    except (OSError, KeyFileError) as exc:
        _fail(f"cannot write {path}: {exc}")


def _entry(entries: dict[str, KeyEntry], key_id: str, path: Path) -> KeyEntry:
    entry = entries.get(key_id)
    if entry is None:
        _fail(f"{path} has no key '{key_id}' (`switchyard keys add {key_id} --models ...` adds it)")
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
