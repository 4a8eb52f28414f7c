"""A child process's end in words (services/exits.py), as the supervisor's log and a Triton crash report say it."""

from __future__ import annotations

from services.exits import describe_exit


def test_an_exit_is_named_by_its_status_and_a_kill_by_its_signal() -> None:
    assert describe_exit(0) == "exit status 0"
    assert describe_exit(2) == "exit status 2"
    assert describe_exit(-9) == "signal SIGKILL"
    assert describe_exit(-11) == "signal SIGSEGV"


def test_a_signal_number_with_no_name_is_given_as_a_number() -> None:
    assert describe_exit(-200) == "signal 200"
