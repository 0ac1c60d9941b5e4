"""The front page and docs/ hold together: every relative link resolves, no page is orphaned, README stays short.

Pure Python: no model, no Qt.
"""

from __future__ import annotations

import re
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 250

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
# [text](target) and ![alt](target), an optional "title" after the target; link text may wrap lines.
LINK = re.compile(r"!?\[([^\]]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = ("http://", "https://", "mailto:")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def blank_fences(text: str) -> str:
    """The text with fenced code blocks blanked out, line count kept."""
    out, fence = [], ""
    for line in text.split("\n"):
        m = FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = ""
            out.append("")
        elif m:
            fence = m.group(1)
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


def prose(text: str) -> str:
    """The text outside code: fences blanked, inline code spans (never across a blank line) removed."""
    paragraphs = re.split(r"\n\s*\n", blank_fences(text))
    return "\n\n".join(INLINE_CODE.sub("", para) for para in paragraphs)


def links(path: Path) -> list[str]:
    return [m.group(2) for m in LINK.finditer(prose(path.read_text(encoding="utf-8")))]


def slugify(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped (hyphens kept), spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in blank_fences(path.read_text(encoding="utf-8")).split("\n"):
        m = HEADING.match(line)
        if not m:
            continue
        base = slugify(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_slugify_follows_github():
    assert slugify("Benchmarks: `kvgraft bench --quick --out docs/bench`") == (
        "benchmarks-kvgraft-bench---quick---out-docsbench"
    )
    assert slugify('What "exact" means: the same tokens') == "what-exact-means-the-same-tokens"
    assert slugify("A library 10x the model's context, on disk") == "a-library-10x-the-models-context-on-disk"


def test_parser_skips_code():
    text = "[a](one.md)\n```sh\n[b](two.md)\n```\n`[c](three.md)` and ![d](four.png)\n"
    found = [m.group(2) for m in LINK.finditer(prose(text))]
    assert found == ["one.md", "four.png"]


def test_relative_links_resolve():
    broken = []
    for page in pages():
        for target in links(page):
            if target.startswith(EXTERNAL):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            if not dest.exists():
                broken.append(f"{rel(page)}: [{target}] -> {file_part} does not exist")
                continue
            if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{rel(page)}: [{target}] -> no heading in {rel(dest)} slugifies to #{anchor}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_docs_page_is_reachable_from_readme():
    reached = {README.resolve()}
    queue = deque([README.resolve()])
    while queue:
        page = queue.popleft()
        for target in links(page):
            file_part = target.partition("#")[0]
            if target.startswith(EXTERNAL) or not file_part.endswith(".md"):
                continue
            dest = (page.parent / file_part).resolve()
            if dest.exists() and dest not in reached:
                reached.add(dest)
                queue.append(dest)
    orphans = [rel(p) for p in sorted(DOCS.glob("*.md")) if p.resolve() not in reached]
    assert not orphans, f"docs pages not linked from README.md or a page reachable from it: {orphans}"


def test_readme_is_a_front_page():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n < README_MAX_LINES, f"README.md has {n} lines (limit {README_MAX_LINES}): move detail into docs/"
    assert "make test" in README.read_text(encoding="utf-8"), "README.md must show `make test` (CI runs it)"


def test_every_test_file_has_a_time_budget():
    """docs/testing.md gives each test file its time in `make test`; a new file says what it may take
    (tests/timing_budget.py reports files past their budget after each run)."""
    from tests.timing_budget import budgets

    table = budgets()
    files = {
        f"tests/{p.name}"
        for p in (ROOT / "tests").glob("test_*.py")
        if not re.search(r"^pytestmark = pytest\.mark\.slow$", p.read_text(), re.M)  # slow cases only
    }
    assert not files - set(table), f"no budget row in docs/testing.md: {sorted(files - set(table))}"
    assert not set(table) - files, f"budget rows for files that are gone: {sorted(set(table) - files)}"
    assert all(seconds > 0 for seconds in table.values())
