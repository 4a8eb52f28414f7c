"""The structured keys file: keys written by `switchyard keys` (hashes only, the key printed once as the last line),
rotation with two secrets valid at once, revocation, expiry, the model list, a malformed file that keeps the keys
in force, YAML beside TOML. The gateway's side is ``ApiKeys`` on injected clocks; the files are real."""

from __future__ import annotations

import logging
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from services.cli import app
from services.gateway.errors import Unauthorized
from services.gateway.shaping.keys import (
    UNKNOWN,
    VERIFICATIONS_PER_S,
    ApiKeys,
    ModelForbidden,
    TooManyVerifications,
)
from services.keyfile.format import KeyEntry, KeyFileError, hash_secret, load_entries, load_file, presented_key
from services.keyfile.writing import write_entries

NO_ENVIRONMENT: dict[str, str | None] = {"SWITCHYARD_API_KEYS_FILE": None}
EXPIRY = datetime(2030, 1, 1, tzinfo=UTC)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def keys(*args: str) -> str:
    """``switchyard keys ARGS``: its output, after checking that it succeeded."""
    result = CliRunner().invoke(app, ["keys", *args], env=NO_ENVIRONMENT)
    assert result.exit_code == 0, result.output
    return result.output


def last_line(output: str) -> str:
    return output.rstrip("\n").splitlines()[-1]


def gateway_keys(path: Path, clock: Clock | None = None, wall: Clock | None = None) -> ApiKeys:
    return ApiKeys(None, path, clock=clock or Clock(1000.0), wall=wall or Clock(EXPIRY.timestamp() - 3600))


