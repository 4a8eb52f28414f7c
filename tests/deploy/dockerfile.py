"""A small reader of the project's Dockerfile: its stages, their instructions (continuation lines joined) and the
base install's pip command, which tests/deploy/test_base_install.py runs exactly as the image does."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from tests.deploy.deploy_tools import DOCKERFILE

BUILD_STAGE = "build"
"""The stage whose venv the ``gateway`` target ships: its one pip command is the base install."""
SOURCE = "/src"
"""Where the build stages put the sources that pip installs."""


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [instruction.arguments for instruction in self.instructions if instruction.keyword == keyword]


@dataclass
class Dockerfile:
    arguments: dict[str, str]
    """Global ``ARG`` defaults (before the first ``FROM``)."""
    stages: dict[str, Stage]

    def stage(self, name: str) -> Stage:
        return self.stages[name]

    def resolved_base(self, name: str) -> str:
        """The stage's ``FROM`` image with global ``ARG`` defaults substituted."""
        return re.sub(r"\$\{(\w+)\}", lambda match: self.arguments[match.group(1)], self.stages[name].base)

    def lineage(self, name: str) -> list[Stage]:
        """The stage and the stages it is built ``FROM``, nearest first (external images end the chain)."""
        chain = [self.stages[name]]
        while chain[-1].base in self.stages:
            chain.append(self.stages[chain[-1].base])
        return chain


def logical_lines(text: str) -> list[str]:
    """Lines with comments dropped and backslash continuations joined, as Docker reads them."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    if pending:
        lines.append(pending.strip())
    return lines


def parse(path: Path = DOCKERFILE) -> Dockerfile:
    arguments: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for line in logical_lines(path.read_text()):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else f"stage{len(stages)}"
            current = stages[name] = Stage(name=name, base=words[0])
        elif current is None:
            if keyword == "ARG" and "=" in rest:
                key, _, value = rest.partition("=")
                arguments[key] = value
        else:
            current.instructions.append(Instruction(keyword, rest))
    return Dockerfile(arguments=arguments, stages=stages)


def pip_installs(stage: Stage) -> list[list[str]]:
    """Each ``pip install`` of the stage's RUN lines (``python -m`` or not): the arguments after ``install``."""
    found = []
    for run in stage.all("RUN"):
        for command in re.split(r"&&|;", run):
            words = shlex.split(command)
            for start in range(len(words) - 1):
                if words[start : start + 2] == ["pip", "install"]:
                    found.append(words[start + 2 :])
    return found


def base_install_command(source: str) -> list[str]:
    """The gateway image's install, ``python -m pip install ...`` with the image's source folder replaced by
    ``source``: the base-install test runs this in a fresh venv, so what it asserts holds for the image."""
    runs = [run for run in parse().stage(BUILD_STAGE).all("RUN") if "pip install" in run]
    if len(runs) != 1:
        raise AssertionError(f"the {BUILD_STAGE!r} stage should run pip install once, found {runs}")
    words = shlex.split(runs[0])
    if words[:4] != ["python", "-m", "pip", "install"]:
        raise AssertionError(f"the base install should be `python -m pip install ...`, found {runs[0]!r}")
    return ["-m", "pip", "install", *(source if word == SOURCE else word for word in words[4:])]
