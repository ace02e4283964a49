"""Every link between the documentation pages leads to a file that exists.

The reference pages under ``docs/`` point at dated findings pages under ``docs/findings/``
and at each other; pages get renamed and split. This checks the relative Markdown links
(``[text](path)``) of ``README.md`` and every page under ``docs/``, and the plain mentions
of a page (``docs/NAME.md``), so that a moved page cannot leave a dead link behind.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])

#: ``[text](target)`` and ``![alt](target)``; the target ends at the first space or ``)``
MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
#: a page named by its path from the repository root, e.g. ``docs/findings/x.md``
PAGE_MENTION = re.compile(r"(?<![\w/.-])(docs/[\w./-]+\.md)\b")


def relative_targets(text: str) -> list[str]:
    """The link targets of ``text`` that point into the repository (no scheme, no
    mail address, no in-page anchor), without their ``#fragment``."""
    targets = []
    for match in MARKDOWN_LINK.finditer(text):
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    dead = [t for t in relative_targets(text) if not (page.parent / t).exists()]
    assert not dead, f"{page.relative_to(REPO)} links to missing files: {dead}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_page_mentions_resolve(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    dead = sorted({m for m in PAGE_MENTION.findall(text) if not (REPO / m).exists()})
    assert not dead, f"{page.relative_to(REPO)} names pages that do not exist: {dead}"


def test_every_docs_page_is_listed_in_the_index() -> None:
    index = (REPO / "docs" / "README.md").read_text(encoding="utf-8")
    listed = {(REPO / "docs" / t).resolve() for t in relative_targets(index)}
    pages = {p.resolve() for p in (REPO / "docs").rglob("*.md")} - {
        (REPO / "docs" / "README.md").resolve()}
    missing = sorted(str(p.relative_to(REPO)) for p in pages - listed)
    assert not missing, f"docs/README.md does not list: {missing}"


def test_relative_targets_skips_urls_and_anchors() -> None:
    text = ("[a](https://example.org/x.md) [b](#section) [c](findings/x.md#part) "
            "![d](figures/y.png) [e](mailto:someone@example.org)")
    assert relative_targets(text) == ["findings/x.md", "figures/y.png"]
