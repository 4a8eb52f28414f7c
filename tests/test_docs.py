"""The README and the documentation site (docs/, built by `make docs`): every relative link and image resolves to a
file of the repository, the README stays short, and no file names documents that live outside the repository.

`mkdocs build --strict` checks the links between the pages of docs/; this checks what it cannot: the README's links
into docs/, and links from any page to files that are missing altogether. Fast, no network, no build."""

from __future__ import annotations

import re
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
