"""Where the data files the server reads at run time live: inside the installed package.

``grammars/`` (state machines, ``families/``, ``envelopes/``) and ``configs/`` sit at the top of
the repository, where users look for them; the package reaches them as ``server/grammars`` and
``server/configs`` (links in the checkout, copied as files into the wheel and the sdist by
``[tool.setuptools.package-data]``). They are found through ``importlib.resources``, never relative
to a checkout, so an editable install, a wheel in site-packages and the images read the same files.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def _package_root() -> Path:
    root = files("server")
    if not isinstance(root, Path):  # a zip import: the YAML files are globbed and re-read by mtime
        raise RuntimeError(f"agentserve must be installed as files on disk, not {root!r}")
    return root


GRAMMARS_DIR = _package_root() / "grammars"  # state machines; families/ and envelopes/ below
CONFIGS_DIR = _package_root() / "configs"  # deployment configs (embedded.yaml, vllm.yaml) and clients/
