"""The mask library's fixtures (Hermes envelope, vocabularies, factories), shared from tests/constrain."""

from tests.constrain.conftest import compiler, hermes, prefixed_tools, swe_tools, vocab  # noqa: F401
