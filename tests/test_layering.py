"""The layer rule, checked on the source: a module imports only from its own layer or below.

Layers, top to bottom: cli → app/api/dialects (and the router) → chat → engines →
constrain / kvcache (the mask library and the prefix cache, side by side) → leaf modules
(families, errors, config, protocol, session_key, cache_diag, …). Every import counts, also
those inside functions and under ``TYPE_CHECKING``. On top of the order, the two bottom
libraries stay pure: constrain imports neither protocol nor errors (it raises its own
``ConstraintError``), and kvcache and constrain do not import each other.

Inside the hf engine the runtime has an order of its own (``HF_RANKS``): KV memory (``kv/``) and
the linear layers (``linears/``) import nothing above them and not each other; the model
runtime (``model/``), the sampler and the outbox sit on them; then the sequence, the runner,
the scheduler, and the engine on top. No circle can form.

Inside constrain there is no order of ranks but no circle either (``cycles``): the compiler imports
the matchers, the matchers the masks and the arguments seam, never the other way round.
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
    "server.dialects": 4,
    "server.body_limit": 4,  # ASGI middleware of the app
    "server.front_door": 4,  # ASGI middleware of the app
    "server.engines": 2,
    "server.constrain": 1,
    "server.kvcache": 1,
}
LAYER_NAMES = {5: "cli", 4: "app/api", 3: "chat", 2: "engines", 1: "constrain/kvcache", 0: "leaf"}
# leaf modules a bottom library must not import although they sit below it (pydantic request models,
# HTTP errors), and bottom libraries that must not import each other
FORBIDDEN = {
    "server.constrain": (
        "server.protocol",
        "server.errors",
        "server.response_types",
        "server.custom_tools",
        "server.kvcache",
    ),
    "server.kvcache": ("server.protocol", "server.errors", "server.constrain"),
}

# inside server.engines.hf: package or module -> rank; a module imports only its own rank or below
HF = "server.engines.hf"
HF_RANKS = {
    f"{HF}.kv": 0,  # KV memory: the slot pool, caches grown in place, prefix-cache blocks
    f"{HF}.linears": 0,  # linear layers: fused projections, oneDNN, the panel kernel and its builder
    f"{HF}.model": 1,  # the rows forward, the lean forward, shared-prefix attention
    f"{HF}.sampler": 1,
    f"{HF}.outbox": 1,
    f"{HF}.sequence": 2,
    f"{HF}.runner": 3,
    f"{HF}.scheduler": 4,
    f"{HF}.engine": 5,
}
HF_APART = ((f"{HF}.kv", f"{HF}.linears"),)  # same rank, side by side: neither imports the other


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


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
            for lib, banned in FORBIDDEN.items():
                if _under(module, lib) and any(_under(target, b) for b in banned):
                    out.append(f"{module}:{line} imports {target}, which {lib} must stay free of")
    return out


def hf_rank(module: str) -> int | None:
    """The module's rank inside the hf engine (None: outside it, or its package's ``__init__``)."""
    return next((rank for prefix, rank in HF_RANKS.items() if _under(module, prefix)), None)


def hf_violations(edges: dict[str, list[tuple[int, str]]]) -> list[str]:
    out = []
    for module, targets in sorted(edges.items()):
        mine = hf_rank(module)
        if mine is None:
            continue
        for line, target in targets:
            theirs = hf_rank(target)
            if theirs is not None and theirs > mine:
                out.append(
                    f"{module}:{line} (hf rank {mine}) imports {target} (hf rank {theirs}), a higher one"
                )
            for a, b in HF_APART:
                if (_under(module, a) and _under(target, b)) or (_under(module, b) and _under(target, a)):
                    out.append(f"{module}:{line} imports {target}: {a} and {b} stay side by side")
    return out


def cycles(edges: dict[str, list[tuple[int, str]]]) -> list[list[str]]:
    """The import circles among the modules of ``edges`` (each sorted; an import of a member, or of a
    module below a package, counts for the longest module of ``edges`` it names; self-imports do not)."""
    graph: dict[str, set[str]] = {m: set() for m in edges}
    for module, targets in edges.items():
        for _line, target in targets:
            known = [m for m in edges if _under(target, m)]
            if known:
                graph[module].add(max(known, key=len))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v] - {v}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_module_imports_a_higher_layer():
    edges = {module_name(p): imports_of(p) for p in sorted(SERVER.rglob("*.py"))}
    assert len(edges) > 40 and any(edges.values())  # the walk found the code and its imports
    assert violations(edges) == []


def test_the_checker_catches_an_upward_import(tmp_path):
    """The rule itself can fail: constrain importing chat, engines importing chat, a leaf importing
    constrain, kvcache importing an engine, and the purity rules of the bottom libraries."""
    edges = {
        "server.constrain.constraint": [(3, "server.chat.template.render_chat")],
        "server.engines.hf.engine": [(4, "server.constrain.bitmask.MaskApplier"), (9, "server.chat.service")],
        "server.cache_diag.reporter": [(1, "server.families.rendered.RenderedPrompt")],
        "server.protocol": [(2, "server.constrain.spec.ToolSpec")],
        "server.cli": [(5, "server.app.build_app")],
        "server.kvcache.tiers": [(6, "server.engines.hf.kv.blocks.BlockCutter")],
        "server.constrain.arguments": [(7, "server.errors.InvalidRequest"), (8, "server.families.envelope")],
        "server.kvcache.index": [(2, "server.constrain.trie")],
    }
    found = violations(edges)
    assert [v.split(" ")[0] for v in found] == [
        "server.constrain.arguments:7",
        "server.constrain.constraint:3",
        "server.engines.hf.engine:9",
        "server.kvcache.index:2",
        "server.kvcache.tiers:6",
        "server.protocol:2",
    ]
    assert layer_of("server.routing.router") == 4 and layer_of("server.families.envelope") == 0
    assert layer_of("server.kvcache.prefix_cache") == layer_of("server.constrain.trie") == 1


def test_relative_and_function_level_imports_are_seen(tmp_path, monkeypatch):
    pkg = tmp_path / "server" / "constrain"
    pkg.mkdir(parents=True)
    src = pkg / "x.py"
    src.write_text(
        "from . import trie\n"
        "from ..chat.template import render_chat\n"
        "def f():\n"
        "    import server.engines.hf.engine\n"
    )
    monkeypatch.setattr(f"{__name__}.SERVER", tmp_path / "server")
    found = imports_of(src)
    assert [name for _, name in found] == [
        "server.constrain.trie",
        "server.chat.template.render_chat",
        "server.engines.hf.engine",
    ]


def test_inside_the_hf_engine_no_module_imports_a_higher_rank():
    edges = {module_name(p): imports_of(p) for p in sorted((SERVER / "engines" / "hf").rglob("*.py"))}
    unranked = [
        m for m in edges if hf_rank(m) is None and not m.endswith(("hf", ".kv", ".linears", ".model"))
    ]
    assert not unranked, f"give these hf modules a rank in HF_RANKS: {unranked}"
    assert sum(len(v) for v in edges.values()) > 20  # the walk found the engine's imports
    assert hf_violations(edges) == []


def test_the_hf_checker_catches_an_import_of_a_higher_rank():
    """kv or linears importing the model, the runner or the engine; the runner importing the
    scheduler; kv and linears importing each other. Downward imports pass."""
    edges = {
        f"{HF}.kv.slots": [(3, f"{HF}.model.rows.decode_rows"), (4, f"{HF}.kv.growing.GrowingLayer")],
        f"{HF}.linears.panel": [(5, f"{HF}.runner.Runner"), (6, f"{HF}.linears.build.build_library")],
        f"{HF}.kv.blocks": [(7, f"{HF}.linears.fused.LinearSlice")],
        f"{HF}.linears.install": [(8, f"{HF}.engine.HFEngine"), (9, f"{HF}.kv.slots.KVSlots")],
        f"{HF}.runner": [(10, f"{HF}.scheduler.Scheduler"), (11, f"{HF}.model.rows.decode_rows")],
        f"{HF}.model.rows": [(12, f"{HF}.kv.slots.PooledStep"), (13, f"{HF}.sequence.SequenceState")],
        f"{HF}.engine": [(14, f"{HF}.scheduler.Scheduler"), (15, f"{HF}.linears.install.install_linears")],
    }
    assert [v.split(" ")[0] for v in hf_violations(edges)] == [
        f"{HF}.kv.blocks:7",
        f"{HF}.kv.slots:3",
        f"{HF}.linears.install:8",
        f"{HF}.linears.install:9",
        f"{HF}.linears.panel:5",
        f"{HF}.model.rows:13",
        f"{HF}.runner:10",
    ]
    assert (
        hf_rank(f"{HF}.kv") == hf_rank(f"{HF}.linears.build") == 0 and hf_rank("server.engines.base") is None
    )


def test_inside_constrain_no_import_circle():
    edges = {module_name(p): imports_of(p) for p in sorted((SERVER / "constrain").rglob("*.py"))}
    assert len(edges) > 25 and sum(len(v) for v in edges.values()) > 60  # the walk found the imports
    assert cycles(edges) == []


def test_no_import_circle_anywhere_in_the_server():
    """Issue 35 item 5: no circles in the house (routing's router/proxy and policy registry,
    cache_diag's package import, constrain's were the last)."""
    edges = {module_name(p): imports_of(p) for p in sorted(SERVER.rglob("*.py"))}
    assert len(edges) > 150 and sum(len(v) for v in edges.values()) > 600  # the walk found the imports
    assert cycles(edges) == []


def test_the_cycle_checker_catches_a_circle():
    """A three-module circle through a member import and a type-only import, a two-module one through a
    package's module; a module importing itself, an import outside the set and a chain are no circle."""
    c = "server.constrain"
    edges = {
        f"{c}.compiler": [(1, f"{c}.tool_matcher.ToolMatcher"), (2, "server.families.envelope")],
        f"{c}.tool_matcher": [(3, f"{c}.envelope_masks.EnvelopeMasks")],
        f"{c}.envelope_masks": [(4, f"{c}.compiler"), (5, f"{c}.envelope_masks.X")],
        f"{c}.arguments.seam": [(6, f"{c}.arguments.backends.make_backend")],
        f"{c}.arguments.backends": [(7, f"{c}.arguments.seam.CallFrame")],
        f"{c}.arguments": [(8, f"{c}.vocab")],
        f"{c}.vocab": [],
        f"{c}.spec": [(9, f"{c}.arguments.backends"), (10, f"{c}.vocab.TokenVocab")],
    }
    assert cycles(edges) == [
        [f"{c}.arguments.backends", f"{c}.arguments.seam"],
        [f"{c}.compiler", f"{c}.envelope_masks", f"{c}.tool_matcher"],
    ]
    del edges[f"{c}.envelope_masks"][0], edges[f"{c}.arguments.seam"][0]
    assert cycles(edges) == []
