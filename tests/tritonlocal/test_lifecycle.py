"""Process lifecycle: a crashed server (killed by PID) comes back on the same ports; the CLI stops on Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from services.tritonlocal import LocalTriton, TritonInstall, TritonLocalError
from services.tritonlocal.processes import SHM_ROOT, stub_regions
from tests.tritonlocal.support import sample
from tests.waiting import wait_until

pytestmark = pytest.mark.slow  # a local Triton

ROOT = Path(__file__).resolve().parents[2]


def mlp_answers(server: LocalTriton) -> bool:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        features = sample("mlp", rows=2)["features"]
        tensor = grpcclient.InferInput("features", list(features.shape), "FP32")
        tensor.set_data_from_numpy(features)
        return bool(client.infer("mlp", [tensor], model_version="2").as_numpy("logits").shape == (2, 8))
    finally:
        client.close()


def test_start_serves_again_on_the_same_ports_when_the_server_was_killed_by_pid(
    install: TritonInstall, repository: Path, tmp_path: Path
) -> None:
    server = LocalTriton(repository, load=["mlp"], derived=tmp_path / "derived", install=install,
                         log_file=tmp_path / "tritonserver.log")
    with server:
        assert mlp_answers(server)
        first_pid, ports = server.pid, server.ports
        assert first_pid is not None
        regions = [SHM_ROOT / name for name in stub_regions(first_pid)]
        assert regions, "the mlp's python-backend stubs name no shared-memory region"
        assert all(region.exists() for region in regions)
        os.kill(first_pid, signal.SIGKILL)
        assert wait_until(lambda: not server.running, 10.0)
        assert not server.ready()
        assert all(region.exists() for region in regions)  # a killed server removes none of them
        report = server.crash_report()
        assert report is not None
        assert f"(pid {first_pid}) exited by itself: signal SIGKILL" in report
        assert f"last lines of {tmp_path / 'tritonserver.log'}" in report

        started = time.monotonic()
        server.start()
        restart_s = time.monotonic() - started
        assert not any(region.exists() for region in regions)  # the restart reaped the stubs and their regions
        assert server.pid != first_pid
        assert server.ports == ports
        assert mlp_answers(server)
        assert restart_s < 30.0, f"restart took {restart_s:.1f} s"  # a few seconds; more on a loaded machine
        assert server.crash_report() is None
    assert not server.running


def crash_while_in_use(server: LocalTriton, then_raise: Exception | None = None) -> None:
    """Use the server as a context, SIGKILL it from outside, then leave the context (raising ``then_raise``)."""
    with server:
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        assert wait_until(lambda: not server.running, 10.0)
        if then_raise is not None:
            raise then_raise


def test_leaving_the_context_names_a_crash_that_happened_while_the_server_was_in_use(
    install: TritonInstall, repository: Path, tmp_path: Path
) -> None:
    server = LocalTriton(repository, derived=tmp_path / "derived", install=install, log_file=tmp_path / "log")
    crashed = r"exited by itself: signal SIGKILL; /dev/shm: \d+ of \d+ MiB in use; last lines of "
    with pytest.raises(TritonLocalError, match=crashed):
        crash_while_in_use(server)

    # What failed next in the body (a client that found no server) carries the crash as a note.
    with pytest.raises(ConnectionError) as failed:
        crash_while_in_use(server, ConnectionError("connection refused"))
    assert any("exited by itself: signal SIGKILL" in note for note in failed.value.__notes__)

    with server:  # stopped, not crashed: nothing to report
        pass
    assert server.crash_report() is None


def test_kill_removes_the_shared_memory_regions_of_the_python_stubs(
    install: TritonInstall, repository: Path, tmp_path: Path
) -> None:
    server = LocalTriton(repository, load=["mlp"], derived=tmp_path / "derived", install=install)
    server.start()
    try:
        assert server.pid is not None
        regions = [SHM_ROOT / name for name in stub_regions(server.pid)]
        assert regions
        assert all(region.exists() for region in regions)
    finally:
        server.kill()
    assert not any(region.exists() for region in regions)


def test_load_serves_a_version_exported_after_the_server_started(
    install: TritonInstall, repository: Path, tmp_path: Path
) -> None:
    source = tmp_path / "repository"
    shutil.copytree(repository / "mlp", source / "mlp", ignore=shutil.ignore_patterns("2"))
    with LocalTriton(source, load=["mlp"], derived=tmp_path / "derived", install=install,
                     log_file=tmp_path / "tritonserver.log") as server:
        assert server.model_states("mlp") == {1: "READY"}
        shutil.copytree(repository / "mlp" / "2", source / "mlp" / "2")  # what the exporter publishes
        server.load("mlp")
        assert server.model_states("mlp") == {1: "READY", 2: "READY"}
        assert mlp_answers(server)


def start_cli(install: TritonInstall, repository: Path, tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    """``switchyard triton`` in a subprocess, once it has printed its PID and URLs."""
    command = [sys.executable, "-m", "services", "triton", "--repository", str(repository), "--load", "mlp",
               "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
               "--derived", str(tmp_path / "derived"), "--log-file", str(tmp_path / "tritonserver.log")]
    env = {**os.environ, "SWITCHYARD_TRITON_HOME": str(install.home), "COLUMNS": "300", "NO_COLOR": "1"}
    launcher = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert launcher.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any("Ctrl-C" in line for line in lines):
        line = launcher.stdout.readline()
        if not line:
            break
        lines.append(line)
    return launcher, "".join(lines)


def group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_cli_prints_pid_and_urls_and_stops_the_server_when_interrupted(
    install: TritonInstall, repository: Path, tmp_path: Path
) -> None:
    launcher, output = start_cli(install, repository, tmp_path)
    try:
        pid = re.search(r"pid (\d+)", output)
        http = re.search(r"HTTP\s+http://127\.0\.0\.1:(\d+)", output)
        assert pid, output
        assert http, output
        assert re.search(r"gRPC\s+127\.0\.0\.1:\d+", output)
        assert re.search(r"metrics\s+http://127\.0\.0\.1:\d+/metrics", output)
        launcher.send_signal(signal.SIGINT)
        rest, _ = launcher.communicate(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(10)
    assert launcher.returncode == 0, output + rest
    assert "tritonserver stopped" in rest
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid.group(1)), 0)


def test_server_and_its_stubs_stop_when_the_launcher_is_killed_with_sigkill(
    install: TritonInstall, repository: Path, tmp_path: Path
) -> None:
    launcher, output = start_cli(install, repository, tmp_path)
    found = re.search(r"pid (\d+)", output)
    assert found, output
    server_pid = int(found.group(1))
    try:
        assert group_alive(server_pid)
        launcher.kill()  # no atexit, no signal handler: only the watchdog can stop the server now
        launcher.wait(10)
        stopped = wait_until(lambda: not group_alive(server_pid), 20.0)
    finally:
        if launcher.stdout is not None:
            launcher.stdout.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server_pid, signal.SIGKILL)
    assert stopped, f"tritonserver {server_pid} (or a python stub of it) outlived its SIGKILLed launcher"
    assert "watchdog: launcher exited: server stopped" in (tmp_path / "tritonserver.log").read_text()
