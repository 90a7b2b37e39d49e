"""Every relative link in the user docs (README.md, docs/*.md) and the lab's index names a path that exists.

docs/simulator.md is left out here: its own tests own it. Links to a web address or to an anchor of the same page
are not paths; ``path#anchor`` is checked for the path only.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import REPO

PAGES = sorted(
    [REPO / "README.md", REPO / "lab" / "README.md", *(REPO / "docs").glob("*.md")],
)
PAGES = [page for page in PAGES if page.name != "simulator.md" and page.exists()]
# [text](target) and ![alt](target); the target ends at the first space or closing parenthesis
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def relative_targets(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)  # code blocks are not links
    targets = [match.group(1) for match in LINK.finditer(text)]
    return [target for target in targets if not re.match(r"[a-z]+:", target) and not target.startswith("#")]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    missing = [target for target in relative_targets(page) if not (page.parent / target.split("#", 1)[0]).exists()]
    assert not missing, f"{page.relative_to(REPO)}: links to missing paths: {missing}"
