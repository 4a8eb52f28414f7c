"""How a crash report speaks of /dev/shm, where a local Triton's python-backend stubs keep their regions."""

from __future__ import annotations

from pathlib import Path

from services.tritonlocal.processes import describe_shared_memory, shared_memory_state

MIB = 2**20


def test_roomy_shared_memory_is_stated_as_used_of_total() -> None:
    assert describe_shared_memory(Path("/dev/shm"), 24_000 * MIB, 23_990 * MIB) == "/dev/shm: 10 of 24000 MiB in use"


def test_nearly_full_shared_memory_is_named_as_the_likely_cause_with_what_to_do() -> None:
    said = describe_shared_memory(Path("/dev/shm"), 64 * MIB, 3 * MIB)
    assert said.startswith("/dev/shm: 61 of 64 MiB in use, nearly full: ")
    assert "SIGBUS" in said
    assert "--shm-size" in said


def test_state_of_a_real_folder_reads_its_filesystem(tmp_path: Path) -> None:
    assert shared_memory_state(tmp_path).startswith(f"{tmp_path}: ")
    missing = tmp_path / "missing"
    assert shared_memory_state(missing) == f"{missing}: unreadable (No such file or directory)"
