"""Headless locust runs of ``loadtests/locustfile.py`` in their own process (locust monkey-patches the interpreter
with gevent, so never inside pytest), and what they leave behind: the exit code, the log, the CSV stats."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from tests.slow_work import slow_work

ROOT = Path(__file__).resolve().parent.parent
LOCUSTFILE = ROOT / "loadtests" / "locustfile.py"


@dataclass(frozen=True)
class StatsRow:
    kind: str
    name: str
    requests: int
    failures: int


@dataclass(frozen=True)
class LocustRun:
    returncode: int
    output: str
    stats: dict[tuple[str, str], StatsRow]
    """(type, name) → the row of ``<prefix>_stats.csv``, the Aggregated row left out."""


def run_locust(
    host: str, grpc_target: str | None, results: Path, options: list[str], *, seconds: int, users: int, token: str = ""
) -> LocustRun:
    """``options`` come after the common ones (host, users, run time, CSV and HTML reports under ``results``);
    ``grpc_target`` None leaves locust to find the gateway's gRPC port itself."""
    slow_work("runs locust")
    locust = Path(sys.executable).with_name("locust")
    command = [
        str(locust),
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "--only-summary",
        "--users",
        str(users),
        "--spawn-rate",
        str(users),
        "--run-time",
        f"{seconds}s",
        "--host",
        f"http://{host}",
        *([] if grpc_target is None else ["--grpc-target", grpc_target]),
        "--csv",
        str(results / "run"),
        "--html",
        str(results / "run.html"),
        *options,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCUST_", "SWITCHYARD_"))}
    if token:
        env["SWITCHYARD_ADMIN_TOKEN"] = token
    # Bounded: the run stops itself after ``seconds``; the margin covers start-up and the reports.
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=seconds + 60, check=False
    )
    return LocustRun(done.returncode, done.stdout + done.stderr, _stats(results / "run_stats.csv"))


def _stats(path: Path) -> dict[tuple[str, str], StatsRow]:
    if not path.is_file():
        return {}
    with path.open(newline="") as file:
        rows = [
            StatsRow(row["Type"], row["Name"], int(row["Request Count"]), int(row["Failure Count"]))
            for row in csv.DictReader(file)
            if row["Name"] != "Aggregated"
        ]
    return {(row.kind, row.name): row for row in rows}


def loadtests_module(name: str) -> ModuleType:
    """A locust-free module of ``loadtests/`` (they import each other by bare name, as locust's path makes them)."""
    spec = importlib.util.spec_from_file_location(f"loadtests_{name}", ROOT / "loadtests" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
