"""The synthetic agent's 24 tools (browser_*, shell_*, file_*) as OpenAI tool entries with JSON Schemas.

Fixed data: the same list, in the same order, every run. Grouped by name prefix so a
tool-availability state can allow a whole group (``name_prefix``) at once.
"""

from __future__ import annotations

from typing import Any

PREFIXES = ("browser_", "shell_", "file_")

_S = {"type": "string"}
_I = {"type": "integer"}
_B = {"type": "boolean"}


def _p(desc: str, schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {**schema, "description": desc, **extra}


# name, description, properties, required
_SPECS: list[tuple[str, str, dict[str, Any], list[str]]] = [
    (
        "browser_navigate",
        "Open a URL in the browser tab and wait until the page has loaded.",
        {
            "url": _p("Absolute http(s) URL to open.", _S),
            "wait_until": _p("Load event to wait for.", _S, enum=["load", "domcontentloaded", "networkidle"]),
        },
        ["url"],
    ),
    (
        "browser_click",
        "Click the element matching a CSS selector, or a point on the page.",
        {
            "selector": _p("CSS selector of the element.", _S),
            "x": _p("X coordinate in CSS pixels.", _I),
            "y": _p("Y coordinate in CSS pixels.", _I),
            "button": _p("Mouse button.", _S, enum=["left", "right"]),
        },
        [],
    ),
    (
        "browser_type",
        "Type text into the focused input or the element matching a selector.",
        {
            "selector": _p("CSS selector of the input.", _S),
            "text": _p("Text to type.", _S),
            "submit": _p("Press Enter after typing.", _B),
        },
        ["text"],
    ),
    (
        "browser_scroll",
        "Scroll the page.",
        {
            "direction": _p("Where to scroll.", _S, enum=["up", "down"]),
            "pixels": _p("How far, in CSS pixels.", _I, minimum=1),
        },
        ["direction"],
    ),
    (
        "browser_screenshot",
        "Take a screenshot of the viewport or the whole page.",
        {"full_page": _p("Capture the whole scrollable page.", _B)},
        [],
    ),
    ("browser_back", "Go back one entry in the tab history.", {}, []),
    (
        "browser_get_text",
        "Return the visible text of the page or of one element, as markdown.",
        {
            "selector": _p("CSS selector; default: the whole page.", _S),
            "max_chars": _p("Truncate the text to this many characters.", _I, minimum=100),
        },
        [],
    ),
    (
        "browser_find",
        "Find text on the page and return the matching elements with their selectors.",
        {"query": _p("Text or regular expression to find.", _S), "regex": _p("Treat query as a regex.", _B)},
        ["query"],
    ),
    (
        "browser_wait",
        "Wait for an element to appear or for a number of milliseconds.",
        {"selector": _p("CSS selector to wait for.", _S), "timeout_ms": _p("Maximum wait.", _I, minimum=0)},
        [],
    ),
    (
        "shell_exec",
        "Run a shell command in the workspace and return its exit code, stdout and stderr.",
        {
            "command": _p("The command line (bash).", _S),
            "cwd": _p("Working directory, relative to the workspace.", _S),
            "timeout_s": _p("Kill the command after this many seconds.", _I, minimum=1, maximum=3600),
        },
        ["command"],
    ),
    (
        "shell_run_tests",
        "Run the test suite (or part of it) and return the summary and failures.",
        {
            "path": _p("Test file or directory.", _S),
            "keyword": _p("Only tests matching this expression (-k).", _S),
            "verbose": _p("Show every test name.", _B),
            "max_failures": _p("Stop after N failures.", _I, minimum=1),
        },
        [],
    ),
    (
        "shell_install",
        "Install a package into the workspace environment.",
        {
            "package": _p("Package name.", _S),
            "version": _p("Version specifier, e.g. '>=2,<3'.", _S),
            "manager": _p("Package manager.", _S, enum=["pip", "npm", "apt"]),
        },
        ["package"],
    ),
    (
        "shell_git",
        "Run a git subcommand in the repository (status, diff, log, checkout, commit).",
        {"args": {"type": "array", "items": _S, "description": "Arguments after 'git'."}},
        ["args"],
    ),
    (
        "shell_env",
        "Read or set an environment variable of later shell commands.",
        {"name": _p("Variable name.", _S), "value": _p("New value; omit to read.", _S)},
        ["name"],
    ),
    (
        "shell_ps",
        "List running processes, optionally filtered by command name.",
        {"filter": _p("Substring of the command name.", _S)},
        [],
    ),
    (
        "shell_kill",
        "Send a signal to a process.",
        {
            "pid": _p("Process id.", _I, minimum=1),
            "signal": _p("Signal name.", _S, enum=["TERM", "KILL", "INT"]),
        },
        ["pid"],
    ),
    (
        "file_read",
        "Read a text file, or a range of its lines, with line numbers.",
        {
            "path": _p("Path relative to the workspace.", _S),
            "start_line": _p("First line (1-based).", _I, minimum=1),
            "end_line": _p("Last line, inclusive.", _I, minimum=1),
        },
        ["path"],
    ),
    (
        "file_write",
        "Create or overwrite a text file.",
        {"path": _p("Path relative to the workspace.", _S), "content": _p("The whole new content.", _S)},
        ["path", "content"],
    ),
    (
        "file_edit",
        "Replace an exact snippet of a file with new text.",
        {
            "path": _p("Path relative to the workspace.", _S),
            "old": _p("Exact text to replace.", _S),
            "new": _p("Replacement text.", _S),
            "replace_all": _p("Replace every occurrence.", _B),
        },
        ["path", "old", "new"],
    ),
    (
        "file_list",
        "List a directory.",
        {
            "path": _p("Directory relative to the workspace.", _S),
            "recursive": _p("Descend into subdirectories.", _B),
            "pattern": _p("Glob the names must match.", _S),
        },
        ["path"],
    ),
    (
        "file_search",
        "Search file contents for a pattern and return matching lines with their locations.",
        {
            "pattern": _p("Text or regular expression.", _S),
            "path": _p("Directory or file to search.", _S),
            "regex": _p("Treat pattern as a regex.", _B),
            "max_results": _p("Stop after N matches.", _I, minimum=1),
        },
        ["pattern"],
    ),
    ("file_delete", "Delete a file.", {"path": _p("Path relative to the workspace.", _S)}, ["path"]),
    (
        "file_move",
        "Move or rename a file.",
        {
            "src": _p("Current path.", _S),
            "dst": _p("New path.", _S),
            "overwrite": _p("Replace dst if it exists.", _B),
        },
        ["src", "dst"],
    ),
    (
        "file_stat",
        "Size, modification time and type of a path.",
        {"path": _p("Path to inspect.", _S)},
        ["path"],
    ),
]


def agent_tools() -> list[dict[str, Any]]:
    """The 24 tools as OpenAI ``tools`` entries (fresh dicts every call)."""
    out = []
    for name, desc, props, required in _SPECS:
        params: dict[str, Any] = {"type": "object", "properties": dict(props), "additionalProperties": False}
        if required:
            params["required"] = list(required)
        out.append(
            {"type": "function", "function": {"name": name, "description": desc, "parameters": params}}
        )
    return out


def tool_names(tools: list[dict[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def prefix_of(name: str) -> str:
    for p in PREFIXES:
        if name.startswith(p):
            return p
    return ""
