"""What `switchyard keys` writes always reads back, by the gateway's own rules: a value the file format cannot hold
is refused before anything is written, so a revocation never lands in a file the gateway refuses (which keeps it on
the previous keys) and later commands can still read the file."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from services.cli import app
from services.gateway.shaping.keys import ApiKeys
from services.keyfile.format import KeyFile, load_file
from services.keyfile.writing import lock_path, locked, write_file

NO_ENVIRONMENT: dict[str, str | None] = {"SWITCHYARD_API_KEYS_FILE": None}


def keys(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["keys", *args], env=NO_ENVIRONMENT)
    return result.exit_code, result.output


@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
def test_keys_add_refuses_an_infinite_rps_and_leaves_the_file_readable(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"keys{suffix}"
    assert keys("add", "team-a", "--models", "mlp", "--file", str(path))[0] == 0
    before = path.read_bytes()

    code, output = keys("add", "team-b", "--models", "mlp", "--rps", "inf", "--file", str(path))

    assert code == 2
    assert "key 'team-b': 'rps' must be a number of requests per second > 0, got inf" in output
    assert path.read_bytes() == before  # nothing written
    code, output = keys("revoke", "team-a", "--file", str(path))  # the next command still reads the file
    assert code == 0, output
    assert dict(load_file(path).keys) == {}


def test_a_model_name_beyond_the_basic_plane_and_with_control_characters_reads_back(tmp_path: Path) -> None:
    """JSON's escapes for such characters (surrogate pairs) are not TOML: the file was written, then refused by the
    gateway and by every later `switchyard keys` command."""
    path = tmp_path / "keys.toml"
    names = ["模型-😀", 'quote"back\\slash', "del\x7fbell\x07"]
    code, output = keys("add", "team-a", *(f"--models={name}" for name in names), "--file", str(path))
    assert code == 0, output

    assert load_file(path).keys["team-a"].models == tuple(names)
    access = ApiKeys(None, path).identify(output.rstrip("\n").splitlines()[-1])
    assert [access.may_call(name) for name in [*names, "mlp"]] == [True, True, True, False]
    assert keys("rotate", "team-a", "--file", str(path))[0] == 0


def blocked_on(lock: Path) -> bool:
    """Whether a process waits for the ``flock`` on ``lock`` (``/proc/locks`` lists a waiter with ``->``)."""
    inode = os.stat(lock).st_ino
    return any("->" in line and f":{inode} " in line for line in Path("/proc/locks").read_text().splitlines())


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="reads Linux's /proc/locks")
def test_keys_commands_run_one_at_a_time_so_that_no_revocation_is_lost(tmp_path: Path) -> None:
    """Two commands at once each read the file, change it and write it back: without the lock the second write
    brought back a key the first had revoked. Here the test is the other command, stopped between its read and its
    write while `switchyard keys revoke team-a` runs."""
    path = tmp_path / "keys.toml"
    for key_id in ("team-a", "team-b"):
        assert keys("add", key_id, "--models", "mlp", "--file", str(path))[0] == 0
    command = [str(Path(sys.executable).with_name("switchyard")), "keys", "revoke", "team-a", "--file", str(path)]
    environment = {name: value for name, value in os.environ.items() if name != "SWITCHYARD_API_KEYS_FILE"}
    with locked(path):
        read = load_file(path)
        revoking = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30.0
        while revoking.poll() is None and not blocked_on(lock_path(path)) and time.monotonic() < deadline:
            time.sleep(0.02)
        write_file(path, KeyFile({"team-a": read.keys["team-a"]}, {}))  # this command revokes team-b
    output, _ = revoking.communicate(timeout=30.0)

    assert revoking.returncode == 0, output
    assert dict(load_file(path).keys) == {}


def test_a_keys_file_made_readable_to_the_gateway_keeps_its_mode_and_group_when_a_command_rewrites_it(
    tmp_path: Path,
) -> None:
    """An operator makes the file 0640 in the gateway's group; a later `switchyard keys` run by another user must not
    leave it 0600 and unreadable to the gateway (which would stay on the old keys: a revocation never applied)."""
    path = tmp_path / "keys.toml"
    assert keys("add", "team-a", "--models", "mlp", "--file", str(path))[0] == 0
    assert path.stat().st_mode & 0o777 == 0o600  # a new file: only its owner reads it
    groups = [g for g in os.getgroups() if g != os.getegid()]
    group = groups[0] if groups else os.getegid()
    os.chown(path, -1, group)
    path.chmod(0o640)

    assert keys("add", "team-b", "--models", "mlp", "--file", str(path))[0] == 0
    assert keys("revoke", "team-a", "--file", str(path))[0] == 0

    assert path.stat().st_mode & 0o777 == 0o640
    assert path.stat().st_gid == group
    assert set(load_file(path).keys) == {"team-b"}
