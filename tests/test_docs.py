"""The README and the documentation site (docs/, built by `make docs`): every relative link and image resolves to a
file of the repository, the README stays short, and no file names documents that live outside the repository.

`mkdocs build --strict` checks the links between the pages of docs/; this checks what it cannot: the README's links
into docs/, and links from any page to files that are missing altogether. Fast, no network, no build.

Two tests (marked slow) run what a new user types first, as the pages write it, against a gateway serving what
`make models` writes: the README's curl and Triton client snippets, and the `switchyard models` lines of the
version-switching page."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 300

# Folders that are not the repository's source: virtual environments, the local Triton, the built site, exported
# models, caches.
SKIPPED_DIRS = {".venv", ".triton", "site", "model_repository", "__pycache__"}
# Git-ignored output under a scanned folder (locust and bench reports).
SKIPPED_PATHS = {ROOT / "loadtests" / "results"}
SOURCE_DIRS = ("services", "exporter", "examples", "loadtests", "tests", "deploy", "docs")

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1", re.DOTALL)
# [text](target) and ![alt](target), the target optionally in <...> and followed by a "title".
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s)]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
# [label]: target
REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.MULTILINE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
# Documents kept outside the repository; spelled as a pattern so that this file does not name them itself.
OUTSIDE_DOCUMENTS = re.compile(rb"\b(?:DESIGN|LAYOUT|STYLE|TRITON_CPU)\.md\b")


def markdown_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def without_code(text: str) -> str:
    """``text`` without fenced code blocks and code spans: a link-like string inside code is not a link."""
    kept: list[str] = []
    fence: str | None = None
    for line in text.splitlines():
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(1)
        elif fence is not None:
            if opening and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence):
                fence = None
        else:
            kept.append(line)
    return CODE_SPAN.sub("", "\n".join(kept))


def relative_targets(text: str) -> list[str]:
    """The link and image targets of a Markdown text that point into the repository, without their ``#fragment``."""
    prose = without_code(text)
    targets = [match.group(1) for match in INLINE_LINK.finditer(prose)]
    targets += [match.group(1) for match in REFERENCE_LINK.finditer(prose)]
    relative = []
    for target in targets:
        target = target.removeprefix("<").removesuffix(">")
        if target.startswith("#") or SCHEME.match(target):
            continue  # an anchor on the same page, or http(s):, mailto: and the like
        path = unquote(target.split("#", 1)[0].split("?", 1)[0])
        if path:
            relative.append(path)
    return relative


def broken_links(markdown: Path) -> list[str]:
    broken = []
    for target in relative_targets(markdown.read_text(encoding="utf-8")):
        resolved = (ROOT / target.lstrip("/")) if target.startswith("/") else (markdown.parent / target)
        if not resolved.resolve().is_file():
            broken.append(target)
    return broken


def source_files(folder: Path) -> list[Path]:
    found = []
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or any(part in SKIPPED_DIRS for part in path.relative_to(ROOT).parts):
            continue
        if any(path.is_relative_to(skipped) for skipped in SKIPPED_PATHS):
            continue
        found.append(path)
    return found


def test_link_targets_are_found_outside_code_only() -> None:
    text = "\n".join([
        "See [the page](docs/a.md#part), ![shot](img/b.png \"title\") and [site](https://example.org/x.md).",
        "[ref]: docs/c.md",
        "`[not](a-link.md)` and [anchor](#here) and [mail](mailto:someone@example.org)",
        "```python",
        "x = [tensor](inside_code.md)",
        "```",
    ])

    assert relative_targets(text) == ["docs/a.md", "img/b.png", "docs/c.md"]


@pytest.mark.parametrize("markdown", markdown_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_resolve_to_files_in_the_repository(markdown: Path) -> None:
    assert broken_links(markdown) == [], f"{markdown.relative_to(ROOT)} links to files that do not exist"


def test_readme_stays_short() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())

    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move the detail into a page under docs/"


@pytest.mark.parametrize("area", [*SOURCE_DIRS, "*.md"])
def test_no_file_names_documents_outside_the_repository(area: str) -> None:
    files = sorted(ROOT.glob("*.md")) if area == "*.md" else source_files(ROOT / area)
    naming = [
        f"{path.relative_to(ROOT)}: {match.group().decode()}"
        for path in files
        for match in OUTSIDE_DOCUMENTS.finditer(path.read_bytes())
    ]

    assert naming == [], "these files name documents that are not in the repository:\n" + "\n".join(naming)


def test_error_texts_table_has_every_case_of_the_tests_with_its_codes_and_wording() -> None:
    from tests.error_texts import CASES, table_row  # here only: the other checks need no numpy or gRPC

    page = (ROOT / "docs" / "protocol.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| ")]
    missing = [table_row(case) for case in CASES if not any(row.startswith(table_row(case)) for row in rows)]
    assert not missing, "docs/protocol.md's Error texts table lacks or differs on:\n" + "\n".join(missing)


def test_error_texts_wording_matches_the_text_each_test_expects() -> None:
    from tests.error_texts import CASES, pattern

    differing = [case.case for case in CASES if not pattern(case.wording).match(case.text)]
    assert not differing, f"the wording in the table does not cover the tested text of: {differing}"


