"""The layer rule, checked on the source: a module imports only from its own layer or below.

Layers, top to bottom: cli → app/api (and the router) → chat → engines → masking →
leaf modules (families, errors, config, protocol, session_key, cache_report, …). Every
import counts, also those inside functions and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

SERVER = Path(__file__).resolve().parents[1] / "server"

# package or module (dotted, under server) -> layer; the longest match wins; anything else is a leaf (0)
LAYERS = {
    "server.cli": 5,
    "server.app": 4,
    "server.api": 4,
    "server.routing": 4,
    "server.chat": 3,
    "server.engines": 2,
    "server.masking": 1,
}
LAYER_NAMES = {5: "cli", 4: "app/api", 3: "chat", 2: "engines", 1: "masking", 0: "leaf"}


def layer_of(module: str) -> int:
    best, rank = "", 0
    for prefix, layer in LAYERS.items():
        if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
            best, rank = prefix, layer
    return rank


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SERVER.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import of a ``server`` module in the file."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the package
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # "from server.chat import template" imports server.chat.template
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in found if name == "server" or name.startswith("server.")]


def violations(edges: dict[str, list[tuple[int, str]]]) -> list[str]:
    out = []
    for module, targets in sorted(edges.items()):
        mine = layer_of(module)
        for line, target in targets:
            theirs = layer_of(target)
            if theirs > mine:
                out.append(
                    f"{module}:{line} ({LAYER_NAMES[mine]}) imports {target} ({LAYER_NAMES[theirs]}), "
                    f"a higher layer"
                )
    return out


def test_no_module_imports_a_higher_layer():
    edges = {module_name(p): imports_of(p) for p in sorted(SERVER.rglob("*.py"))}
    assert len(edges) > 40 and any(edges.values())  # the walk found the code and its imports
    assert violations(edges) == []


def test_the_checker_catches_an_upward_import(tmp_path):
    """The rule itself can fail: masking importing chat, engines importing chat, a leaf importing masking."""
    edges = {
        "server.masking.constraint": [(3, "server.chat.template.render_chat")],
        "server.engines.hf": [(4, "server.masking.bitmask.MaskApplier"), (9, "server.chat.service")],
        "server.cache_report": [(1, "server.families.rendered.RenderedPrompt")],
        "server.protocol": [(2, "server.masking.spec.ToolSpec")],
        "server.cli": [(5, "server.app.build_app")],
    }
    found = violations(edges)
    assert [v.split(" ")[0] for v in found] == [
        "server.engines.hf:9",
        "server.masking.constraint:3",
        "server.protocol:2",
    ]
    assert layer_of("server.routing.router") == 4 and layer_of("server.families.envelope") == 0


def test_relative_and_function_level_imports_are_seen(tmp_path, monkeypatch):
    pkg = tmp_path / "server" / "masking"
    pkg.mkdir(parents=True)
    src = pkg / "x.py"
    src.write_text(
        "from . import trie\n"
        "from ..chat.template import render_chat\n"
        "def f():\n"
        "    import server.engines.hf\n"
    )
    monkeypatch.setattr(f"{__name__}.SERVER", tmp_path / "server")
    found = imports_of(src)
    assert [name for _, name in found] == [
        "server.masking.trie",
        "server.chat.template.render_chat",
        "server.engines.hf",
    ]
