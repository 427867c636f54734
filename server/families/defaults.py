"""The default model family and its call envelope: the one place ``"hermes"`` is the default.

The embedded model (SmolLM2) is served in the Hermes / ChatML format; a family or envelope
that nothing names (a ToolSpec without ``envelope``, a renderer without a family, the
``model`` family's calls) falls back to these. ``settings.envelope`` has no default of its
own: unset (None) means the chosen family's envelope, and an explicit value, ``hermes``
included, wins.
"""

from __future__ import annotations

DEFAULT_FAMILY = "hermes"  # grammars/families/hermes.yaml
DEFAULT_ENVELOPE = "hermes"  # grammars/envelopes/hermes.yaml: the default family's envelope (a test checks)