def test_settings_page_is_what_switchyard_settings_prints_when_asked_for_markdown() -> None:
    from typer.testing import CliRunner  # here only, as above: the command tree imports typer and httpx

    from services.cli import app

    printed = CliRunner().invoke(app, ["settings", "--markdown"])
    assert printed.exit_code == 0, printed.output
    assert (ROOT / "docs" / "settings.md").read_text(encoding="utf-8") == printed.output, (
        "docs/settings.md is stale: run `switchyard settings --markdown > docs/settings.md`"
    )


# -- the first commands, run as written -----------------------------------------------------------------------------
DOC_TOKEN = "change-me"
"""The admin token the version-switching page exports before `make serve`."""
SWITCHYARD = Path(sys.executable).with_name("switchyard")


def fenced_blocks(text: str, language: str) -> list[str]:
    """The bodies of the fenced code blocks of ``language`` (```` ```bash ````, ...) in a Markdown text."""
    blocks: list[str] = []
    body: list[str] | None = None
    for line in text.splitlines():
        if body is None:
            if line.strip() == f"```{language}":
                body = []
        elif line.strip() == "```":
            blocks.append("\n".join(body))
            body = None
        else:
            body.append(line)
    return blocks


def section(text: str, heading: str) -> str:
    """The text under ``heading`` (a whole heading line) up to the next heading of its level or above."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if re.match(rf"#{{1,{level}}} ", lines[i])), len(lines))
    return "\n".join(lines[start:end])


def on_ports(command: str, http_url: str, grpc_url: str) -> str:
    """``command`` as typed against the default ports, sent to the test gateway's."""
    return command.replace("localhost:8000", http_url).replace("localhost:8001", grpc_url)


def test_fenced_blocks_and_sections_are_read_as_markdown_writes_them() -> None:
    text = "# A\n```bash\necho 1\n```\n## B\n```python\nx = 1\n```\n```bash\necho 2\n```\n## C\nc\n"

    assert fenced_blocks(text, "bash") == ["echo 1", "echo 2"]
    assert fenced_blocks(section(text, "## B"), "bash") == ["echo 2"]
    assert on_ports("curl localhost:8000/v2; grpc localhost:8001", "127.0.0.1:1", "127.0.0.1:2") == (
        "curl 127.0.0.1:1/v2; grpc 127.0.0.1:2")


@pytest.mark.slow  # a gateway on real ports, the examples' export
def test_readme_curl_and_triton_client_snippets_answer_as_written(example_repository: Path) -> None:
    from services.gateway.settings import Settings  # here only, as above: the gateway and its clients are heavy
    from tests.gateway_harness import running_gateway

    readme = README.read_text(encoding="utf-8")
    curls = [line for block in fenced_blocks(readme, "bash") for line in block.splitlines() if line.startswith("curl")]
    clients = [block for block in fenced_blocks(readme, "python") if "tritonclient" in block]
    assert curls, "the README shows no curl command"
    modules = {word for block in clients for word in block.split()}
    assert {"tritonclient.http", "tritonclient.grpc"} <= modules, "the README shows no HTTP or no gRPC client"
    settings = Settings(repository=example_repository, port=0, grpc_port=0, repository_poll_s=0)
    with running_gateway(settings) as gateway:
        for curl in curls:
            ran = subprocess.run(["bash", "-c", on_ports(curl, gateway.http_url, gateway.grpc_url)],
                                 capture_output=True, text=True, timeout=60)
            assert ran.returncode == 0, ran.stderr
            assert json.loads(ran.stdout)["model_version"] == "2", ran.stdout  # the stable version
        for client in clients:
            ran = subprocess.run([sys.executable, "-c", on_ports(client, gateway.http_url, gateway.grpc_url)],
                                 capture_output=True, text=True, timeout=60, cwd=ROOT)
            assert ran.returncode == 0, f"README snippet failed:\n{client}\n{ran.stderr}"
            assert ran.stdout.startswith("1 ["), ran.stdout  # the version it asked for, then the classes


@pytest.mark.slow  # a gateway on real ports, the examples' export
def test_version_switching_cli_lines_run_as_written_against_the_examples(example_repository: Path) -> None:
    from pydantic import SecretStr  # here only, as above

    from services.gateway.settings import Settings
    from tests.gateway_harness import running_gateway

    page = (ROOT / "docs" / "version-switching.md").read_text(encoding="utf-8")
    block = "\n".join(fenced_blocks(section(page, "## CLI"), "bash"))
    assert f"export SWITCHYARD_ADMIN_TOKEN={DOC_TOKEN} " in block
    lines = [line.split("  #")[0].strip() for line in block.splitlines() if line.startswith("switchyard models")]
    assert len(lines) >= 5, block
    settings = Settings(repository=example_repository, port=0, grpc_port=0, repository_poll_s=0,
                        admin_token=SecretStr(DOC_TOKEN))
    with running_gateway(settings) as gateway:
        env = {**os.environ, "PATH": f"{SWITCHYARD.parent}{os.pathsep}{os.environ.get('PATH', '')}",
               "SWITCHYARD_ADMIN_URL": f"http://{gateway.http_url}", "SWITCHYARD_ADMIN_TOKEN": DOC_TOKEN}
        for line in lines:
            ran = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=env, timeout=120)
            assert ran.returncode == 0, f"`{line}` exited {ran.returncode}: {ran.stderr}"
