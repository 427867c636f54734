"""tests/clients: the `clients` marker (real client libraries in their own venvs)."""

from __future__ import annotations


def pytest_configure(config):  # type: ignore[no-untyped-def]
    config.addinivalue_line("markers", "clients: a real client library in its venv (scripts/client_venvs.sh)")
