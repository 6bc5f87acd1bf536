"""Every reference a reader can follow resolves inside the repository: a clone is all anyone has.

Two checks. The links of README.md and docs/*.md (parsed with markdown-it, which rich already
brings, so code blocks and code spans are not mistaken for links) point at files that exist, and a
``#fragment`` names a heading of the target (GitHub's slug). And every ``*.md`` file named in a
comment or docstring of the code (c4d/, native/, analysis/, scripts/, tests/) or in the prose of
the docs exists, at the repository root, under docs/ or beside the file that names it. A file of
another project is named with that project (``NVIDIA/nccl plugins/profiler/README.md``) and is
not ours to check.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
import unicodedata
from collections import Counter
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE_DIRS = ["c4d", "native", "analysis", "scripts", "tests"]
C_SUFFIXES = {".h", ".hpp", ".c", ".cc", ".cpp", ".cu"}
SKIP_PARTS = {"__pycache__", "_native", "upstream_nccl"}  # built files; vendored upstream headers

# Projects whose files we cite by their own paths (the name of the project just before the path).
UPSTREAM = ("NVIDIA/nccl-tests", "NVIDIA/nccl", "pytorch/pytorch", "pytorch/tutorials")
_UPSTREAM_BEFORE = re.compile("(?:" + "|".join(map(re.escape, UPSTREAM)) + r")(?:'s)?[\s:`(]*$")
_MD_NAME = re.compile(r"(?<![\w./-])((?:\.\.?/)*(?:[\w.-]+/)*[\w.-]+\.md)(?![\w/])")

_md = MarkdownIt("commonmark").enable("table")


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


# --- markdown links ----------------------------------------------------------------------------


def _inline_children(path: Path):
    for tok in _md.parse(path.read_text(encoding="utf-8")):
        yield tok
        yield from tok.children or []


def github_slug(text: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, each space a hyphen."""
    keep = []
    for ch in text.strip().lower():
        cat = unicodedata.category(ch)
        if ch in " -" or cat[0] in "LMN" or cat == "Pc":
            keep.append("-" if ch == " " else ch)
    return "".join(keep)


@cache
def anchors(path: Path) -> frozenset[str]:
    """The fragment ids GitHub gives the headings of ``path`` (a repeated slug gets -1, -2, ...)."""
    toks = _md.parse(path.read_text(encoding="utf-8"))
    seen: Counter[str] = Counter()
    out = set()
    for i, tok in enumerate(toks):
        if tok.type != "heading_open":
            continue
        text = "".join(c.content for c in toks[i + 1].children or [] if c.type in ("text", "code_inline"))
        slug = github_slug(text)
        out.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return frozenset(out)


def links(path: Path) -> list[str]:
    out = []
    for tok in _inline_children(path):
        if tok.type == "link_open":
            out.append(str(tok.attrs.get("href", "")))
        elif tok.type == "image":
            out.append(str(tok.attrs.get("src", "")))
    return out


def broken_links(path: Path) -> list[str]:
    bad = []
    for href in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", href, re.I):  # http:, https:, mailto:
            continue
        target, _, frag = href.partition("#")
        dest = (path.parent / unquote(target)).resolve() if target else path
        if not dest.exists():
            bad.append(f"{_rel(path)}: ({href}): no file {target}")
        elif not dest.is_relative_to(ROOT):
            bad.append(f"{_rel(path)}: ({href}): outside the repository")
        elif frag and dest.suffix == ".md" and unquote(frag) not in anchors(dest):
            bad.append(f"{_rel(path)}: ({href}): no heading #{frag} in {_rel(dest)}")
    return bad


# --- *.md names in code comments, docstrings and docs prose ------------------------------------


def _python_texts(src: str) -> list[str]:
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type == tokenize.COMMENT:
                out.append(tok.string)
    except (tokenize.TokenError, SyntaxError):
        pass
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append(doc)
    return out


def _c_texts(src: str) -> list[str]:
    src = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', src)  # "tcp://..." is not a comment
    return re.findall(r"/\*.*?\*/|//[^\n]*", src, re.S)


def _hash_texts(src: str) -> list[str]:
    return [m[1] for m in re.finditer(r"(?:^|\s)(#[^\n]*)", src)]


