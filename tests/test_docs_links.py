"""The README's and docs/' links land: every relative link names a file of the repository, and
every ``#anchor`` a heading of that file (sections move between pages; a link must follow)."""

import re
from pathlib import Path

import pytest

from tests.helpers.repo import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of every heading of ``page`` (lines starting with '#', outside code blocks)."""
    found, in_code = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            found.add(anchor(line.lstrip("#")))
    return found


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file or anchor does not exist."""
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target}: no heading #{fragment} in {linked.name}")
    return broken


def test_anchor_follows_github() -> None:
    assert anchor(" ImageNet, the reference set") == "imagenet-the-reference-set"
    assert anchor(" Text models: `vitplasticity recommend-text`") == (
        "text-models-vitplasticity-recommend-text"
    )


def test_broken_links_finds_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[a](page.md#title) [b](gone.md) [c](#nowhere) [d](https://x.org)\n")
    assert [line.split(":")[0] for line in broken_links(page)] == ["gone.md", "#nowhere"]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_link_lands(page: Path) -> None:
    assert broken_links(page) == []
