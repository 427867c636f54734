"""The docs cannot go stale silently: every path they name exists, every module is on the map.

Checked: README.md, docs/*.md and every folder README (benchmarks/results' records of past runs
included). A section titled "Old → new" names old paths on purpose and is skipped.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "server"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
SKIP_DIRS = {".venv", "node_modules", ".git", "__pycache__"}

# server/... paths, and server-relative ones that start with a subpackage (``routing/forward.py``)
_PACKAGES = sorted(p.name for p in SERVER.iterdir() if p.is_dir() and (p / "__init__.py").exists())
_SERVER_PATH = re.compile(r"(?<![\w/.-])server/[\w/.-]*\w(?:/)?")
_PACKAGE_PATH = re.compile(r"(?<![\w/.-])(?:" + "|".join(_PACKAGES + ["masking"]) + r")/[\w/]+\.py\b")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_PY_NAME = re.compile(r"(?<![\w/.-])([A-Za-z_]\w*\.py)\b")
_TABLE_FILES = re.compile(r"`([\w./-]+\.py)`")


def doc_files() -> list[Path]:
    readmes = [
        p
        for p in ROOT.rglob("README.md")
        if not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)
        and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)  # .venv, .gpu, ...
    ]
    return sorted({ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *readmes})


def checked_text(text: str) -> str:
    """The text without its "Old → new" sections (they name removed paths on purpose)."""
    out, skipping, level = [], False, 0
    for line in text.splitlines():
        heading = re.match(r"(#+) ", line)
        if heading and skipping and len(heading.group(1)) <= level:
            skipping = False
        if heading and "Old → new" in line:
            skipping, level = True, len(heading.group(1))
        if not skipping:
            out.append(line)
    return "\n".join(out)


@functools.cache
def _py_names(root: Path) -> set[str]:
    """Module file names in the tree (the skipped folders are never walked: .venv alone took ~20 s)."""
    names = set()
    for _folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        names.update(f for f in files if f.endswith(".py"))
    return names


def missing_paths(text: str, doc_dir: Path, root: Path = ROOT) -> list[str]:
    """Paths a doc names that do not exist: ``server/…`` (files and folders), server-relative
    module paths, and relative Markdown links."""
    text = checked_text(text)
    missing = []
    for m in _SERVER_PATH.finditer(text):
        path = m.group(0).rstrip(".")
        if not (root / path).exists():
            missing.append(path)
    for m in _PACKAGE_PATH.finditer(text):
        if not (root / "server" / m.group(0)).exists():
            missing.append(m.group(0))
    names = _py_names(root)
    for m in _PY_NAME.finditer(text):
        if m.group(1) not in names:
            missing.append(m.group(1))  # a bare module name that no file has any more
    for m in _LINK.finditer(text):
        target = m.group(1).split("#")[0]
        if not target or re.match(r"[a-z]+:", target):
            continue  # an anchor in the same page, or a URL
        if not (doc_dir / target).exists():
            missing.append(target)
    return missing


def test_every_path_the_docs_name_exists():
    stale = {}
    for doc in doc_files():
        missing = missing_paths(doc.read_text(), doc.parent)
        if missing:
            stale[str(doc.relative_to(ROOT))] = sorted(set(missing))
    assert not stale, f"docs name paths that do not exist (fix the doc or the path): {stale}"


def test_the_path_check_can_fail(tmp_path):
    (tmp_path / "server" / "constrain").mkdir(parents=True)
    (tmp_path / "server" / "constrain" / "trie.py").write_text("")
    text = (
        "`server/constrain/trie.py` is fine, `server/masking/trie.py` moved, so did "
        "engines/hf.py; [gone](docs/gone.md)\n## Old → new\n`server/masking/vocab.py`\n## Next\n"
        "`server/kv_tiers.py`, `vllm_startup.py`"
    )
    assert missing_paths(text, tmp_path, tmp_path) == [
        "server/masking/trie.py",
        "server/kv_tiers.py",
        "engines/hf.py",
        "vllm_startup.py",
        "docs/gone.md",
    ]


def modules() -> list[str]:
    return sorted(
        str(p.relative_to(ROOT))
        for p in SERVER.rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    )


def test_every_module_has_its_line_in_the_architecture_doc():
    text = checked_text(ARCHITECTURE.read_text())
    rows = set(re.findall(r"^\| `(server/[\w/]+\.py)` \|", text, re.MULTILINE))
    unlisted, gone = set(modules()) - rows, rows - set(modules())
    assert not unlisted, f"add a line to docs/architecture.md for {sorted(unlisted)}"
    assert not gone, f"docs/architecture.md lists modules that are gone: {sorted(gone)}"
    assert "docs/architecture.md" in (ROOT / "README.md").read_text()


def _covered_files(folder: Path) -> list[Path]:
    """The .py files a folder's README answers for: its own and those of subfolders without a README."""
    out = []
    for p in sorted(folder.rglob("*.py")):
        if p.name == "__init__.py" or "__pycache__" in p.parts:
            continue
        owner = next(d for d in [p.parent, *p.parent.parents] if (d / "README.md").exists() or d == folder)
        if owner == folder:
            out.append(p)
    return out


