"""The README and docs/ hold together: every relative link and #anchor in README.md and docs/*.md
resolves (the file exists; the anchor is a heading's slug as GitHub makes it), every repository path
they name exists, the README starts with the two commands and stays a five-minute read (≤ 200
lines), its screenshot exists, a 1,280 px wide PNG (`bench/screenshot.py` makes it), and docs/api.md
lists every operation of the API."""

from __future__ import annotations

import json
import re
import struct
import unicodedata
from pathlib import Path

from support import REPO

README = REPO / "README.md"
DOCS = sorted((REPO / "docs").rglob("*.md"))
SCREENSHOT = REPO / "docs" / "images" / "compare.png"

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.M)


def prose(text: str) -> str:
    """`text` without its fenced code blocks and code spans, where a link is no link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (links as their text, no code marks) lower-cased,
    every character but letters, marks, digits, connector punctuation, spaces and hyphens dropped,
    spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    kept = (
        c for c in text if c in " -" or unicodedata.category(c)[0] in "LMN" or unicodedata.category(c) == "Pc"
    )
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives `path`'s headings: a repeated slug gets -1, -2, … in order."""
    seen: dict[str, int] = {}
    out = set()
    for match in HEADING.finditer(FENCE.sub("", path.read_text())):
        base = slug(match.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path, text: str, root: Path = REPO) -> list[str]:
    """Each link in `text` (the contents of `path`) that does not resolve inside `root`, with why."""
    broken = []
    for target in LINK.findall(prose(text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http(s), mailto: not ours to check here
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.is_relative_to(root) or not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(root)}")
    return broken


def test_slugs_as_github_makes_them():
    assert (
        slug("6. Staleness: which policy generates each batch")
        == "6-staleness-which-policy-generates-each-batch"
    )
    assert slug("15. Claims and rliable's statistics") == "15-claims-and-rliables-statistics"
    assert slug("The maths `rlcore` implements") == "the-maths-rlcore-implements"
    assert slug("Adding workers, and a GPU worker") == "adding-workers-and-a-gpu-worker"
    assert slug("What `make up` starts") == "what-make-up-starts"


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Two words\n")
    text = (
        "[ok](#two-words) [ok](page.md#title) [gone](missing.md) [bad anchor](page.md#three) "
        "[web](https://example.org/x.md) `[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n"
    )
    assert broken_links(page, text, root=tmp_path) == [
        "missing.md: no such file",
        "page.md#three: no heading #three in page.md",
    ]


def test_every_link_in_the_readme_and_docs_resolves():
    assert DOCS, "docs/ has no Markdown files"
    broken = {
        str(path.relative_to(REPO)): found
        for path in [README, *DOCS]
        if (found := broken_links(path, path.read_text()))
    }
    assert broken == {}


def test_the_readme_starts_with_the_two_commands_and_stays_short():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    first_block = FENCE.search(text).group(0).splitlines()[1:-1]
    assert [line.split("#")[0].strip() for line in first_block] == ["make up", "make test"]
    assert text.index("```") < text.index("\n## "), "the commands come before any section"


def test_the_readme_shows_its_screenshot():
    assert "docs/images/compare.png" in LINK.findall(prose(README.read_text()))
    head = SCREENSHOT.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert width == 1280 and 0 < height <= 1600


def test_the_api_page_lists_every_operation():
    """docs/api.md's table has a row for each operation of the OpenAPI document
    (`openapi-snapshot.json`, which `test_openapi` holds to the live schema), and no other."""
    spec = json.loads((REPO / "tests" / "platform" / "lab" / "openapi-snapshot.json").read_text())
    expected = {(method.upper(), path) for path, ops in spec["paths"].items() for method in ops}
    text = (REPO / "docs" / "api.md").read_text()
    assert set(re.findall(r"^\| `([A-Z]+) (/api/\S*)` \|", text, re.M)) == expected


def test_every_repository_path_they_name_exists():
    """A path under one of the repository's top folders, named in code marks (`platform/lab/web.py`),
    is there: a file that moved takes its mentions with it."""
    # var/ (and .venv/) are made at run time: what the docs name there need not exist in a checkout.
    source = (p.name for p in REPO.iterdir() if p.is_dir() and p.name[0] != "." and p.name != "var")
    tops = "|".join(sorted(source))
    named = re.compile(rf"`((?:{tops})/[^`\s<>*]*)`")
    missing = {
        f"{path.relative_to(REPO)}: {target}"
        for path in [README, *DOCS]
        for target in named.findall(FENCE.sub("", path.read_text()))
        if not (REPO / target).exists()
    }
    assert missing == set()
