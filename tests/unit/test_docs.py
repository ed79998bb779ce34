"""The docs hold together: every relative link in README.md, docs/*.md and benchmarks/README.md points
at a file that exists (and, for `file.md#anchor`, at a heading that exists, by GitHub's slug rules), and
the README stays a front page: short, with `make demo` and `make test` at the top."""
from __future__ import annotations

import re
import sys
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 200
COMMANDS_WITHIN = 30  # `make demo` and `make test` must appear in the README's first lines


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]


FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_LINK = re.compile(r"""<(?:a|img)\s[^>]*?(?:href|src)=["']([^"']+)["']""", re.IGNORECASE)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks and with inline code removed."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, INLINE_CODE.sub("", line)))
    return out


def links(text: str) -> list[tuple[int, str]]:
    found = []
    for number, line in prose_lines(text):
        for pattern in (INLINE_LINK, HTML_LINK):
            found += [(number, m.group(1)) for m in pattern.finditer(line)]
        if m := REFERENCE_DEF.match(line):
            found.append((number, m.group(1)))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lowercased, with every character that is not
    a letter, a digit, a space, '-' or '_' dropped, and spaces turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading renders as its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub makes for the file's headings (a repeated slug gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced or not (m := HEADING.match(line)):
            continue
        base = slug(m.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, target in links(path.read_text(encoding="utf-8")):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
            continue  # absolute URL (https:, mailto:, ...): not checked here
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / unquote(file_part)).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not resolved.exists():
            problems.append(f"{where}: no such file {resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved}")
        elif not resolved.is_relative_to(ROOT):
            problems.append(f"{where}: points outside the repository")
        elif anchor and resolved.suffix == ".md" and unquote(anchor).lower() not in anchors(resolved):
            problems.append(f"{where}: no heading with anchor #{anchor} in {resolved.relative_to(ROOT)}")
    return problems


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    assert path.exists(), f"{path.relative_to(ROOT)} is missing"
    problems = broken_links(path)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"
    top = "\n".join(lines[:COMMANDS_WITHIN])
    assert "make demo" in top and "make test" in top, \
        f"README.md must show `make demo` and `make test` within its first {COMMANDS_WITHIN} lines"


def test_checker_sees_broken_links_and_anchors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker itself: a missing file, a missing anchor and a link in code are told apart."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "other.md").write_text("# The `gangctl sim` command: a tour!\n## Step 1\n## Step 1\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[ok](other.md#the-gangctl-sim-command-a-tour) [dup](other.md#step-1-1) [self](#top)\n"
        "# Top\n[gone](missing.md) [bad anchor](other.md#nope) [web](https://example.org/x)\n"
        "`[code](not-checked.md)`\n```\n[fenced](not-checked.md)\n```\n")
    problems = broken_links(doc)
    assert len(problems) == 2, problems
    assert "missing.md" in problems[0] and "#nope" in problems[1]
