"""API keys: tenants by key, digests only, clear errors that never echo a key, and a keys file re-read when it
changes (at most once a second, on an injected clock) that keeps its last good keys when it turns bad."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import pytest
from pydantic import SecretStr

from services.gateway.errors import Unauthorized
from services.gateway.settings import Settings
from services.gateway.shaping.keys import ANONYMOUS, MISSING, UNKNOWN, ApiKeys, ApiKeysError, build_api_keys

SECRET = "sk-live-0123456789abcdef"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def keys_file(path: Path, *lines: str) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def test_api_keys_return_the_tenant_when_the_key_is_known() -> None:
    keys = ApiKeys(SecretStr(f"{SECRET}:acme, other-key:beta"), None)
    assert keys.enabled
    assert keys.authenticate(SECRET) == "acme"
    assert keys.authenticate("other-key") == "beta"
    assert keys.tenants() == {"acme", "beta"}


def test_api_keys_name_the_tenant_after_the_digest_when_the_key_has_no_tenant() -> None:
    keys = ApiKeys(SecretStr(SECRET), None)
    tenant = keys.authenticate(SECRET)
    assert tenant == f"key-{hashlib.sha256(SECRET.encode()).hexdigest()[:8]}"
    assert SECRET not in tenant
    assert ApiKeys(SecretStr(SECRET), None).authenticate(SECRET) == tenant  # stable across restarts


@pytest.mark.parametrize("presented", ["sk-live-0123456789abcdeX", "sk-live", SECRET + " ", "ACME"])
def test_api_keys_refuse_without_echoing_the_key_when_it_is_unknown(presented: str) -> None:
    keys = ApiKeys(SecretStr(f"{SECRET}:acme"), None)
    with pytest.raises(Unauthorized) as raised:
        keys.authenticate(presented)
    assert raised.value.status == 401
    assert raised.value.reason == "unauthorized"
    assert str(raised.value) == UNKNOWN
    assert presented.strip() not in str(raised.value)


@pytest.mark.parametrize("presented", [None, ""])
def test_api_keys_ask_for_the_header_when_the_key_is_missing(presented: str | None) -> None:
    with pytest.raises(Unauthorized, match="X-API-Key header") as raised:
        ApiKeys(SecretStr(f"{SECRET}:acme"), None).authenticate(presented)
    assert str(raised.value) == MISSING


@pytest.mark.parametrize("configured", [None, SecretStr(""), SecretStr(" , ")])
def test_api_keys_are_off_when_nothing_is_configured(configured: SecretStr | None) -> None:
    keys = ApiKeys(configured, None)
    assert not keys.enabled
    assert keys.authenticate(None) == ANONYMOUS
    assert keys.authenticate("anything") == ANONYMOUS
    assert keys.tenants() == {ANONYMOUS}


def test_api_keys_hold_only_digests_when_loaded(tmp_path: Path) -> None:
    """The lookup compares sha256 digests (constant time in the key's bytes): no plain key is kept to compare."""
    path = keys_file(tmp_path / "keys", "file-key-9876543210:beta")
    keys = ApiKeys(SecretStr(f"{SECRET}:acme"), path)
    held = repr(vars(keys)) + repr(vars(vars(keys)["_snapshot"]))
    for key in (SECRET, "file-key-9876543210"):
        assert key not in held
        assert hashlib.sha256(key.encode()).digest() in vars(keys)["_snapshot"].tenants_by_digest


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        (":acme", "the key part is empty"),
        ("two words:acme", "has spaces"),
        ("orphan-key:", "tenant name must be"),
        ("some-key:bad tenant!", "tenant name must be"),
        ("first-key:beta", "listed already for tenant 'acme'"),
    ],
)
def test_api_keys_name_the_file_and_line_when_a_line_is_malformed(tmp_path: Path, line: str, complaint: str) -> None:
    path = keys_file(tmp_path / "keys", "# the partners", "", "first-key:acme", line)
    with pytest.raises(ApiKeysError, match=complaint) as raised:
        ApiKeys(None, path)
    assert f"{path}, line 4" in str(raised.value)


def test_api_keys_name_the_entry_when_the_setting_is_malformed() -> None:
    with pytest.raises(ApiKeysError, match="SWITCHYARD_API_KEYS, entry 2: .*key part is empty"):
        ApiKeys(SecretStr("good:acme,:beta"), None)


def test_api_keys_fail_at_start_when_the_file_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ApiKeysError, match="does not exist"):
        ApiKeys(None, tmp_path / "absent")


def test_api_keys_refuse_everyone_when_the_file_is_empty(tmp_path: Path) -> None:
    keys = ApiKeys(None, keys_file(tmp_path / "keys", "# nobody yet"))
    assert keys.enabled
    assert keys.tenants() == frozenset()
    with pytest.raises(Unauthorized):
        keys.authenticate(SECRET)


def test_api_keys_reload_the_file_when_it_changes(tmp_path: Path) -> None:
    clock = Clock()
    path = keys_file(tmp_path / "keys", "old-key:acme")
    keys = ApiKeys(SecretStr("fixed-key:ops"), path, clock=clock)
    keys_file(path, "new-key:beta", "another-key:gamma")

    clock.now += 0.5  # looked at once a second at most
    with pytest.raises(Unauthorized):
        keys.authenticate("new-key")
    clock.now += 0.5
    assert keys.authenticate("new-key") == "beta"
    assert keys.authenticate("fixed-key") == "ops"  # the setting's keys stay
    with pytest.raises(Unauthorized):
        keys.authenticate("old-key")
    assert keys.tenants() == {"ops", "beta", "gamma"}


def test_api_keys_reload_the_file_when_it_is_replaced_by_one_of_the_same_size(tmp_path: Path) -> None:
    clock = Clock()
    path = keys_file(tmp_path / "keys", "key-one:acme")
    keys = ApiKeys(None, path, clock=clock)
    os.replace(keys_file(tmp_path / "keys.new", "key-two:acme"), path)  # an atomic update: a new inode
    clock.now += 1
    assert keys.authenticate("key-two") == "acme"


def test_api_keys_keep_the_last_good_keys_and_log_once_when_the_file_turns_bad(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    path = keys_file(tmp_path / "keys", "good-key:acme")
    keys = ApiKeys(None, path, clock=clock)
    caplog.set_level(logging.INFO, logger="services.gateway.shaping.keys")

    keys_file(path, "good-key:acme", ":broken")
    for _ in range(3):
        clock.now += 1
        assert keys.authenticate("good-key") == "acme"
    path.unlink()
    for _ in range(3):
        clock.now += 1
        assert keys.authenticate("good-key") == "acme"
    errors = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "line 2" in errors[0].getMessage()
    assert "good-key" not in caplog.text

    keys_file(path, "fixed-key:beta")
    clock.now += 1
    assert keys.authenticate("fixed-key") == "beta"
    assert "valid again" in caplog.text


def test_build_api_keys_combines_the_setting_and_the_file_when_both_are_set(tmp_path: Path) -> None:
    path = keys_file(tmp_path / "keys", "file-key:beta")
    keys = build_api_keys(Settings(api_keys=SecretStr("env-key:acme"), api_keys_file=path))
    assert (keys.authenticate("env-key"), keys.authenticate("file-key")) == ("acme", "beta")
    assert not build_api_keys(Settings()).enabled
