"""The repository explains itself: it cites its own documents, and those citations resolve.

Code, docs, charts, examples, scripts and tests once cited a specification that lives
outside the repository ("SPEC §9"), which a reader of the checkout cannot open. They now
cite `docs/…` (with a section anchor where one exists). These tests keep it that way: no
citation of the outside document is left, every relative link in docs/*.md and README.md
points at a file (and heading) that exists, and every `docs/NAME.md#anchor` written in
code or docs names a heading that exists. Pure: reads the checkout only.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import unicodedata

ROOT = pathlib.Path(__file__).resolve().parents[2]
THIS = pathlib.Path(__file__).resolve()

# What may not be cited: the outside specification, by section or by file.
FORBIDDEN = ("SPEC §", "SPEC.md", "../shared")
SECTION = re.compile(r"§\s*\d")
CHECKED_TOP = ("service", "client", "operator", "bench", "docs", "charts", "crds", "examples",
               "scripts", "tests", "proto")
CHECKED_FILES = ("README.md", "pyproject.toml", "Makefile")
TEXT_SUFFIXES = {".py", ".pyi", ".md", ".yaml", ".yml", ".toml", ".json", ".sh", ".proto",
                 ".tpl", ".txt", ".cfg", ".ini", ".j2", ".html", ".js", ".css", ""}

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOC_CITATION = re.compile(r"(?<![\w./-])((?:\.\./)*docs/[A-Za-z0-9_-]+\.md)(#[\w-]+)?")


def _files() -> list[pathlib.Path]:
    """Tracked files plus new ones not ignored (what a clone or the next commit holds)."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                             check=True, capture_output=True, text=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: walk it
        out = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
               and not {".git", ".venv", "node_modules"} & set(p.relative_to(ROOT).parts)]
    files = []
    for rel in out:
        parts = pathlib.PurePosixPath(rel).parts
        if not parts or not (parts[0] in CHECKED_TOP or rel in CHECKED_FILES):
            continue
        path = ROOT / rel
        if path.suffix in TEXT_SUFFIXES and path.is_file() and path.resolve() != THIS:
            files.append(path)
    return files


def _text(path: pathlib.Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link's text only
    text = unicodedata.normalize("NFC", text).lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def _outside_fences(text: str) -> list[str]:
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        lines.append("" if fenced else line)
    return lines


def anchors(doc: pathlib.Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in _outside_fences(doc.read_text(encoding="utf-8")):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def test_slug_follows_github_rules() -> None:
    assert slug("Authentication (`--auth`)") == "authentication---auth"
    assert slug("1. The error cleaner") == "1-the-error-cleaner"
    assert slug("Every answer fits; cost does not grow") == "every-answer-fits-cost-does-not-grow"
    assert slug("On Kubernetes: the chart's defaults") == "on-kubernetes-the-charts-defaults"


def test_no_citation_of_the_outside_specification_is_left() -> None:
    offending = []
    for path in _files():
        text = _text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            hit = next((f for f in FORBIDDEN if f in line), None)
            if hit is None:
                # a bare "§5.3" left over from "SPEC §2, §5.3"; RFC sections are fine
                m = SECTION.search(line)
                if m and "RFC" not in line[:m.start()]:
                    hit = m.group(0)
            if hit is not None:
                offending.append(f"{path.relative_to(ROOT)}:{number}: {hit!r}: {line.strip()}")
    assert offending == [], "cite docs/… instead:\n" + "\n".join(offending)


def _relative_links() -> list[tuple[pathlib.Path, str]]:
    docs = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
    links = []
    for doc in docs:
        for line in _outside_fences(doc.read_text(encoding="utf-8")):
            for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
                if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto:, …
                    links.append((doc, target))
    return links


def test_every_relative_link_in_the_docs_resolves() -> None:
    links = _relative_links()
    assert len(links) > 50  # the docs link to each other: the parsing found them
    broken = []
    for doc, target in links:
        path_part, _, anchor = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        where = f"{doc.relative_to(ROOT)}: ({target})"
        if not dest.exists():
            broken.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{where}: no heading with anchor #{anchor} in {dest.name}")
    assert broken == [], "\n".join(broken)


def test_every_docs_citation_in_code_and_docs_resolves() -> None:
    citations = 0
    broken = []
    for path in _files():
        text = _text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for m in DOC_CITATION.finditer(line):
                citations += 1
                doc = ROOT / "docs" / m.group(1).rsplit("/", 1)[1]
                anchor = (m.group(2) or "#")[1:]
                where = f"{path.relative_to(ROOT)}:{number}: {m.group(0)}"
                if not doc.exists():
                    broken.append(f"{where}: no such document")
                elif anchor and anchor not in anchors(doc):
                    broken.append(f"{where}: no heading with that anchor")
    assert citations > 100  # code cites its docs: the scan found them
    assert broken == [], "\n".join(broken)