def _prose(path: Path) -> list[str]:
    """A markdown page's paragraphs and cells outside fenced code, code spans included (a file
    name in one is cited), each as one string so that an upstream project's name stays in front
    of the path it qualifies."""
    out = []
    for tok in _md.parse(path.read_text(encoding="utf-8")):
        if tok.type == "inline":
            parts = [c.content if c.type in ("text", "code_inline") else " " for c in tok.children or []]
            out.append("".join(parts))
    return out


def texts(path: Path) -> list[str]:
    src = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".py":
        return _python_texts(src)
    if path.suffix in C_SUFFIXES:
        return _c_texts(src)
    if path.suffix == ".md":
        return _prose(path)
    if path.suffix in (".sh", ".txt", ".cmake", "") or path.name == "CMakeLists.txt":
        return _hash_texts(src)
    return []


def cited(text: str) -> list[str]:
    """The ``*.md`` names in ``text`` that are ours (not preceded by an upstream project's name)."""
    return [m[1] for m in _MD_NAME.finditer(text) if not _UPSTREAM_BEFORE.search(text[: m.start()])]


def resolves(name: str, where: Path) -> bool:
    return any((base / name).is_file() for base in (ROOT, ROOT / "docs", where.parent))


def code_files() -> list[Path]:
    out = []
    for d in CODE_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if p.is_file() and not SKIP_PARTS.intersection(p.relative_to(ROOT).parts):
                out.append(p)
    return out


def dangling_citations(files: list[Path]) -> list[str]:
    bad = []
    for p in files:
        for text in texts(p):
            for name in cited(text):
                if not resolves(name, p):
                    bad.append(f"{_rel(p)}: {name}")
    return sorted(set(bad))


# --- the checker's own behaviour ---------------------------------------------------------------


def test_slugs_are_githubs():
    assert github_slug("Ports, firewalls and --bind") == "ports-firewalls-and---bind"
    assert github_slug("3. Nobody outside the job can make it isolate a node") == (
        "3-nobody-outside-the-job-can-make-it-isolate-a-node"
    )
    assert github_slug("--json: every diagnosis") == "--json-every-diagnosis"
    assert github_slug("Thresholds × periods_µs") == "thresholds--periods_µs"


def test_the_checker_finds_what_is_broken(tmp_path, monkeypatch):
    """A page with a missing file, a missing heading and a good link; code citing a missing page."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## `c4d run`: the flow\n\ntext\n")
    page = tmp_path / "README.md"
    page.write_text(
        "# T\n[ok](docs/a.md#c4d-run-the-flow) [gone](docs/b.md) [no heading](docs/a.md#nope)\n"
        "[self](#t) ![img](docs/a.md) [web](https://example.com/x.md)\n\n"
        "```\n[in code](docs/c.md)\n```\n"
        "Facts: `GONE.md`, `docs/a.md`, NVIDIA/nccl `plugins/profiler/README.md`.\n"
    )
    assert broken_links(page) == [
        "README.md: (docs/b.md): no file docs/b.md",
        "README.md: (docs/a.md#nope): no heading #nope in docs/a.md",
    ]
    code = tmp_path / "mod.py"
    code.write_text(
        '"""Contract: DESIGN.md; see a.md and docs/a.md."""\n'
        "x = 'notes.md'  # NVIDIA/nccl plugins/profiler/README.md, and GONE.md\n"
    )
    header = tmp_path / "x.h"
    header.write_text('/* facts: shared/reference/x.md */\nconst char* s = "y.md"; // docs/a.md\n')
    assert dangling_citations([page, code, header]) == [
        "README.md: GONE.md",
        "mod.py: DESIGN.md",
        "mod.py: GONE.md",
        "x.h: shared/reference/x.md",
    ]


# --- the repository ---------------------------------------------------------------------------


@pytest.mark.parametrize("page", DOCS, ids=_rel)
def test_markdown_links_resolve(page: Path):
    assert not broken_links(page), "\n".join(broken_links(page))


@pytest.mark.slow
def test_md_files_cited_in_code_exist():
    bad = dangling_citations(code_files())
    assert not bad, "cited but not in the repository:\n" + "\n".join(bad)


def test_md_files_named_in_docs_exist():
    bad = dangling_citations(DOCS)
    assert not bad, "named but not in the repository:\n" + "\n".join(bad)
