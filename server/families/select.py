"""Which family a model gets, decided once at start from the model folder.

Order: the config's ``model_family`` (anything but ``auto``) wins; else a test model's
``agentserve_family`` in config.json (written by ``agentserve make-test-model``); else every
family file's ``detect`` section is checked against the folder (special tokens of the
vocabulary, the chat template's text, config.json ``model_type``) and the matching family
of highest priority wins; its version (Mistral) comes from tekken.json's
``config.version`` or the family's ``version_detect`` rules.

No family file matches: the model is served as a plain vLLM server serves it, with its own
chat template (``model_family: template``; ``model`` is the older name of the same thing),
when the folder has one; the tool-call envelope is then the config's ``envelope``, else none
(calls neither masked nor parsed: ``Family.envelope`` is ``NO_ENVELOPE``; the start log and
``GET /v1/models`` say so). A folder with no chat template either stops the start with a
message that names the choices.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from server.families.family import (
    Detect,
    Family,
    FamilyError,
    Layout,
    Rules,
    family_choices,
    family_names,
    load_family,
)

TEMPLATE = "template"  # model_family: template = the model folder's own chat template
TEMPLATE_NAMES = (TEMPLATE, "model")  # "model": its first name, still accepted
NO_ENVELOPE = ""  # a family without a call format: tool calls are neither masked nor parsed
TEMPLATE_FAMILY = Family(
    name=TEMPLATE,
    envelope=NO_ENVELOPE,
    description="the model folder's own Jinja chat template (server/families/model_template.py)",
    models=(),
    default_system="",
    date=None,
    detect=Detect(),
    rules=Rules(),
    layout=Layout(),
)


@dataclass(frozen=True)
class ModelFacts:
    """What detection reads from a model folder."""

    model_type: str = ""
    special_tokens: frozenset[str] = frozenset()
    chat_template: str = ""
    tekken_version: str | None = None
    declared_family: str | None = None


@dataclass(frozen=True)
class Selection:
    family: Family
    how: str  # "config", "test model", "detected: <evidence>"


def chat_template_of(folder: Path) -> str:
    """The model's own Jinja chat template: chat_template.jinja, else tokenizer_config.json."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        tpl = json.loads(cfg.read_text()).get("chat_template") or ""
        if isinstance(tpl, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template", "") for t in tpl if isinstance(t, dict)}
            tpl = named.get("default") or next(iter(named.values()), "")
        return str(tpl)
    return ""


def model_facts(folder: Path | None, tokenizer: Any = None) -> ModelFacts:
    """What detection reads: the folder's config, tekken.json and chat template, the tokenizer's
    vocabulary (no folder, the embedded model: the tokenizer alone)."""
    if folder is None and tokenizer is None:
        return ModelFacts()
    config: dict[str, Any] = {}
    if folder is not None and (folder / "config.json").is_file():
        config = json.loads((folder / "config.json").read_text())
    vocab: set[str] = set()
    if tokenizer is not None:
        vocab = set(tokenizer.get_vocab())
    tekken = None
    if folder is not None and (folder / "tekken.json").is_file():
        tekken = json.loads((folder / "tekken.json").read_text()).get("config", {}).get("version")
    template = (chat_template_of(folder) if folder is not None else "") or str(
        getattr(tokenizer, "chat_template", None) or ""
    )
    return ModelFacts(
        model_type=str(config.get("model_type", "")),
        special_tokens=frozenset(vocab),
        chat_template=template,
        tekken_version=tekken,
        declared_family=config.get("agentserve_family"),
    )


def _matches(d: Detect, facts: ModelFacts) -> bool:
    if not d.special_tokens and not d.template_contains and not d.model_types:
        return False  # a family with no detection rules is only chosen by name
    return (
        all(t in facts.special_tokens for t in d.special_tokens)
        and all(s in facts.chat_template for s in d.template_contains)
        and not any(s in facts.chat_template for s in d.template_lacks)
        and (not d.model_types or facts.model_type in d.model_types)
    )


def _rule_matches(rule: dict[str, Any], facts: ModelFacts) -> bool:
    conditions: dict[str, Any] = {k: tuple(v) for k, v in rule.items() if k not in ("version", "refines")}
    return _matches(Detect(**conditions), facts)


def _version(family: Family, facts: ModelFacts) -> str | None:
    """tekken.json's version, else the first plain rule that matches; then a rule that
    ``refines`` that version (``{version: v13_think, refines: v13, special_tokens: [[THINK]]}``:
    a v13 vocabulary with the think tokens) when its conditions hold too."""
    if not family.versions:
        return None
    base = facts.tekken_version if facts.tekken_version in family.versions else None
    if base is None:
        plain = (r for r in family.version_detect if "refines" not in r and _rule_matches(r, facts))
        base = next((str(r["version"]) for r in plain), None)
    for rule in family.version_detect:
        if base is not None and rule.get("refines") == base and _rule_matches(rule, facts):
            return str(rule["version"])
    return base


def detect_family(facts: ModelFacts) -> Selection | None:
    best: tuple[int, Family] | None = None
    for name in family_names():
        fam = load_family(name)
        if _matches(fam.detect, facts) and (best is None or fam.detect.priority > best[0]):
            best = (fam.detect.priority, fam)
    if best is None:
        return None
    fam = best[1]
    version = _version(fam, facts)
    if version and version != fam.version:
        fam = load_family(f"{fam.name}:{version}")
    evidence = ", ".join(fam.detect.special_tokens + fam.detect.template_contains) or fam.detect.model_types
    return Selection(fam, f"detected ({evidence})")


def is_template(model_family: str) -> bool:
    """``model_family: template`` (or its older name ``model``): the model's own chat template."""
    return model_family in TEMPLATE_NAMES


def _template_selection(facts: ModelFacts) -> Selection:
    """The model's own template; the masks and the parser of the family detected from the
    vocabulary when one is (gpt-oss: the harmony envelope and its reasoning), else none."""
    found = detect_family(facts)
    if found is None:
        return Selection(TEMPLATE_FAMILY, "config model_family: the model's own chat template")
    fam = found.family
    masks = replace(
        TEMPLATE_FAMILY, envelope=fam.envelope, reasoning=fam.reasoning, test_model=fam.test_model
    )
    return Selection(masks, f"config model_family: the model's own chat template; masks of {fam.ref}")


def select_family(model_family: str, folder: Path | None, tokenizer: Any = None) -> Selection:
    """The family for this deployment; FamilyError (names the choices) when none fits."""
    if is_template(model_family):
        return _template_selection(model_facts(folder, tokenizer))
    if model_family and model_family != "auto":
        return Selection(load_family(model_family), "config model_family")
    facts = model_facts(folder, tokenizer)
    if facts.declared_family:
        return Selection(load_family(facts.declared_family), "test model (config.json agentserve_family)")
    found = detect_family(facts)
    if found is not None:
        return found
    if facts.chat_template.strip():
        # served as vLLM serves it: a wrong envelope guessed here would force a call format the model
        # never learned, so none unless the config names one (the start log says which)
        return Selection(
            TEMPLATE_FAMILY,
            f"no family file matches (model_type {facts.model_type!r}; families: {family_choices()}): "
            "the model's own chat template",
        )
    raise FamilyError(
        f"no model family matches the model at {folder} (model_type {facts.model_type!r}; none of the "
        f"families' special tokens / chat template markers found, and the folder has no chat template): "
        f"set model_family in the config to one of {family_choices()}, or add the model's "
        f"chat_template.jinja (it is then served with it, as model_family: template)"
    )
