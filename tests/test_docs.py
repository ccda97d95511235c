"""The docs against the tree: every rljax module the docs name exists, every module has a
line in docs/design.md's module map, the README stays short, and no file narrates the
project's history by ticket or milestone number (git history keeps that)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rljax"
DOCS = sorted((ROOT / "docs").glob("*.md"))
DOC_FILES = [ROOT / "README.md", *DOCS]
README_MAX_LINES = 300

# What the history check reads: the repository's tracked text files under these roots.
CHECKED_ROOTS = ("rljax", "tests", "configs", "launch", "docs", "README.md", "pyproject.toml", ".ci")
# "<ticket word> <number>" or "<milestone word> <number>", case-insensitive (as
# `grep -rEni`). Built from pieces so that this file does not match itself.
HISTORY = re.compile("(" + "iss" + "ue" + "|" + "st" + "op" + ") [0-9]+", re.IGNORECASE)

MODULE_PATH = re.compile(r"(?<![\w/.])rljax/[\w/]+\.py\b")
DOTTED = re.compile(r"(?<![\w.])rljax(?:\.[A-Za-z_]\w*)+")
RELATIVE_PATH = re.compile(r"`([a-z_]+(?:/[a-z_]+)*\.py)`")


def _module_file(parts: list[str]) -> Path | None:
    """The file of module `rljax.<parts>` (a module or a package), or None."""
    base = PACKAGE.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _resolve_dotted(name: str) -> str | None:
    """None if `name` (``rljax.a.b[.attr[.attr]]``) names a module, or an attribute defined in
    the longest module prefix; else what is missing."""
    parts = name.split(".")[1:]
    for cut in range(len(parts), -1, -1):
        source = PACKAGE / "__init__.py" if cut == 0 else _module_file(parts[:cut])
        if source is None:
            continue
        rest = parts[cut:]
        if not rest:
            return None
        if re.search(rf"\b{re.escape(rest[0])}\b", source.read_text()):
            return None
        return f"{name}: `{rest[0]}` is not in {source.relative_to(ROOT)}"
    return f"{name}: no such module"


def _module_map(text: str) -> str:
    start = text.index("## Module map")
    end = text.index("\n## ", start + 1)
    return text[start:end]


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: p.name)
def test_named_modules_exist(doc):
    text = doc.read_text()
    missing = [p for p in sorted(set(MODULE_PATH.findall(text))) if not (ROOT / p).is_file()]
    missing += [m for m in map(_resolve_dotted, sorted(set(DOTTED.findall(text)))) if m]
    assert not missing, f"{doc.name} names what the tree does not have: {missing}"


def test_module_map_paths_exist():
    """Paths in the map are relative to rljax/ (`rollout/assign.py`) or to the repository
    (`tests/...`); a bare file name is checked where it opens a line of the map."""
    module_map = _module_map((ROOT / "docs" / "design.md").read_text())
    paths = {p for p in RELATIVE_PATH.findall(module_map) if "/" in p}
    paths |= set(re.findall(r"^- `([a-z_]+\.py)`", module_map, re.MULTILINE))
    assert "rollout/assign.py" in paths and "config.py" in paths
    missing = [p for p in sorted(paths) if not (PACKAGE / p).is_file() and not (ROOT / p).is_file()]
    assert not missing, f"design.md's module map names modules that do not exist: {missing}"


def test_every_module_is_in_the_module_map():
    module_map = _module_map((ROOT / "docs" / "design.md").read_text())
    modules = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                     if p.name != "__init__.py")
    assert modules, "no modules found under rljax/"
    missing = [m for m in modules if f"`{m}`" not in module_map]
    assert not missing, f"add a line per module to docs/design.md's module map: {missing}"


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


def test_readme_keeps_the_ci_test_command():
    text = (ROOT / "README.md").read_text()
    assert "XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest -q tests\n" in text
    assert "../shared" not in text


def _tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *CHECKED_ROOTS], cwd=ROOT,
                             capture_output=True, check=True).stdout
        paths = [ROOT / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file there
        paths = [p for root in CHECKED_ROOTS for p in
                 ([ROOT / root] if (ROOT / root).is_file() else (ROOT / root).rglob("*"))]
    return [p for p in paths if p.is_file()]


def test_history_pattern_matches_what_it_must():
    assert HISTORY.search("see " + "Iss" + "ue 28")
    assert HISTORY.search("at " + "st" + "op 24,")
    assert not HISTORY.search("stops at 24; issues: 3")


def test_no_history_by_number():
    files = _tracked_text_files()
    assert any(p.name == "README.md" for p in files)
    hits = []
    for path in files:
        try:
            text = path.read_text()
        except UnicodeDecodeError:  # binary
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if HISTORY.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not hits, "describe what is; git history keeps how it came to be:\n" + "\n".join(hits)