def test_keys_add_prints_the_key_last_and_writes_only_its_hash(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    output = keys("add", "team-a", "--models", "mlp", "--models", "resnet-*,bert", "--file", str(path))
    key = last_line(output)
    assert key.startswith("sy_team-a_")
    secret = key.removeprefix("sy_team-a_")
    text = path.read_text()
    assert secret not in text
    assert key not in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    entry = load_entries(path)["team-a"]
    assert (entry.models, entry.tenant, len(entry.secrets)) == (("mlp", "resnet-*", "bert"), "team-a", 1)
    access = gateway_keys(path).identify(key)
    assert access.tenant == "team-a"
    assert [access.may_call(model) for model in ("mlp", "resnet-50", "bert", "classifier")] == [True, True, True, False]


def test_keys_rotate_keeps_the_old_secret_until_it_is_revoked(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    old = last_line(keys("add", "team-a", "--models", "mlp", "--file", str(path)))
    clock = Clock(1000.0)
    gateway = gateway_keys(path, clock)

    new = last_line(keys("rotate", "team-a", "--file", str(path)))
    assert new != old
    assert new not in path.read_text()
    clock.now += 1  # the file is looked at once a second: the new key works within a second
    assert gateway.authenticate(new) == gateway.authenticate(old) == "team-a"

    keys("revoke", "team-a", "--secret", "old", "--file", str(path))
    clock.now += 1
    assert gateway.authenticate(new) == "team-a"
    with pytest.raises(Unauthorized):
        gateway.authenticate(old)

    newest = last_line(keys("rotate", "team-a", "--file", str(path)))
    third = last_line(keys("rotate", "team-a", "--file", str(path)))  # two already: the older one goes
    clock.now += 1
    assert len(load_entries(path)["team-a"].secrets) == 2
    assert gateway.authenticate(newest) == gateway.authenticate(third) == "team-a"
    with pytest.raises(Unauthorized):
        gateway.authenticate(new)

    keys("revoke", "team-a", "--file", str(path))
    clock.now += 1
    with pytest.raises(Unauthorized):
        gateway.authenticate(third)
    assert load_entries(path) == {}


def test_keys_commands_name_the_problem_when_asked_for_what_cannot_be(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    cases = [
        (["add", "team-a", "--file", str(tmp_path / "keys.txt"), "--models", "mlp"], "must end in .toml"),
        (["add", "team_a", "--file", str(path), "--models", "mlp"], "the id must be"),
        (["add", "team-a", "--file", str(path), "--models", "mlp", "--expires", "2001-01-01"], "in the past"),
        (["rotate", "team-a", "--file", str(path)], "does not exist"),
        (["add", "team-a", "--models", "mlp"], "give --file or set SWITCHYARD_API_KEYS_FILE"),
    ]
    for args, complaint in cases:
        result = CliRunner().invoke(app, ["keys", *args], env=NO_ENVIRONMENT)
        assert result.exit_code == 2, (args, result.output)
        assert complaint in result.stderr, (args, result.output)
    keys("add", "team-a", "--file", str(path), "--models", "mlp")
    for args, complaint in [
        (["add", "team-a", "--file", str(path), "--models", "mlp"], "has a key 'team-a' already"),
        (["revoke", "team-a", "--secret", "old", "--file", str(path)], "has one secret"),
        (["revoke", "team-b", "--file", str(path)], "has no key or admin token 'team-b'"),
    ]:
        result = CliRunner().invoke(app, ["keys", *args], env=NO_ENVIRONMENT)
        assert result.exit_code == 2, (args, result.output)
        assert complaint in result.stderr, (args, result.output)


def test_structured_key_is_refused_as_unknown_once_it_expires(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "keys.toml"
    key = last_line(keys("add", "team-a", "--models", "mlp", "--expires", EXPIRY.isoformat(), "--file", str(path)))
    wall = Clock(EXPIRY.timestamp() - 1)
    gateway = gateway_keys(path, wall=wall)
    assert gateway.authenticate(key) == "team-a"
    wall.now = EXPIRY.timestamp()
    for _ in range(2):
        with pytest.raises(Unauthorized) as refused:
            gateway.authenticate(key)
        assert str(refused.value) == UNKNOWN  # the client is told no more than for a key that never was
    expired = [record.getMessage() for record in caplog.records if "key expired" in record.getMessage()]
    assert len(expired) == 1
    assert "'team-a'" in expired[0]
    assert key.removeprefix("sy_team-a_") not in caplog.text


@pytest.mark.parametrize(
    "presented",
    ["sy_team-a_wrong-secret", "sy_team-b_x", "sy_team-a_", "team-a", "sy__secret"],
)
def test_structured_key_is_unknown_when_its_id_or_secret_does_not_match(tmp_path: Path, presented: str) -> None:
    path = tmp_path / "keys.toml"
    keys("add", "team-a", "--models", "mlp", "--file", str(path))
    with pytest.raises(Unauthorized, match=f"^{UNKNOWN}$"):
        gateway_keys(path).authenticate(presented)


def test_structured_key_is_verified_once_per_file_version_and_held_as_digests_only(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    key = last_line(keys("add", "team-a", "--models", "mlp", "--file", str(path)))
    gateway = gateway_keys(path)
    for _ in range(3):
        gateway.authenticate(key)
    snapshot = vars(gateway)["_snapshot"]
    assert len(snapshot.verified) == 1
    assert key.removeprefix("sy_team-a_") not in repr(vars(gateway)) + repr(vars(snapshot))


def test_forbidden_model_refusal_names_neither_other_models_nor_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    key = last_line(keys("add", "team-a", "--models", "mlp", "--tenant", "acme", "--file", str(path)))
    keys("add", "team-b", "--models", "classifier", "--file", str(path))
    access = gateway_keys(path).identify(key)
    assert access.tenant == "acme"
    with pytest.raises(ModelForbidden) as refused:
        access.check("classifier")
    assert (refused.value.status, refused.value.reason) == (403, "forbidden")
    for named in ("mlp", "team-a", "team-b", "acme"):
        assert named not in str(refused.value)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("[keys.team-a\n", "not valid UTF-8 TOML"),
        ('[keys.team-a]\nmodels = ["mlp"]\n', "'secrets' must be a list of 1 or 2"),
        ('[keys.team-a]\nsecrets = ["plain-text"]\nmodels = ["mlp"]\n', "expected 'scrypt$<salt base64>"),
        ('[keys.team-a]\nsecrets = []\nmodel = ["mlp"]\n', "unknown fields ['model']"),
        ('[key.team-a]\nsecrets = []\n', "unknown top-level entries ['key']"),
    ],
)
def test_malformed_keys_file_keeps_the_keys_in_force_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str, complaint: str
) -> None:
    path = tmp_path / "keys.toml"
    key = last_line(keys("add", "team-a", "--models", "mlp", "--file", str(path)))
    clock = Clock(1000.0)
    gateway = gateway_keys(path, clock)
    path.write_text(text)
    clock.now += 1
    assert gateway.authenticate(key) == "team-a"
    errors = [record.getMessage() for record in caplog.records if record.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert complaint in errors[0]
    assert str(path) in errors[0]


def test_yaml_keys_file_holds_the_same_keys_as_toml(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    path = tmp_path / "keys.yaml"
    entry = KeyEntry("team-a", (hash_secret("s3cret-a"),), ("mlp",), EXPIRY, "acme")
    write_entries(path, {"team-a": entry})
    assert load_entries(path) == {"team-a": entry}
    assert gateway_keys(path).authenticate(presented_key("team-a", "s3cret-a")) == "acme"
    assert "s3cret-a" not in path.read_text()


def test_keys_add_with_a_role_writes_an_admin_token_that_rotates_and_revokes_like_a_key(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    keys("add", "team-a", "--models", "mlp", "--file", str(path))
    token = last_line(keys("add", "oncall", "--role", "operator", "--file", str(path)))
    viewer = last_line(keys("add", "viewer", "--role", "read-only", "--file", str(path)))
    gateway = gateway_keys(path, Clock(1000.0))

    assert token.startswith("sya_oncall_")
    assert token not in path.read_text()
    assert token.split("_", 2)[2] not in path.read_text()
    found = load_file(path)
    assert set(found.keys) == {"team-a"}
    assert {admin.id: admin.role for admin in found.admins.values()} == {"oncall": "operator", "viewer": "read-only"}
    assert gateway.admin(token) == found.admins["oncall"]
    assert gateway.admin(viewer) == found.admins["viewer"]
    assert gateway.admin(token.replace("sya_", "sy_")) is None  # an admin token is no API key, and the reverse
    with pytest.raises(Unauthorized):
        gateway.authenticate(token)

    rotated = last_line(keys("rotate", "oncall", "--file", str(path)))
    assert rotated.startswith("sya_oncall_")
    assert len(load_file(path).admins["oncall"].secrets) == 2
    keys("revoke", "oncall", "--file", str(path))
    assert set(load_file(path).admins) == {"viewer"}
    assert set(load_file(path).keys) == {"team-a"}  # the API keys are untouched by the admin token's changes


def test_keys_add_writes_a_keys_own_limits_and_refuses_them_on_an_admin_token(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    keys("add", "team-a", "--models", "mlp", "--rps", "2.5", "--burst", "5", "--concurrency", "3", "--file", str(path))
    entry = load_entries(path)["team-a"]
    assert (entry.rps, entry.burst, entry.concurrency) == (2.5, 5, 3)
    for args, complaint in [
        (["add", "ops", "--role", "operator", "--models", "mlp", "--file", str(path)], "--models apply to API keys"),
        (["add", "team-b", "--models", "mlp", "--burst", "5", "--file", str(path)], "--burst needs --rps"),
        (["add", "team-a", "--role", "read-only", "--file", str(path)], "has a key 'team-a' already"),
    ]:
        result = CliRunner().invoke(app, ["keys", *args], env=NO_ENVIRONMENT)
        assert result.exit_code == 2, (args, result.output)
        assert complaint in result.stderr, (args, result.output)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("[admins.ops]\nsecrets = ['{h}']\nrole = 'root'\n", "'role' must be one of read-only, operator"),
        ("[keys.a]\nsecrets = ['{h}']\nrps = 0\n", "'rps' must be a number of requests per second > 0"),
        ("[keys.a]\nsecrets = ['{h}']\nconcurrency = 1.5\n", "'concurrency' must be a whole number >= 1"),
        ("[keys.a]\nsecrets = ['{h}']\nburst = 3\n", "'burst' needs an 'rps' beside it"),
        ("[keys.a]\nsecrets = ['{h}']\n[admins.a]\nsecrets = ['{h}']\nrole = 'operator'\n", "ids must be unique"),
    ],
)
def test_a_keys_file_with_a_bad_limit_or_role_is_refused_naming_it(tmp_path: Path, text: str, complaint: str) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(text.replace("{h}", hash_secret("x")))
    with pytest.raises(KeyFileError, match=complaint):
        load_file(path)


def test_a_flood_of_made_up_secrets_is_refused_past_the_hashing_budget_and_verified_keys_pass(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each unverified secret for an id of the file costs a scrypt hash: past VERIFICATIONS_PER_S in a second the
    rest get 429 without hashing, while a key verified before is still served from memory; the budget refills."""
    path = tmp_path / "keys.toml"
    key = last_line(keys("add", "team-a", "--models", "mlp", "--file", str(path)))
    clock = Clock(1000.0)
    gateway = gateway_keys(path, clock)
    assert gateway.authenticate(key) == "team-a"  # verified once: remembered

    refusals: list[type[Exception]] = []
    with caplog.at_level(logging.WARNING):
        for number in range(VERIFICATIONS_PER_S + 5):
            try:
                gateway.authenticate(presented_key("team-a", f"made-up-{number}"))
            except (Unauthorized, TooManyVerifications) as exc:
                refusals.append(type(exc))
        assert gateway.authenticate(key) == "team-a"
        with pytest.raises(Unauthorized):  # an id the file lacks costs no hash: 401, not 429, with the bucket empty
            gateway.authenticate(presented_key("nobody", "made-up"))
    assert refusals.count(Unauthorized) == VERIFICATIONS_PER_S - 1  # the real key took one token
    assert refusals.count(TooManyVerifications) == 6
    assert len([r for r in caplog.records if "new API keys or admin tokens a second" in r.message]) == 1
    clock.now += 0.5  # half a second refills half the bucket
    with pytest.raises(Unauthorized):
        gateway.authenticate(presented_key("team-a", "made-up-again"))


def test_a_keys_file_of_admin_tokens_only_warns_that_no_inference_gets_in(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys.toml"
    added = CliRunner().invoke(app, ["keys", "add", "viewer", "--role", "read-only", "--file", str(path)],
                               env=NO_ENVIRONMENT)
    assert added.exit_code == 0, added.output
    assert added.stderr.startswith(f"note: {path} holds no API key: a gateway reading it (SWITCHYARD_API_KEYS_FILE)")
    assert last_line(added.stdout).startswith("sya_viewer_")  # the secret stays the output's last line
    clock = Clock(1000.0)
    with caplog.at_level(logging.WARNING):
        gateway = gateway_keys(path, clock)
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert warnings == [
        f"the API keys file {path} holds no API key (1 admin token(s) only): every inference request is refused "
        f"with 401 until one is added (switchyard keys add ID --models PATTERN --file {path})"
    ]
    with pytest.raises(Unauthorized):
        gateway.identify(None)

    caplog.clear()
    key = last_line(keys("add", "team-a", "--models", "mlp", "--file", str(path)))
    clock.now += 5
    assert gateway.identify(key).tenant == "team-a"  # reloaded: no warning any more
    assert "holds no API key" not in caplog.text