def unlisted_files(readme: Path) -> list[str]:
    """Files of the README's folder it does not name (as `path` or, for a `sub/*.py` row, `stem`),
    and the files its tables name that do not exist."""
    text = readme.read_text()
    folder = readme.parent
    problems = []
    for p in _covered_files(folder):
        rel = p.relative_to(folder)
        glob_row = f"`{rel.parent}/*.py`" in text and f"`{p.stem}`" in text
        if f"`{rel}`" not in text and not glob_row:
            problems.append(f"{rel} is not listed")
    for line in text.splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            for name in _TABLE_FILES.findall(first_cell):
                if not (folder / name).exists():
                    problems.append(f"{name} is listed but does not exist")
    return problems


def test_every_folder_readme_lists_its_files():
    readmes = [p for p in SERVER.rglob("README.md")] + [ROOT / "benchmarks" / "README.md"]
    problems = {str(r.relative_to(ROOT)): unlisted_files(r) for r in readmes}
    problems = {k: v for k, v in problems.items() if v}
    assert not problems, problems


def test_the_folder_check_can_fail(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("a.py", "b.py", "sub/c.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "README.md").write_text("| file | job |\n|---|---|\n| `a.py` | x |\n| `gone.py` | y |\n")
    assert unlisted_files(tmp_path / "README.md") == [
        "b.py is not listed",
        "sub/c.py is not listed",
        "gone.py is listed but does not exist",
    ]


def _section(text: str, title: str) -> str:
    """The text of the ``## title…`` section (up to the next ``## ``)."""
    out, inside = [], False
    for line in text.splitlines():
        if line.startswith("## "):
            inside = line[3:].startswith(title)
        elif inside:
            out.append(line)
    return "\n".join(out)


def runtime_drawing_problems(section: str, package: Path) -> list[str]:
    """Modules of ``package`` the drawing leaves out, and bare ``.py`` / ``.c`` names it shows that
    the package no longer has (paths such as ``server/chat/x.py`` are the path check's)."""
    files = {p.name for p in package.rglob("*") if p.suffix in (".py", ".c") and p.name != "__init__.py"}
    shown = set(re.findall(r"(?<![\w/.-])(\w+\.(?:py|c))\b", section))
    return [f"{n} is not drawn" for n in sorted(files - shown)] + [
        f"{n} is drawn but gone" for n in sorted(shown - files)
    ]


def test_the_hf_runtime_drawing_shows_every_module_of_the_engine():
    section = _section(ARCHITECTURE.read_text(), "The hf engine runtime")
    assert section.count("\n") > 20
    assert runtime_drawing_problems(section, SERVER / "engines" / "hf") == []


def test_the_runtime_drawing_check_can_fail(tmp_path):
    (tmp_path / "kv").mkdir()
    for name in ("engine.py", "kv/slots.py", "kv/__init__.py", "panel.c"):
        (tmp_path / name).write_text("")
    assert runtime_drawing_problems("engine.py → steps.py · panel.c", tmp_path) == [
        "slots.py is not drawn",
        "steps.py is drawn but gone",
    ]
